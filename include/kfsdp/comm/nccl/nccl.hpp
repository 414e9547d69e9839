#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::comm::nccl — the NCCL communicator backend: one GPU per rank, bootstrapped over MPI.
//
// Opt-in, and free of CUDA flags: this header includes neither nccl.h nor a CUDA header (the NCCL
// and CUDA calls live in the kfsdp_nccl library), so any C++ compiler can include it. Its
// collectives move device memory (span_in<T, Kokkos::CudaSpace>, or span_in<T, nccl::device_memory>
// for a cudaMalloc'd buffer); host memory goes over host(), its MPI communicator. Collectives run on a dedicated communication stream; a blocking call returns
// once its result is in device memory (comm::all_gather(gpus, ...) waits on the request), a
// non-blocking one returns a request that records a CUDA event on that stream.
//
// Ordering against your compute stream, with events (llm.c's overlap pattern):
//
//   kfsdp::comm::mpi world;                           // bootstraps NCCL: rank 0's unique id
//   kfsdp::comm::nccl gpus(world);                    // GPU = node-local rank % device count
//   cudaEventRecord(shard_ready, compute_stream);     // compute produced `shard`
//   gpus.wait_for(shard_ready);                       // the communication stream waits for it
//   auto pending = gpus.iall_gather(shard, full);     // runs behind the compute stream
//   gpus.make_stream_wait(compute_stream);            // compute's later work reads `full` safely
//   ...                                               // no host blocking needed; or:
//   pending.wait();                                   // the host waits (cudaEventSynchronize)
//
// With Kokkos execution-space instances, as the engine does it (comm::order_after, stream_order.hpp):
//   kfsdp::comm::order_after(gpus, compute);                   // gpus.order_after(stream_of(compute))
//   auto pending = gpus.iall_gather(shard, full);
//   pending.complete_before(kfsdp::comm::stream_of(compute));  // cudaStreamWaitEvent on compute's stream
//
// Without a visible CUDA device the constructor throws std::runtime_error:
//   "kfsdp::comm::nccl: no CUDA device is visible (cudaGetDeviceCount: ...); the NCCL backend needs
//    one GPU per rank — use kfsdp::comm::mpi on CPU machines"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <vector>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/batched_collectives.hpp>
#include <kfsdp/comm/memory_space.hpp>
#include <kfsdp/comm/stream_order.hpp>
#include <kfsdp/comm/mpi/mpi.hpp>

// The CUDA runtime's opaque handle types, declared as cuda_runtime.h declares them
// (cudaStream_t = CUstream_st*, cudaEvent_t = CUevent_st*), so they pass straight through.
struct CUstream_st;
struct CUevent_st;

