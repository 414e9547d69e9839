#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The choices of Thunder's fsdp(): sharding, gradient division and wire precision as enums (the
// run-time options, fsdp/options.hpp), and the policy tags that select them at compile time:
//
//   kfsdp::fsdp<Model, double, kfsdp::zero3, kfsdp::block_bucketing, kfsdp::static_world_size<8>>
//
// Free of Kokkos and of every backend, so plans and policies check in any translation unit.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include <kfsdp/meta/enum_names.hpp>
#include <kfsdp/meta/type_list.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

// Thunder's FSDPType.
KFSDP_EXPORT enum class sharding_strategy {
  zero2,  // gather once per step before forward, keep the unsharded parameters for backward
  zero3,  // free after each bucket's forward, gather again in backward
};

inline constexpr enum_names<sharding_strategy, 2> sharding_strategy_names = {
    {sharding_strategy::zero2, "zero2"}, {sharding_strategy::zero3, "zero3"}};
KFSDP_EXPORT constexpr std::string_view to_string(sharding_strategy s) noexcept { return name_of(sharding_strategy_names, s); }
KFSDP_EXPORT inline sharding_strategy parse_sharding(std::string_view text) {
  return parse_named(text, sharding_strategy_names, "sharding");
}

// Where the average over ranks is taken around the gradients' SUM reduce-scatter. Dividing first
// keeps a low-precision sum from overflowing at large world sizes; in f32 and f64 all three give the
// same average to rounding.
KFSDP_EXPORT enum class gradient_division {
  after,   // sum, then ÷ world size
  before,  // ÷ world size, then sum (Thunder's pre-divide)
  split,   // ÷ f, sum, ÷ (world size / f), f = predivide_factor(world size) (FSDP1's split)
};

inline constexpr enum_names<gradient_division, 3> gradient_division_names = {
    {gradient_division::after, "after"}, {gradient_division::before, "before"}, {gradient_division::split, "split"}};
KFSDP_EXPORT constexpr std::string_view to_string(gradient_division d) noexcept { return name_of(gradient_division_names, d); }

KFSDP_EXPORT inline gradient_division parse_gradient_division(std::string_view text) {
  return parse_named(text, gradient_division_names, "gradient division");
}

// FSDP1's pre-divide factor, exactly as FSDP1 computes it: doubled from 1 while it divides the world
// size and is below world_size / f — about √world_size (1, 2, 2, 4, 4 at 1, 2, 4, 8, 16 ranks; 2 at 3).
constexpr double predivide_factor(std::size_t world_size) noexcept {
  std::size_t f = 1;
  while (world_size % f == 0 && world_size / f > f) f *= 2;  // f divides it here: the quotient is exact
  return double(f);
}

// The factors a gradient is multiplied by before and after the SUM: their product is 1 / world_size.
struct division_factors {
  double before = 1;
  double after = 1;
};
constexpr division_factors division_of(gradient_division d, std::size_t world_size) noexcept {
  const double n = double(world_size);
  switch (d) {
    case gradient_division::before: return {1 / n, 1};
    case gradient_division::split: return {1 / predivide_factor(world_size), predivide_factor(world_size) / n};
    case gradient_division::after: break;
  }
  return {1, 1 / n};
}

// The element type a collective carries (mixed precision): `scalar` is the engine's own (no
// conversion); bf16 and f16 halve the bytes; int8 (fsdp/quantize.hpp) sends one byte a value plus
// an f32 scale a block of 256 (gradients: by an all-to-all, summed in Scalar on arrival). The master shards and the optimizer stay in Scalar.
KFSDP_EXPORT enum class wire_precision { scalar, bf16, f16, int8 };

inline constexpr enum_names<wire_precision, 4> wire_precision_names = {{wire_precision::scalar, "scalar"},
                                                                       {wire_precision::bf16, "bf16"},
                                                                       {wire_precision::f16, "f16"},
                                                                       {wire_precision::int8, "int8"}};
KFSDP_EXPORT constexpr std::string_view to_string(wire_precision p) noexcept { return name_of(wire_precision_names, p); }

KFSDP_EXPORT inline wire_precision parse_wire_precision(std::string_view text) {
  return parse_named(text, wire_precision_names, "precision");
}

// Policy tags: fsdp<Model, Scalar, zero3, block_bucketing, static_world_size<8>> (any order, each
// with a default).
template <sharding_strategy S>
struct sharding_policy {
  static constexpr sharding_strategy value = S;
};
template <bucketing B>
struct bucketing_policy {
  static constexpr bucketing value = B;
};
// The world size fixed at compile time: the engine takes its plan from static_shard_plan (the model
// must be fully static) and refuses a communicator of another size. 0: the communicator's (default).
template <std::size_t N>
struct static_world_size {
  static constexpr std::size_t value = N;
};
KFSDP_EXPORT using zero2 = sharding_policy<sharding_strategy::zero2>;
KFSDP_EXPORT using zero3 = sharding_policy<sharding_strategy::zero3>;
KFSDP_EXPORT using no_bucketing = bucketing_policy<bucketing::none>;
KFSDP_EXPORT using layer_bucketing = bucketing_policy<bucketing::layer>;
KFSDP_EXPORT using block_bucketing = bucketing_policy<bucketing::block>;

namespace detail {
template <class T>
struct is_sharding_policy : std::false_type {};
template <sharding_strategy S>
struct is_sharding_policy<sharding_policy<S>> : std::true_type {};
template <class T>
struct is_bucketing_policy : std::false_type {};
template <bucketing B>
struct is_bucketing_policy<bucketing_policy<B>> : std::true_type {};
template <class T>
struct is_world_size_policy : std::false_type {};
template <std::size_t N>
struct is_world_size_policy<static_world_size<N>> : std::true_type {};
template <class T>
struct is_policy
    : std::bool_constant<is_sharding_policy<T>::value || is_bucketing_policy<T>::value || is_world_size_policy<T>::value> {};

// The policies of fsdp<Model, Scalar, Policies...>, checked and defaulted.
template <class... Policies>
struct fsdp_policies {
  using list = meta::type_list<Policies...>;
  static_assert(meta::mp_count_if<list, is_policy>::value == sizeof...(Policies),
                "kfsdp::fsdp: an unknown policy was given; policies are kfsdp::zero2, kfsdp::zero3, "
                "kfsdp::no_bucketing, kfsdp::layer_bucketing, kfsdp::block_bucketing, kfsdp::static_world_size<N>");
  static_assert(meta::mp_count_if<list, is_sharding_policy>::value <= 1,
                "kfsdp::fsdp: more than one sharding policy (kfsdp::zero2 / kfsdp::zero3) was given");
  static_assert(meta::mp_count_if<list, is_bucketing_policy>::value <= 1,
                "kfsdp::fsdp: more than one bucketing policy (kfsdp::*_bucketing) was given");
  static constexpr sharding_strategy sharding = meta::mp_find_if<list, is_sharding_policy, zero2>::value;
  static_assert(meta::mp_count_if<list, is_world_size_policy>::value <= 1,
                "kfsdp::fsdp: more than one kfsdp::static_world_size<N> was given");
  static constexpr bucketing bucketing_strategy = meta::mp_find_if<list, is_bucketing_policy, no_bucketing>::value;
  static constexpr std::size_t world_size = meta::mp_find_if<list, is_world_size_policy, static_world_size<0>>::value;
};
}  // namespace detail

}  // namespace kfsdp
