#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Container descriptors. Children's names join with dots into parameter names:
//   sequential<"transformer", embedding<"wte", 256, 64>, repeat<"h", 2, B>>
//     -> transformer.wte.weight, transformer.h.0.<B's params>, transformer.h.1.<B's params>
//   block<Name, Children...> is a sequential that is one transformer block (BLOCK bucketing
//   puts all of its parameters in one bucket); repeat<Name, N, Block> names its copies 0..N-1
//   (the element's own name is not used), and N may be dyn. Each copy is one FSDP unit, as a block is.
//   residual<Name, Children...> is a sequential f whose output is x + f(x) (features in and out).
//   concat<Name, Children...> gives every child the same input and lays their outputs side by side:
//     concat<"", linear<"q_proj", 64, 64, false>, linear<"k_proj", 64, 32, false>>  [rows, 64] -> [rows, 96]
//     (parameters q_proj.weight [64, 64], k_proj.weight [32, 64]: one projection, separate names)
// Neighbours must agree on what flows between them (ids, features, loss): a mismatch fails to
// compile in check_chain<Producer, Consumer>, whose arguments are the two layers.

#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include <kfsdp/meta/inline_string.hpp>
#include <kfsdp/model/descriptor.hpp>

namespace kfsdp {

// Fails to compile, naming Producer and Consumer, unless Producer's output is Consumer's input.
template <class Producer, class Consumer>
struct check_chain {
  static_assert(std::is_same_v<output_t<Producer>, input_t<Consumer>>,
                "kfsdp: a layer gives what the next one does not take (ids, features or loss): "
                "check_chain<Producer, Consumer> in this error names the two layers");
  static constexpr bool value = true;
};

namespace detail {
template <class... Children, std::size_t... I>
constexpr bool chained(std::index_sequence<I...>) {
  using list = std::tuple<Children...>;
  return (check_chain<std::tuple_element_t<I, list>, std::tuple_element_t<I + 1, list>>::value && ...);
}

template <layer_kind Kind, fixed_string Name, descriptor... Children>
struct container {
  static_assert(sizeof...(Children) > 0, "kfsdp: a container needs at least one child");
  static_assert(chained<Children...>(std::make_index_sequence<sizeof...(Children) - 1>{}));
  static constexpr auto name = Name;
  static constexpr layer_kind kind = Kind;
  using input = input_t<std::tuple_element_t<0, std::tuple<Children...>>>;
  using output = output_t<std::tuple_element_t<sizeof...(Children) - 1, std::tuple<Children...>>>;

  using children_type = std::tuple<Children...>;  // what code that picks by container matches on
  children_type children;

  constexpr container() requires(std::is_default_constructible_v<Children> && ...) = default;
  constexpr explicit container(Children... c) : children(std::move(c)...) {}

  template <class F>
  constexpr void for_each_child(F&& visit) const {
    std::apply([&](const Children&... c) { (visit(c, Children::name.view()), ...); }, children);
  }
};
}  // namespace detail

// Classes, not alias templates of detail::container: nvcc loses a fixed_string that an alias template
// passes on (its host code names it __T0).
KFSDP_EXPORT template <fixed_string Name, descriptor... Children>
struct sequential : detail::container<layer_kind::container, Name, Children...> {
  using detail::container<layer_kind::container, Name, Children...>::container;
};

KFSDP_EXPORT template <fixed_string Name, descriptor... Children>
struct block : detail::container<layer_kind::block, Name, Children...> {
  using detail::container<layer_kind::block, Name, Children...>::container;
};

// x + f(x), f = the children in order (nanoGPT's `x = x + attn(ln_1(x))`).
KFSDP_EXPORT template <fixed_string Name, descriptor... Children>
struct residual : detail::container<layer_kind::container, Name, Children...> {
  using base = detail::container<layer_kind::container, Name, Children...>;
  static_assert(std::is_same_v<typename base::input, features> && std::is_same_v<typename base::output, features>,
                "kfsdp::residual: its children must take and give features");
  static constexpr bool adds_input = true;
  using base::base;
};

// [f_1(x) | f_2(x) | ...]: each child reads x, its output fills the next columns (Llama's q/k/v and
// gate/up projections under their own names); the input's gradient is the sum of the children's.
KFSDP_EXPORT template <fixed_string Name, descriptor... Children>
struct concat : detail::container<layer_kind::container, Name, Children...> {
  using base = detail::container<layer_kind::container, Name, Children...>;
  static_assert(((std::is_same_v<input_t<Children>, features> && std::is_same_v<output_t<Children>, features>) && ...),
                "kfsdp::concat: its children must take and give features");
  static constexpr bool concatenates = true;
  using base::base;
};

KFSDP_EXPORT template <fixed_string Name, std::size_t N, descriptor Element>
struct repeat {
  static_assert(N != 0, "kfsdp::repeat: N (number of copies) must be at least 1");
  static_assert(check_chain<Element, Element>::value);
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::container;
  static constexpr bool copies_are_units = true;
  using input = input_t<Element>;
  using output = output_t<Element>;
  using element_type = Element;

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