namespace kfsdp::comm {

KFSDP_EXPORT class nccl {
 public:
  using cuda_stream = CUstream_st*;  // = cudaStream_t
  using cuda_event = CUevent_st*;    // = cudaEvent_t

  // Pass as `device` to use GPU (node-local rank % cudaGetDeviceCount()).
  static constexpr int node_local_device = -1;

  // Collective over `bootstrap`, whose duplicate (host()) carries the NCCL unique id and the
  // host-memory agreement checks. Throws on every rank if any rank has no usable device, so that
  // none is left waiting in ncclCommInitRank.
  explicit nccl(const mpi& bootstrap, int device = node_local_device);
  nccl(nccl&&) noexcept;
  nccl& operator=(nccl&&) noexcept;
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  ~nccl();  // waits for the communication stream, then frees the NCCL communicator and stream

  [[nodiscard]] int rank() const noexcept { return host_.rank(); }
  [[nodiscard]] int size() const noexcept { return host_.size(); }
  [[nodiscard]] int device() const noexcept;
  // The communication stream (owned by this communicator).
  [[nodiscard]] cuda_stream stream() const noexcept;
  // The MPI communicator over the same ranks, for small host-memory values (check_agreement).
  [[nodiscard]] mpi& host() noexcept { return host_; }

  // Collectives issued after this call start only once `produced` (recorded on any stream) fires.
  void wait_for(cuda_event produced);
  // Work issued on `consumer` after this call starts only once every collective issued so far is
  // complete; the host does not block.
  void make_stream_wait(cuda_stream consumer);
  // Collectives issued after this call start once the work issued so far on `compute` (a native
  // stream, comm::stream_of(instance)) is complete: comm::order_after(gpus, instance) calls it.
  void order_after(native_stream compute);

  // Memory that NCCL reads: a Kokkos space the CUDA execution space can access (CudaSpace,
  // CudaUVMSpace, CudaHostPinnedSpace), or device_memory, the tag for a buffer from cudaMalloc
  // outside Kokkos. Host memory (std::span) is host()'s, over MPI.
  struct device_memory {};
  template <class Space>
  static constexpr bool reads() noexcept {
    if constexpr (std::is_same_v<Space, device_memory>) return true;
#if defined(KOKKOS_ENABLE_CUDA)
    else return Kokkos::SpaceAccessibility<Kokkos::Cuda, Space>::accessible;
#else
    else return false;
#endif
  }

  // Requirements as in the communicator concept (communicator.hpp). The blocking forms are
  // communicator.hpp's free functions: the request's wait() is cudaEventSynchronize. bf16 and f16
  // are ncclBfloat16 and ncclFloat16 (NCCL's own summation).
  template <element T, class Space>
    requires(reads<Space>())
  [[nodiscard]] request iall_gather(std::type_identity_t<span_in<const T, Space>> send,
                                    span_in<T, Space> recv) {
    constexpr std::string_view function = "kfsdp::comm::nccl::iall_gather";
    detail::check_all_gather(function, rank(), size(), send.span(), recv.span());
    issue_all_gather(send.data(), recv.data(), send.size(), kind_of<T>(), function);
    return record(function);
  }
  template <element T, class Space>
    requires(reads<Space>())
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv) {
    constexpr std::string_view function = "kfsdp::comm::nccl::ireduce_scatter_sum";
    detail::check_reduce_scatter(function, size(), send.span(), recv.span());
    issue_reduce_scatter_sum(send.data(), recv.data(), recv.size(), kind_of<T>(), function);
    return record(function);
  }
  // Batches (comm::iall_gather_parts, comm::ireduce_scatter_sum_parts): one NCCL call a part,
  // issued between ncclGroupStart and ncclGroupEnd, so NCCL launches them as one operation; one
  // event for the batch. The factor multiplies the sums once they are in (NCCL's sum cannot scale
  // after adding).
  template <element T, class Space>
    requires(reads<Space>())
  [[nodiscard]] request iall_gather_parts(std::span<const gather_part<T, Space>> parts) {
    constexpr std::string_view function = "kfsdp::comm::nccl::iall_gather_parts";
    detail::check_all_gather_parts(function, rank(), size(), parts);
    std::vector<part_call> calls;
    calls.reserve(parts.size());
    for (const gather_part<T, Space>& part : parts) calls.push_back({part.send.data(), part.recv.data(), part.send.size()});
    issue_group(collective::all_gather, calls, kind_of<T>(), function);
    return record(function);
  }
  template <element T, class Space>
    requires(reads<Space>())
  [[nodiscard]] request ireduce_scatter_sum_parts(std::span<const reduce_scatter_part<T, Space>> parts,
                                                  std::type_identity_t<scale_type<T>> factor = scale_type<T>(1)) {
    constexpr std::string_view function = "kfsdp::comm::nccl::ireduce_scatter_sum_parts";
    detail::check_reduce_scatter_parts(function, size(), parts);
    std::vector<part_call> calls;
    std::vector<span_in<T, Space>> recvs;
    calls.reserve(parts.size());
    for (const reduce_scatter_part<T, Space>& part : parts) {
      calls.push_back({part.send.data(), part.recv.data(), part.recv.size()});
      recvs.push_back(part.recv);
    }
    if constexpr (std::is_same_v<Space, device_memory>) {
      if (factor != scale_type<T>(1))  // a cudaMalloc'd buffer has no execution space to multiply in
        throw std::invalid_argument(fmt::format("{}: factor is {}, expected 1 for device_memory buffers (pass "
                                                "Kokkos views to scale)", function, static_cast<double>(factor)));
    }
    issue_group(collective::reduce_scatter_sum, calls, kind_of<T>(), function);
    request sums = record(function);
    if constexpr (std::is_same_v<Space, device_memory>) {
      return sums;
    } else {
      if (factor == scale_type<T>(1)) return sums;
      return request(detail::parts_multiplied_on_completion<T, Space>{{}, std::move(sums), std::move(recvs), factor});
    }
  }
  template <element T, class Space>
    requires(reads<Space>())
  [[nodiscard]] request ibroadcast(span_in<T, Space> data, int root) {
    constexpr std::string_view function = "kfsdp::comm::nccl::ibroadcast";
    detail::check_root(function, root, size());
    issue_broadcast(data.data(), data.size(), kind_of<T>(), root, function);
    return record(function);
  }
  template <element T, class Space>
    requires(reads<Space>())
  [[nodiscard]] request iall_reduce_sum(span_in<T, Space> data) {
    constexpr std::string_view function = "kfsdp::comm::nccl::iall_reduce_sum";
    issue_all_reduce(data.data(), data.size(), kind_of<T>(), reduction::sum, function);
    return record(function);
  }

