#pragma once
// Type-list utilities in Boost.Mp11 style: a signature comment, a detail:: impl, a public alias.
// Nothing here knows about FSDP.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace kfsdp::meta {

// type_list<T...>
template <class... T>
struct type_list {};

// mp_size<L> -> std::integral_constant<std::size_t, number of elements of L>
namespace detail {
template <class L>
struct mp_size_impl;
template <template <class...> class L, class... T>
struct mp_size_impl<L<T...>> : std::integral_constant<std::size_t, sizeof...(T)> {};
}  // namespace detail
template <class L>
using mp_size = detail::mp_size_impl<L>;

// mp_contains<L, V> -> std::bool_constant<V is one of the elements of L>
namespace detail {
template <class L, class V>
struct mp_contains_impl;
template <template <class...> class L, class... T, class V>
struct mp_contains_impl<L<T...>, V> : std::bool_constant<(std::is_same_v<T, V> || ...)> {};
}  // namespace detail
template <class L, class V>
using mp_contains = detail::mp_contains_impl<L, V>;

// mp_count_if<L, P> -> how many elements T of L have P<T>::value
namespace detail {
template <class L, template <class> class P>
struct mp_count_if_impl;
template <template <class...> class L, class... T, template <class> class P>
struct mp_count_if_impl<L<T...>, P>
    : std::integral_constant<std::size_t, (std::size_t{P<T>::value} + ... + 0)> {};
}  // namespace detail
template <class L, template <class> class P>
using mp_count_if = detail::mp_count_if_impl<L, P>;

// mp_find_if<L, P, Default> -> the first element T of L with P<T>::value, else Default
namespace detail {
template <class L, template <class> class P, class Default>
struct mp_find_if_impl;
template <template <class...> class L, template <class> class P, class Default>
struct mp_find_if_impl<L<>, P, Default> {
  using type = Default;
};
template <template <class...> class L, class T, class... Rest, template <class> class P,
          class Default>
struct mp_find_if_impl<L<T, Rest...>, P, Default> {
  using type = std::conditional_t<P<T>::value, T,
                                  typename mp_find_if_impl<L<Rest...>, P, Default>::type>;
};
}  // namespace detail
template <class L, template <class> class P, class Default>
using mp_find_if = typename detail::mp_find_if_impl<L, P, Default>::type;

// mp_with_index<N>(i, f) -> f(std::integral_constant<std::size_t, i>{}): the bridge from a run-time
// index (Thunder's enum options) to a compile-time one (a policy type). i >= N throws.
//   mp_with_index<3>(1, [](auto I) { return I.value * 10; })  -> 10
template <std::size_t N, class F>
constexpr decltype(auto) mp_with_index(std::size_t i, F&& f) {
  static_assert(N > 0, "mp_with_index<N>: N must be at least 1");
  if (i >= N)
    throw std::out_of_range("kfsdp::meta::mp_with_index: index " + std::to_string(i) +
                            " is out of range, expected less than " + std::to_string(N));
  return [&]<std::size_t... I>(std::index_sequence<I...>) -> decltype(auto) {
    using result = decltype(f(std::integral_constant<std::size_t, 0>{}));
    if constexpr (std::is_void_v<result>) {
      ((i == I ? (void)f(std::integral_constant<std::size_t, I>{}) : void()), ...);
    } else {
      result out{};
      ((i == I ? (void)(out = f(std::integral_constant<std::size_t, I>{})) : void()), ...);
      return out;
    }
  }(std::make_index_sequence<N>{});
}

}  // namespace kfsdp::meta
