#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The choices of Thunder's fsdp(): sharding, gradient division and wire precision as enums, which
// the run-time options select (fsdp/options.hpp; bucketing is plan/shard_plan.hpp's):
//
//   kfsdp::fsdp_options{.sharding_strategy = kfsdp::sharding_strategy::zero3,
//                       .bucketing_strategy = kfsdp::bucketing::block}
//
// Free of Kokkos and of every backend, so plans and options check in any translation unit.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include <kfsdp/meta/enum_names.hpp>
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

}  // namespace kfsdp