  // A block a rank: one ncclSend and one ncclRecv a peer, issued between ncclGroupStart and
  // ncclGroupEnd (NCCL has no all-to-all of its own); one event.
  template <element T, class Space>
    requires(reads<Space>())
  [[nodiscard]] request iall_to_all(std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
    constexpr std::string_view function = "kfsdp::comm::nccl::iall_to_all";
    detail::check_all_to_all(function, size(), send.span(), recv.span());
    issue_all_to_all(send.data(), recv.data(), send.size() / static_cast<std::size_t>(size()), sizeof(T), kind_of<T>(),
                     function);
    return record(function);
  }

  // Blocking: the host waits for the communication stream.
  template <ordered_element T, class Space>
    requires(reads<Space>())
  void all_reduce_max(span_in<T, Space> data) {
    constexpr std::string_view function = "kfsdp::comm::nccl::all_reduce_max";
    issue_all_reduce(data.data(), data.size(), kind_of<T>(), reduction::max, function);
    synchronize(function);
  }
  template <ordered_element T, class Space>
    requires(reads<Space>())
  void all_reduce_min(span_in<T, Space> data) {
    constexpr std::string_view function = "kfsdp::comm::nccl::all_reduce_min";
    issue_all_reduce(data.data(), data.size(), kind_of<T>(), reduction::min, function);
    synchronize(function);
  }

  // The ranks with the same color form a new communicator, ranked by key (ties by rank());
  // collective. ncclCommSplit on the device side, mpi::split for host(); the group owns both.
  // color must be >= 0 on every rank (no rank may opt out).
  [[nodiscard]] nccl split(int color, int key) const;

  // Every rank's issued collectives are complete (the stream is drained, then an MPI barrier).
  void barrier();

 private:
  enum class element_kind { float32, float64, int64, uint64, bfloat16, float16 };
  enum class reduction { sum, max, min };

  template <class T>
  static constexpr element_kind kind_of() noexcept {
    if constexpr (std::is_same_v<T, float>) return element_kind::float32;
    else if constexpr (std::is_same_v<T, double>) return element_kind::float64;
    else if constexpr (std::is_same_v<T, std::int64_t>) return element_kind::int64;
    else if constexpr (std::is_same_v<T, std::uint64_t>) return element_kind::uint64;
    else if constexpr (std::is_same_v<T, bf16>) return element_kind::bfloat16;
    else return element_kind::float16;
  }

  void issue_all_gather(const void* send, void* recv, std::size_t send_count, element_kind kind,
                        std::string_view function);
  void issue_reduce_scatter_sum(const void* send, void* recv, std::size_t recv_count,
                                element_kind kind, std::string_view function);
  // One part of a grouped batch: send and recv device pointers, and the count NCCL takes (the
  // all-gather's send, the reduce-scatter's recv).
  struct part_call {
    const void* send;
    void* recv;
    std::size_t count;
  };
  enum class collective { all_gather, reduce_scatter_sum };
  void issue_group(collective what, std::span<const part_call> calls, element_kind kind, std::string_view function);
  // block_count elements of element_bytes each a peer, from send + peer's block to recv + peer's block.
  void issue_all_to_all(const void* send, void* recv, std::size_t block_count, std::size_t element_bytes,
                        element_kind kind, std::string_view function);
  void issue_broadcast(void* data, std::size_t count, element_kind kind, int root,
                       std::string_view function);
  void issue_all_reduce(void* data, std::size_t count, element_kind kind, reduction operation,
                        std::string_view function);
  // Host waits for the communication stream (all_reduce_max, all_reduce_min).
  void synchronize(std::string_view function);
  // A request on an event recorded now on the communication stream (the non-blocking forms).
  request record(std::string_view function);

  struct device_state;  // ncclComm_t, the stream, the device: defined in src/comm/nccl/nccl.cpp
  // A group made by split(): adopts its host communicator and its device state.
  nccl(mpi host, std::unique_ptr<device_state> state) noexcept;
  mpi host_;
  std::unique_ptr<device_state> state_;
};

static_assert(communicator_in<nccl, nccl::device_memory>);
static_assert(has_host_channel<nccl>);
static_assert(gathers_parts<nccl, float, nccl::device_memory> && reduces_parts<nccl, float, nccl::device_memory>);

}  // namespace kfsdp::comm
