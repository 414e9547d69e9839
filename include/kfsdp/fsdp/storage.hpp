#pragma once
// A rank's sharded storage: one flat Kokkos view laid out by the shard plan (bucket after bucket),
// and each parameter's local shard as an unmanaged 2-D view (chunk_rows × row_numel) into it.
//
//   plan for 0.weight [13,4] at world size 3: chunk 5 rows, storage_offset 0
//   rank 2: local_shard(0) = rows 10..14 of the padded weight; rows 13, 14 are padding (zero)

#include <cstddef>
#include <string>
#include <utility>
#include <Kokkos_Core.hpp>

#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

template <class Scalar>
class sharded_storage {
 public:
  using flat_view = Kokkos::View<Scalar*>;
  using shard_view = Kokkos::View<Scalar**, Kokkos::LayoutRight, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  sharded_storage() = default;
  // Zero-filled storage for `plan` (so padding starts zero).
  sharded_storage(const shard_plan& plan, std::string label)
      : flat_(std::move(label), plan.shard_numel), plan_(&plan) {}

  [[nodiscard]] flat_view flat() const { return flat_; }
  // The local slice of one bucket: what the all-gather sends and the reduce-scatter receives.
  [[nodiscard]] flat_view bucket(std::size_t b) const {
    const bucket_shard& s = plan_->buckets.at(b);
    return Kokkos::subview(flat_, std::make_pair(s.storage_offset, s.storage_offset + s.shard_numel));
  }
  // Parameter p's local chunk, flat.
  [[nodiscard]] flat_view chunk(std::size_t p) const {
    const param_shard& s = plan_->params.at(p);
    return Kokkos::subview(flat_, std::make_pair(s.storage_offset, s.storage_offset + s.chunk_numel()));
  }
  // Parameter p's local chunk as chunk_rows × row_numel.
  [[nodiscard]] shard_view shard(std::size_t p) const {
    const param_shard& s = plan_->params.at(p);
    return shard_view(flat_.data() + s.storage_offset, s.chunk_rows, s.row_numel);
  }
  [[nodiscard]] std::size_t bytes() const { return flat_.extent(0) * sizeof(Scalar); }

 private:
  flat_view flat_;
  const shard_plan* plan_ = nullptr;
};

}  // namespace kfsdp
