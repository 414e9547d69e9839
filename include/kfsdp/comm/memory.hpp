#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The memory-space work inside a collective, as Kokkos does it: whether the host may touch a space,
// copies, the ring's adds, scratch and staging buffers. Every step a backend takes on the bytes of
// a collective (other than the MPI or NCCL call itself) is one of these, run in the data's own
// execution space, so that a collective on Kokkos::CudaSpace never reads device memory from the
// host.
//
//   kfsdp::comm::span_in<float, Kokkos::CudaSpace> partial, own, sum;   // one ring segment
//   kfsdp::comm::detail::add(partial, own, sum);   // a kernel on Kokkos::Cuda, fenced
//
// Host memory works without Kokkos running too (a program that uses only the communicators): the
// same steps are then plain loops on the calling thread.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>

namespace kfsdp::comm {

// True when the host may read and write Space's memory (HostSpace, pinned and unified memory).
template <class Space>
inline constexpr bool host_accessible =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible;

// The host memory through which device memory travels for an MPI that cannot read it: pinned
// where the device backend has such a space, so the copies run at the bus's speed.
#if defined(KOKKOS_ENABLE_CUDA)
using staging_space = Kokkos::CudaHostPinnedSpace;
#else
using staging_space = Kokkos::HostSpace;
#endif

// What a scaled reduce-scatter multiplies its sums by: float for the 16-bit types, which add in float.
template <class T>
using scale_type = std::conditional_t<half_element<T>, float, T>;

// The native stream of an execution-space instance: its cudaStream_t or hipStream_t, null for a
// host instance (Serial, OpenMP, Threads), whose kernels are complete when they return.
template <class ExecutionSpace>
[[nodiscard]] native_stream stream_of(const ExecutionSpace& instance) {
  if constexpr (requires { instance.cuda_stream(); }) return {static_cast<void*>(instance.cuda_stream())};
  else if constexpr (requires { instance.hip_stream(); }) return {static_cast<void*>(instance.hip_stream())};
  else return {};
}

// Collectives that c issues after this call read what `compute` (an execution-space instance) has
// written so far. A backend that orders streams (nccl: c.order_after(native_stream)) makes its
// communication stream wait for the instance's stream, and the host does not block; otherwise the
// instance is fenced (that instance alone, never the whole device). A host instance is fenced, and a
// backend with order_after is told of it too (a null stream).
//
//   kfsdp::comm::order_after(gpus, compute);               // compute wrote `shard`
//   auto pending = gpus.iall_gather(shard, full);          // runs behind it, on the comm stream
//   pending.complete_before(kfsdp::comm::stream_of(compute));  // compute's next kernels read `full`
template <class C, class ExecutionSpace>
void order_after(C& c, const ExecutionSpace& compute) {
  const native_stream stream = stream_of(compute);
  if (stream.handle == nullptr) compute.fence();  // a host instance: complete already, or nearly
  if constexpr (requires { c.order_after(stream); }) c.order_after(stream);
  else if (stream.handle != nullptr) compute.fence();
}

namespace detail {

template <class Space>
[[nodiscard]] bool runs_as_host_loop() noexcept {
  if constexpr (host_accessible<Space>) return !Kokkos::is_initialized();
  else return false;
}

template <class T, class Space>
using unmanaged_view = Kokkos::View<T*, Space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T, class Space>
[[nodiscard]] unmanaged_view<T, Space> view_of(span_in<T, Space> elements) {
  return unmanaged_view<T, Space>(elements.data(), elements.size());
}

// to = from, element by element; the spans have equal sizes and the same space.
template <class T, class Space>
void copy(span_in<const T, Space> from, span_in<T, Space> to) {
  if (from.empty() || from.data() == to.data()) return;
  if (runs_as_host_loop<Space>()) {
    // Equal sizes; the smaller bound lets GCC see that no write passes `to` (no -Warray-bounds).
    std::copy_n(from.data(), std::min(from.size(), to.size()), to.data());
    return;
  }
  Kokkos::deep_copy(view_of(to), view_of(from));  // blocking: complete on return
}

// (a + b) · factor; a 16-bit float adds and multiplies in float and rounds once, as MPI's sum
// operation adds. For float and double the sum is rounded before the product, as two passes would:
// a factor of 1 changes no bit. (Outside the lambda below: nvcc's device lambdas take no if
// constexpr that decides what they capture.)
template <class T>
KOKKOS_INLINE_FUNCTION T scaled_sum_of(T a, T b, scale_type<T> factor) {
  if constexpr (half_element<T>) return T((a.to_float() + b.to_float()) * factor);
  else return (a + b) * factor;
}
template <class T>
KOKKOS_INLINE_FUNCTION T product_of(T a, scale_type<T> factor) {
  if constexpr (half_element<T>) return T(a.to_float() * factor);
  else return a * factor;
}

// One pass over n elements in Space's execution space (a plain loop on the host without Kokkos),
// complete on return.
template <class Space, class Body>
void for_each_index(const char* label, std::size_t n, const Body& body) {
  if (runs_as_host_loop<Space>()) {
    for (std::size_t i = 0; i < n; ++i) body(i);
    return;
  }
  using execution_space = typename Space::execution_space;
  Kokkos::parallel_for(label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::size_t>>(0, n), body);
  execution_space().fence();  // the caller sends or hands out the result next
}

// Whether `stream` is where Space's kernels run (its execution space's default instance): work
// enqueued there without a fence is ordered before the stream's later work.
template <class Space>
[[nodiscard]] bool runs_on(native_stream stream) {
  return stream.handle != nullptr && stream.handle == stream_of(typename Space::execution_space()).handle;
}

// sum[i] = (partial[i] + own[i]) · factor (sum may be own or partial): the ring's step, whose last
// round folds in a scaled reduce-scatter's factor.
template <class T, class Space>
void add(span_in<const T, Space> partial, span_in<const T, Space> own, span_in<T, Space> sum,
         scale_type<T> factor = scale_type<T>(1)) {
  const T* a = partial.data();
  const T* b = own.data();
  T* out = sum.data();
  for_each_index<Space>("kfsdp::comm::add", sum.size(),
                        KOKKOS_LAMBDA(std::size_t i) { out[i] = scaled_sum_of(a[i], b[i], factor); });
}

// data[i] = data[i] · factor; nothing to do for a factor of 1.
template <class T, class Space>
void multiply(span_in<T, Space> data, scale_type<T> factor) {
  if (factor == scale_type<T>(1)) return;
  T* out = data.data();
  for_each_index<Space>("kfsdp::comm::multiply", data.size(),
                        KOKKOS_LAMBDA(std::size_t i) { out[i] = product_of(out[i], factor); });
}
// The same, enqueued on Space's default instance and not waited for (runs_on<Space>(stream)).
template <class T, class Space>
void multiply_in_stream_order(span_in<T, Space> data, scale_type<T> factor) {
  if (factor == scale_type<T>(1)) return;
  T* out = data.data();
  using execution_space = typename Space::execution_space;
  Kokkos::parallel_for("kfsdp::comm::multiply",
                       Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::size_t>>(0, data.size()),
                       KOKKOS_LAMBDA(std::size_t i) { out[i] = product_of(out[i], factor); });
}

// Elements owned in Space, e.g. a ring's receive segments: a Kokkos view, or (host memory without
// Kokkos running) a heap array. Moving it keeps data() where it was.
template <class T, class Space>
class owned_elements {
 public:
  owned_elements() = default;
  explicit owned_elements(std::size_t count) : count_(count) {
    if (runs_as_host_loop<Space>()) host_.reset(new T[count]);
    else view_ = Kokkos::View<T*, Space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::comm"), count);
  }
  [[nodiscard]] span_in<T, Space> span() const noexcept {
    return {host_ ? host_.get() : view_.data(), count_};
  }

