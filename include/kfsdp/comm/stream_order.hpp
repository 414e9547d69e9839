#pragma once
// The stream order of a collective against the compute around it: the native stream of a Kokkos
// execution-space instance, and order_after, which makes a communicator's later collectives read
// what that instance has written (a backend with streams of its own waits on the GPU, the others
// fence the instance).

#include <kfsdp/comm/communicator.hpp>

namespace kfsdp::comm {

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

// Whether `stream` is where Space's kernels run (its execution space's default instance): work
// enqueued there without a fence is ordered before the stream's later work.
template <class Space>
[[nodiscard]] bool runs_on(native_stream stream) {
  return stream.handle != nullptr && stream.handle == stream_of(typename Space::execution_space()).handle;
}

}  // namespace detail

}  // namespace kfsdp::comm
