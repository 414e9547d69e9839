#pragma once
// Thunder's fsdp() options, and the policy tags they select.
//
//   kfsdp::fsdp_options opt{.sharding_strategy = kfsdp::sharding_strategy::zero3,
//                           .bucketing_strategy = kfsdp::bucketing::block,
//                           .broadcast_from = 0};

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/meta/enum_names.hpp>
#include <kfsdp/meta/type_list.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

// Thunder's FSDPType.
enum class sharding_strategy {
  zero2,  // gather once per step before forward, keep the unsharded parameters for backward
  zero3,  // free after each bucket's forward, gather again in backward
};

constexpr std::string_view to_string(sharding_strategy s) noexcept {
  return s == sharding_strategy::zero2 ? "zero2" : "zero3";
}
inline sharding_strategy parse_sharding(std::string_view text) {
  return parse_named(text, {sharding_strategy::zero2, sharding_strategy::zero3}, "sharding");
}

// Where the average over ranks is taken around the gradients' SUM reduce-scatter. Dividing first
// keeps a low-precision sum from overflowing at large world sizes; in f32 and f64 all three give the
// same average to rounding.
enum class gradient_division {
  after,   // sum, then ÷ world size
  before,  // ÷ world size, then sum (Thunder's pre-divide)
  split,   // ÷ f, sum, ÷ (world size / f), f = predivide_factor(world size) (FSDP1's split)
};

constexpr std::string_view to_string(gradient_division d) noexcept {
  switch (d) {
    case gradient_division::after: return "after";
    case gradient_division::before: return "before";
    case gradient_division::split: return "split";
  }
  return "?";
}

inline gradient_division parse_gradient_division(std::string_view text) {
  return parse_named(text, {gradient_division::after, gradient_division::before, gradient_division::split},
                     "gradient division");
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
// conversion); bf16 and f16 halve the bytes. The master shards and the optimizer stay in Scalar.
enum class wire_precision { scalar, bf16, f16 };

constexpr std::string_view to_string(wire_precision p) noexcept {
  switch (p) {
    case wire_precision::scalar: return "scalar";
    case wire_precision::bf16: return "bf16";
    case wire_precision::f16: return "f16";
  }
  return "?";
}

inline wire_precision parse_wire_precision(std::string_view text) {
  return parse_named(text, {wire_precision::scalar, wire_precision::bf16, wire_precision::f16}, "precision");
}

struct fsdp_options {
  kfsdp::sharding_strategy sharding_strategy = sharding_strategy::zero2;
  kfsdp::bucketing bucketing_strategy = bucketing::none;
  // Rank whose parameters become everyone's before sharding (nullopt: none); under HSDP, that
  // rank of the first shard group (the replica group's rank 0).
  std::optional<int> broadcast_from{};
  // GPU ordinal of the local shards; nullopt: Kokkos' default device (the host on CPU builds).
  std::optional<int> device{};
  // Gathered full parameters move to host memory as each all-gather finishes.
  bool move_state_dict_to_cpu = true;
  // At most this many bucket all-gathers in flight (FSDP's limit_all_gathers) bounds the unsharded
  // memory of prefetching; issuing one more first completes the oldest. 0: no limit.
  std::size_t limit_all_gathers = 0;
  // A unit's gradient reduce-scatters run behind the next unit's backward (true), at the cost of
  // one unit's reduce buffers more in the peak; false finishes them at once (ZeRO3 leanest).
  bool overlap_reduce_scatter = true;
  // Where the gradients' average over ranks is taken around the SUM (see gradient_division).
  kfsdp::gradient_division gradient_division = gradient_division::after;
  // Mixed precision (PyTorch's MixedPrecisionPolicy): the all-gathered parameters travel in
  // param_dtype and are converted back to Scalar as they are unpacked (compute reads Scalar: on
  // the CPU no BLAS has a bf16 GEMM), so compute sees the parameters rounded to param_dtype; the
  // gradients are reduce-scattered in reduce_dtype (divided `before` in Scalar, then rounded).
  wire_precision param_dtype = wire_precision::scalar;
  wire_precision reduce_dtype = wire_precision::scalar;
  // Hybrid sharding (HSDP): the engine's communicator is one shard group, and this one joins the
  // ranks that hold the same shard in the other groups (e.g. world.split(rank % 8, rank) beside
  // world.split(rank / 8, rank) for 8 ranks a node). Parameters are sharded within a group and
  // replicated across groups; gradients are reduce-scattered in the group, then all-reduced over
  // the replicas on the shard. nullopt: flat FSDP over the engine's communicator.
  std::optional<comm::any_communicator> replica_group{};
  // Which parts of the model are FSDP units (fsdp/units.hpp): each block by default.
  wrap_options wrap{};
};

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
using zero2 = sharding_policy<sharding_strategy::zero2>;
using zero3 = sharding_policy<sharding_strategy::zero3>;
using no_bucketing = bucketing_policy<bucketing::none>;
using layer_bucketing = bucketing_policy<bucketing::layer>;
using block_bucketing = bucketing_policy<bucketing::block>;

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
