#pragma once
// Container descriptors. Children's names join with dots into parameter names:
//   sequential<"transformer", embedding<"wte", 256, 64>, repeat<"h", 2, B>>
//     -> transformer.wte.weight, transformer.h.0.<B's params>, transformer.h.1.<B's params>
//   block<Name, Children...> is a sequential that is one transformer block (BLOCK bucketing
//   puts all of its parameters in one bucket); repeat<Name, N, Block> names its copies 0..N-1
//   (the element's own name is not used), and N may be dyn.

#ifndef KFSDP_MODULE
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#endif

#include <kfsdp/meta/export.hpp>
#include <kfsdp/meta/inline_string.hpp>
#include <kfsdp/model/descriptor.hpp>

KFSDP_EXPORT namespace kfsdp {

namespace detail {
template <layer_kind Kind, fixed_string Name, descriptor... Children>
struct container {
  static constexpr auto name = Name;
  static constexpr layer_kind kind = Kind;

  std::tuple<Children...> children;

  constexpr container() requires(std::is_default_constructible_v<Children> && ...) = default;
  constexpr explicit container(Children... c) : children(std::move(c)...) {}

  template <class F>
  constexpr void for_each_child(F&& visit) const {
    std::apply([&](const Children&... c) { (visit(c, Children::name.view()), ...); }, children);
  }
};
}  // namespace detail

template <fixed_string Name, descriptor... Children>
using sequential = detail::container<layer_kind::container, Name, Children...>;

template <fixed_string Name, descriptor... Children>
using block = detail::container<layer_kind::block, Name, Children...>;

template <fixed_string Name, std::size_t N, descriptor Element>
struct repeat {
  static_assert(N != 0, "kfsdp::repeat: N (number of copies) must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::container;

  std::size_t count = N;
  Element element;

  constexpr repeat() requires(N != dyn && std::is_default_constructible_v<Element>) = default;
  constexpr repeat(std::size_t copies, Element e)
      : count(checked_extent<N>("repeat", Name.view(), "count", copies)), element(std::move(e)) {}

  template <class F>
  constexpr void for_each_child(F&& visit) const {
    for (std::size_t i = 0; i < count; ++i) visit(element, inline_string<20>().append_number(i).view());
  }
};

}  // namespace kfsdp
