#pragma once
// shard_mapping — every offset of a shard plan, in one place. Like an mdspan layout mapping, it
// turns an index in one index space into a range in another; the engine, the pack kernels, the
// sharded storage and the checkpoints ask it and compute no offset of their own. The plan
// (make_shard_plan) lays the parameters out; the mapping derives everything from that layout.
//
// The index spaces, for parameter p of bucket b at world size W (S = b's shard_numel):
//   full      p's unpadded elements, row-major: dim0 · row_numel
//   storage   a rank's flat storage: p's local chunk (chunk_rows · row_numel) at storage_offset
//   gathered  b's full buffer, rank-major (W, S): rank r's chunk of p at r·S + bucket_offset
//   unpacked  b's full buffer, parameter-major: its parameters each gathered alone, back to back: p
//             padded (W chunks in rank order, its real elements first) at W · bucket_offset; as long
//             as the gathered buffer. Each parameter's own all-gather writes it in place (no copy)
//             and its reduce-scatter reads it.
// (gathered and unpacked are the two layouts of a full bucket; fsdp/pack.hpp converts between them.)
//
// Worked example (shard_plan.hpp's: 0.weight [13,4] and 0.bias [13] in bucket 0 at W = 3, S = 25):
//   rows(0.weight, 2)           = [10, 13)  (3 real rows; the chunk's other 2 are padding)
//   elements(0.weight, 2)       = [40, 52)  (full elements rank 2 holds)
//   chunk(0.bias)               = [20, 25)  in every rank's storage
//   gathered(0.bias, 1)         = [45, 50)  (1·25 + 20, 5 elements: 5 rows of 1)
//   unpacked(0.bias)            = [60, 73)  (3 · 20: after 0.weight's 3 chunks of 20)
//   padded(0.bias)              = [60, 75)  (0.bias gathered alone: 3 chunks of 5)
//   unpacked(0.bias, 2)         = [70, 73)  (where rank 2's real rows of 0.bias land)
//   rank_shard(bucket 0, 2)     = [50, 75)  (rank 2's row of the gathered buffer)
//
//   constexpr kfsdp::basic_shard_mapping map(kfsdp::static_shard_plan<M, 8, kfsdp::bucketing::layer>);
//   static_assert(map.gathered(0, 7).first == 7 * map.plan().buckets[0].shard_numel);

#include <cstddef>
#include <utility>

#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

// Elements (or rows) [first, first + count) of one index space.
struct index_range {
  std::size_t first = 0;
  std::size_t count = 0;
  [[nodiscard]] constexpr std::size_t last() const noexcept { return first + count; }
  // For Kokkos::subview: the (begin, end) pair.
  [[nodiscard]] constexpr std::pair<std::size_t, std::size_t> pair() const noexcept { return {first, first + count}; }
  friend constexpr bool operator==(const index_range&, const index_range&) = default;
};

template <class Plan>
class basic_shard_mapping {
 public:
  constexpr explicit basic_shard_mapping(const Plan& plan) noexcept : plan_(&plan) {}

  [[nodiscard]] constexpr const Plan& plan() const noexcept { return *plan_; }
  [[nodiscard]] constexpr std::size_t world_size() const noexcept { return plan_->world_size; }

  // --- the full parameter
  // The real rows of p that `rank` holds: [rank·chunk_rows, min(dim0, (rank+1)·chunk_rows)), maybe empty.
  [[nodiscard]] constexpr index_range rows(std::size_t p, std::size_t rank) const noexcept {
    const param_shard& s = plan_->params[p];
    const std::size_t first = rank * s.chunk_rows;
    if (first >= s.dim0) return {s.dim0, 0};
    return {first, s.dim0 - first < s.chunk_rows ? s.dim0 - first : s.chunk_rows};
  }
  // The same rows as full elements of p.
  [[nodiscard]] constexpr index_range elements(std::size_t p, std::size_t rank) const noexcept {
    const index_range r = rows(p, rank);
    const std::size_t row = plan_->params[p].row_numel;
    return {r.first * row, r.count * row};
  }

  // --- a rank's flat storage
  // p's local chunk, padding included.
  [[nodiscard]] constexpr index_range chunk(std::size_t p) const noexcept {
    const param_shard& s = plan_->params[p];
    return {s.storage_offset, s.chunk_numel()};
  }
  // p's local chunk inside its bucket's local shard (what p's own all-gather sends).
  [[nodiscard]] constexpr index_range bucket_chunk(std::size_t p) const noexcept {
    const param_shard& s = plan_->params[p];
    return {s.bucket_offset, s.chunk_numel()};
  }
  // Bucket b's local shard: what its all-gather sends and its reduce-scatter receives.
  [[nodiscard]] constexpr index_range bucket(std::size_t b) const noexcept {
    const bucket_shard& s = plan_->buckets[b];
    return {s.storage_offset, s.shard_numel};
  }

  // --- a bucket's all-gathered buffer, (world_size, shard_numel) row-major
  // Rank `rank`'s chunk of p in its bucket's gathered buffer.
  [[nodiscard]] constexpr index_range gathered(std::size_t p, std::size_t rank) const noexcept {
    const param_shard& s = plan_->params[p];
    return {rank * plan_->buckets[s.bucket].shard_numel + s.bucket_offset, s.chunk_numel()};
  }
  // Rank `rank`'s whole shard of bucket b in its gathered buffer.
  [[nodiscard]] constexpr index_range rank_shard(std::size_t b, std::size_t rank) const noexcept {
    const std::size_t shard = plan_->buckets[b].shard_numel;
    return {rank * shard, shard};
  }
  // Elements of bucket b's gathered buffer: world_size shards (the plan's count).
  [[nodiscard]] constexpr std::size_t gathered_numel(std::size_t b) const { return plan_->gathered_numel(b); }
  // p gathered alone (its world_size chunks back to back, as a one-parameter bucket is): padded.
  [[nodiscard]] constexpr std::size_t padded_numel(std::size_t p) const noexcept {
    return plan_->params[p].chunk_numel() * plan_->world_size;
  }

  // --- a bucket's unpacked buffer (its parameters each padded, back to back; gathered_numel long)
  // p gathered alone, padding included: its all-gather's output, its reduce-scatter's input.
  [[nodiscard]] constexpr index_range padded(std::size_t p) const noexcept {
    return {plan_->world_size * plan_->params[p].bucket_offset, padded_numel(p)};
  }
  // p's real elements (the parameter the layers see).
  [[nodiscard]] constexpr index_range unpacked(std::size_t p) const noexcept {
    return {padded(p).first, plan_->params[p].full_numel()};
  }
  // Where rank `rank`'s real rows of p land in the unpacked buffer.
  [[nodiscard]] constexpr index_range unpacked(std::size_t p, std::size_t rank) const noexcept {
    const index_range e = elements(p, rank);
    return {padded(p).first + e.first, e.count};
  }

 private:
  const Plan* plan_;
};

template <class Params, class Buckets>
basic_shard_mapping(const basic_shard_plan<Params, Buckets>&) -> basic_shard_mapping<basic_shard_plan<Params, Buckets>>;

// The mapping of a plan computed at run time.
using shard_mapping = basic_shard_mapping<shard_plan>;

}  // namespace kfsdp
