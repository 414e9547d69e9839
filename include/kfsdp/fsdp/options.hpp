#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Thunder's fsdp() options, the one place the schedule is chosen (the enums they take are in
// fsdp/policies.hpp): the engine and kfsdp::trainer branch on them at run time.
//
//   kfsdp::fsdp_options opt{.sharding_strategy = kfsdp::sharding_strategy::zero3,
//                           .bucketing_strategy = kfsdp::bucketing::block,
//                           .broadcast_from = 0};

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/fsdp/policies.hpp>
#include <kfsdp/model/unit_assignment.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

KFSDP_EXPORT struct fsdp_options {
  // The schedule: one engine and one trainer type run every pair (no compile-time policy).
  kfsdp::sharding_strategy sharding_strategy = kfsdp::sharding_strategy::zero2;
  kfsdp::bucketing bucketing_strategy = kfsdp::bucketing::none;
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
  // param_dtype = int8 all-gathers the shards block-quantized (fsdp/quantize.hpp: about a quarter of
  // f32's bytes); reduce_dtype = int8 sends every rank its chunks of the gradients block-quantized
  // by one all-to-all a bucket, and sums them in Scalar (the same quarter; HSDP's replicas then
  // all-reduce in Scalar).
  wire_precision param_dtype = wire_precision::scalar;
  wire_precision reduce_dtype = wire_precision::scalar;
  // Hybrid sharding (HSDP): the engine's communicator is one shard group, and this one joins the
  // ranks that hold the same shard in the other groups (e.g. world.split(rank % 8, rank) beside
  // world.split(rank / 8, rank) for 8 ranks a node). Parameters are sharded within a group and
  // replicated across groups; gradients are reduce-scattered in the group, then all-reduced over
  // the replicas on the shard (issued as each bucket's reduce-scatter finishes, waited for before
  // the optimizer). nullopt: flat FSDP over the engine's communicator.
  std::optional<comm::any_communicator> replica_group{};
  // Which parts of the model are units (model/unit_assignment.hpp): each block by default.
  wrap_options wrap{};
  // FSDP2's reshard_after_forward, per unit by name ("root", "transformer.h.3", as units_table
  // prints them): true frees the unit's parameters after its forward and gathers them again for its
  // backward; false keeps them gathered until its backward is done. A unit not named follows the
  // sharding: zero3 frees every unit but the root (whose backward comes right after the forward),
  // zero2 frees none. Every rank must give the same list.
  //   .reshard_after_forward = {{"root", true}, {"transformer.h.11", false}}
  std::vector<std::pair<std::string, bool>> reshard_after_forward{};

  [[nodiscard]] kfsdp::sharding_strategy sharding() const noexcept { return sharding_strategy; }
  [[nodiscard]] kfsdp::bucketing bucketing() const noexcept { return bucketing_strategy; }
};

}  // namespace kfsdp
