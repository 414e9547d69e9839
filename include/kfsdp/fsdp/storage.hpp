#pragma once
// A rank's sharded storage: one flat Kokkos view laid out by the shard plan (bucket after bucket),
// and each parameter's local chunk as an unmanaged 2-D view (chunk_rows × row_numel) into it. The
// offsets come from the plan's shard_mapping. The flat view is Kokkos' own allocation, or memory the
// communicator's other ranks read in place (comm::allocate_shared: the parameter shards, on one
// node, so that an unshard copies them out of the peers' memory instead of sending messages).
//
//   plan for 0.weight [13,4] at world size 3: chunk 5 rows, storage_offset 0
//   rank 2: shard(0) = rows 10..14 of the padded weight; rows 13, 14 are padding (zero)

#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <Kokkos_Core.hpp>

#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/shared_memory.hpp>
#include <kfsdp/plan/shard_mapping.hpp>

namespace kfsdp {

// A flat view's elements as the communicators take them: a span tagged with the view's memory space.
template <class T, class... Properties>
comm::span_in<T, typename Kokkos::View<T*, Properties...>::memory_space> span_of(
    const Kokkos::View<T*, Properties...>& v) {
  return {v.data(), v.extent(0)};
}
template <class T, class... Properties>
comm::span_in<const T, typename Kokkos::View<T*, Properties...>::memory_space> const_span_of(
    const Kokkos::View<T*, Properties...>& v) {
  return {v.data(), v.extent(0)};
}

template <class Scalar>
class sharded_storage {
 public:
  using flat_view = Kokkos::View<Scalar*>;
  using shard_view = Kokkos::View<Scalar**, Kokkos::LayoutRight, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  sharded_storage() = default;
  // Zero-filled storage for `plan` (so padding starts zero); the plan must outlive it.
  sharded_storage(const shard_plan& plan, std::string label)
      : flat_(std::move(label), plan.shard_numel), map_(plan) {}
  // The same over `memory`, zero-filled, of plan.shard_numel elements at least, in the flat view's
  // memory space; it keeps memory.owner. Kokkos' own allocation where memory is empty.
  sharded_storage(const shard_plan& plan, std::string label, comm::shared_bytes memory) : map_(plan) {
    if (memory.bytes.size() < plan.shard_numel * sizeof(Scalar) || plan.shard_numel == 0) {
      flat_ = flat_view(std::move(label), plan.shard_numel);
      return;
    }
    flat_ = flat_view(reinterpret_cast<Scalar*>(memory.bytes.data()), plan.shard_numel);
    owner_ = std::move(memory.owner);
  }

  [[nodiscard]] flat_view flat() const { return flat_; }
  // This rank's shard of one bucket: what the all-gather sends and the reduce-scatter receives.
  [[nodiscard]] flat_view bucket(std::size_t b) const {
    check(b, map_.plan().buckets.size(), "bucket");
    return Kokkos::subview(flat_, map_.bucket(b).pair());
  }
  // Parameter p's local chunk, flat.
  [[nodiscard]] flat_view chunk(std::size_t p) const {
    check(p, map_.plan().params.size(), "chunk");
    return Kokkos::subview(flat_, map_.chunk(p).pair());
  }
  // Parameter p's local chunk as chunk_rows × row_numel.
  [[nodiscard]] shard_view shard(std::size_t p) const {
    check(p, map_.plan().params.size(), "shard");
    const param_shard& s = map_.plan().params[p];
    return shard_view(flat_.data() + map_.chunk(p).first, s.chunk_rows, s.row_numel);
  }
  [[nodiscard]] std::size_t bytes() const { return flat_.extent(0) * sizeof(Scalar); }
  // Whether the flat view lies in the communicator's shared memory (comm::allocate_shared).
  [[nodiscard]] bool in_shared_memory() const noexcept { return owner_ != nullptr; }

 private:
  flat_view flat_;
  shard_mapping map_{empty_plan()};
  std::shared_ptr<void> owner_;  // the shared memory under flat_, where it is that

  static void check(std::size_t index, std::size_t count, const char* where) {
    if (index >= count)
      throw std::out_of_range("kfsdp::sharded_storage::" + std::string(where) + ": index is " + std::to_string(index) +
                              ", expected less than " + std::to_string(count));
  }
  static const shard_plan& empty_plan() {
    static const shard_plan none;
    return none;
  }
};

}  // namespace kfsdp