 private:
  std::size_t count_ = 0;
  std::unique_ptr<T[]> host_;
  Kokkos::View<T*, Space> view_;
};

// to = from across memory spaces (staging device memory through host memory and back); blocks
// until done.
template <class T, class ToSpace, class FromSpace>
void transfer(span_in<T, ToSpace> to, span_in<const T, FromSpace> from) {
  if (from.empty()) return;
  if (runs_as_host_loop<ToSpace>() && runs_as_host_loop<FromSpace>()) {
    std::copy_n(from.data(), from.size(), to.data());
    return;
  }
  Kokkos::deep_copy(view_of(to), view_of(from));
}

// A reduce-scatter's request that multiplies recv by the factor once the sums are in: for a backend
// (or a path of one) that cannot fold the factor into its last addition. Same bits as the fold for
// float and double.
template <class T, class Space>
struct multiplied_on_completion : finished_on_completion<multiplied_on_completion<T, Space>> {
  request sums;
  span_in<T, Space> recv;
  scale_type<T> factor;
  request& awaited() { return sums; }
  void finish() { multiply(recv, factor); }
  // On the stream the multiply runs on, nothing blocks the host; on any other, it waits.
  void complete_before(native_stream stream) {
    if (!runs_on<Space>(stream)) return this->wait();
    sums.complete_before(stream);
    multiply_in_stream_order(recv, factor);
  }
};
template <class T, class Space>
[[nodiscard]] request multiplied_once_complete(request sums, span_in<T, Space> recv, scale_type<T> factor) {
  if (factor == scale_type<T>(1)) return sums;
  return request(multiplied_on_completion<T, Space>{{}, std::move(sums), recv, factor});
}

// The same for a batch whose sums complete together (nccl's group): every part's recv multiplied
// once they are in.
template <class T, class Space>
struct parts_multiplied_on_completion : finished_on_completion<parts_multiplied_on_completion<T, Space>> {
  request sums;
  std::vector<span_in<T, Space>> recvs;
  scale_type<T> factor;
  request& awaited() { return sums; }
  void finish() {
    for (const span_in<T, Space>& recv : recvs) multiply(recv, factor);
  }
  void complete_before(native_stream stream) {
    if (!runs_on<Space>(stream)) return this->wait();
    sums.complete_before(stream);
    for (const span_in<T, Space>& recv : recvs) multiply_in_stream_order(recv, factor);
  }
};

}  // namespace detail

// A backend that folds a factor into its reduce-scatter: c.ireduce_scatter_sum(send, recv, factor)
// completes with recv = (the sums) · factor, the product rounded after the sum (mpi's ring does it
// in its last round's addition).
template <class C, class T, class Space>
concept scales_reduce_scatter =
    requires(C& c, span_in<const T, Space> send, span_in<T, Space> recv, scale_type<T> factor) {
      { c.template ireduce_scatter_sum<T, Space>(send, recv, factor) } -> std::same_as<request>;
    };

// Host memory the other ranks of a communicator read in place: an MPI shared-memory window where all
// its ranks share a node. An all-gather whose sends lie in such memory moves no messages: each rank
// copies its peers' chunks straight out of their memory (mpi::iall_gather_parts). `owner` frees it,
// collectively, when its last copy goes; empty (no bytes) where the backend cannot share memory.
//
//   kfsdp::comm::shared_bytes shards = kfsdp::comm::allocate_shared(world, bytes);   // collective
//   float* shard = shards.empty() ? fallback : reinterpret_cast<float*>(shards.bytes.data());
KFSDP_EXPORT struct shared_bytes {
  std::span<std::byte> bytes;
  std::shared_ptr<void> owner;
  [[nodiscard]] bool empty() const noexcept { return bytes.empty(); }
};

// A backend that hands out such memory: c.allocate_shared(bytes), collective over c, every rank
// asking in the same order (the sizes may differ).
template <class C>
concept shares_memory = requires(C& c, std::size_t bytes) {
  { c.allocate_shared(bytes) } -> std::same_as<shared_bytes>;
};

// `bytes` of memory the communicator's peers read in place, aligned to a cache line; empty where it has
// none to give (a backend without it, ranks on several nodes). Collective where it is not empty.
KFSDP_EXPORT template <class C>
[[nodiscard]] shared_bytes allocate_shared(C& c, std::size_t bytes) {
  if constexpr (shares_memory<C>) return c.allocate_shared(bytes);
  else return {};
}

// One part of a batch of all-gathers: once the batch completes, recv = [rank 0's send | rank 1's |
// ...], as iall_gather(send, recv) would leave it.
KFSDP_EXPORT template <class T, class Space>
struct gather_part {
  span_in<const T, Space> send;
  span_in<T, Space> recv;
};

// A backend that issues a batch of all-gathers as one collective: c.iall_gather_parts(parts)
// (mpi: one message a peer, received straight into every part's place).
template <class C, class T, class Space>
concept gathers_parts = requires(C& c, std::span<const gather_part<T, Space>> parts) {
  { c.template iall_gather_parts<T, Space>(parts) } -> std::same_as<request>;
};

// Every part all-gathered, as one request, on any communicator: the backend's batch where it has
// one, else one iall_gather a part (comm::when_all). Each part's sizes and overlap as
// iall_gather's; the recvs must not overlap one another. E.g. one bucket's parameters, each
// gathered from its chunk of the local shard into its own place of the gathered buffer:
//
//   std::vector<kfsdp::comm::gather_part<float, Kokkos::HostSpace>> parts = {{s0, r0}, {s1, r1}};
//   kfsdp::comm::iall_gather_parts<float, Kokkos::HostSpace>(world, parts).wait();
namespace detail {
// One iall_gather a part, as one request: the batch of a backend without one of its own (and
// mpi's for memory it does not batch). The caller has checked the parts.
template <class T, class Space, class C>
[[nodiscard]] request gather_part_by_part(C& c, std::span<const gather_part<T, Space>> parts) {
  std::vector<request> each;
  each.reserve(parts.size());
  for (const gather_part<T, Space>& part : parts) each.push_back(c.template iall_gather<T, Space>(part.send, part.recv));
  return when_all(std::move(each));
}
}  // namespace detail

KFSDP_EXPORT template <class T, class Space, class C>
[[nodiscard]] request iall_gather_parts(C& c, std::span<const gather_part<T, Space>> parts) {
  if constexpr (gathers_parts<C, T, Space>) {
    return c.template iall_gather_parts<T, Space>(parts);
  } else {
    detail::check_all_gather_parts("kfsdp::comm::iall_gather_parts", c.rank(), c.size(), parts);
    return detail::gather_part_by_part<T, Space>(c, parts);
  }
}

// recv = (the reduce-scatter's sums) · factor on any communicator, e.g. the average over ranks
// without a pass of its own where the backend folds it in, else one pass over recv once the sums
// are in. Arguments as ireduce_scatter_sum's.
//
//   comm::ireduce_scatter_sum<float, Kokkos::HostSpace>(world, send, recv, 1.0f / world.size()).wait();
template <class T, class Space, class C>
[[nodiscard]] request ireduce_scatter_sum(C& c, std::type_identity_t<span_in<const T, Space>> send,
                                          std::type_identity_t<span_in<T, Space>> recv,
                                          std::type_identity_t<scale_type<T>> factor) {
  if constexpr (scales_reduce_scatter<C, T, Space>) {
    return c.template ireduce_scatter_sum<T, Space>(send, recv, factor);
  } else {
    return detail::multiplied_once_complete<T, Space>(c.template ireduce_scatter_sum<T, Space>(send, recv), recv,
                                                      factor);
  }
}

// One part of a batch of reduce-scatters: once the batch completes, rank r's recv[i] = (sum over
// ranks of send[r*recv.size() + i]) · factor, as ireduce_scatter_sum(send, recv, factor) would
// leave it.
KFSDP_EXPORT template <class T, class Space>
struct reduce_scatter_part {
  span_in<const T, Space> send;
  span_in<T, Space> recv;
};

// A backend that issues a batch of reduce-scatters as one collective:
// c.ireduce_scatter_sum_parts(parts, factor) (mpi: one ring over the parts, nccl: one group).
template <class C, class T, class Space>
concept reduces_parts =
    requires(C& c, std::span<const reduce_scatter_part<T, Space>> parts, scale_type<T> factor) {
      { c.template ireduce_scatter_sum_parts<T, Space>(parts, factor) } -> std::same_as<request>;
    };

namespace detail {
// One scaled ireduce_scatter_sum a part, as one request: the batch of a backend without one of its
// own. The caller has checked the parts.
template <class T, class Space, class C>
[[nodiscard]] request reduce_part_by_part(C& c, std::span<const reduce_scatter_part<T, Space>> parts,
                                          scale_type<T> factor) {
  std::vector<request> each;
  each.reserve(parts.size());
  for (const reduce_scatter_part<T, Space>& part : parts)
    each.push_back(comm::ireduce_scatter_sum<T, Space>(c, part.send, part.recv, factor));
  return when_all(std::move(each));
}
}  // namespace detail

// Every part reduce-scattered and multiplied by factor, as one request, on any communicator: the
// backend's batch where it has one, else one ireduce_scatter_sum a part. Each part's sizes as
// ireduce_scatter_sum's; no recv may overlap another part's send or recv. E.g. one bucket's
// gradients, each parameter's padded gradient summed into its chunk of the gradient shard:
//
//   std::vector<kfsdp::comm::reduce_scatter_part<float, Kokkos::HostSpace>> parts = {{g0, s0}, {g1, s1}};
//   kfsdp::comm::ireduce_scatter_sum_parts<float, Kokkos::HostSpace>(world, parts, 1.0f / world.size()).wait();
KFSDP_EXPORT template <class T, class Space, class C>
[[nodiscard]] request ireduce_scatter_sum_parts(C& c, std::span<const reduce_scatter_part<T, Space>> parts,
                                                std::type_identity_t<scale_type<T>> factor = scale_type<T>(1)) {
  if constexpr (reduces_parts<C, T, Space>) {
    return c.template ireduce_scatter_sum_parts<T, Space>(parts, factor);
  } else {
    detail::check_reduce_scatter_parts("kfsdp::comm::ireduce_scatter_sum_parts", c.size(), parts);
    return detail::reduce_part_by_part<T, Space>(c, parts, factor);
  }
}

}  // namespace kfsdp::comm
