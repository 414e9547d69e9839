#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The batched and scaled collectives on any communicator: iall_gather_parts,
// ireduce_scatter_sum_parts and ireduce_scatter_sum with a factor. Each is the backend's own where
// it has one (the concepts gathers_parts, reduces_parts, scales_reduce_scatter), else built from
// its single collectives, the factor applied once the sums are in.

#include <concepts>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/memory_space.hpp>
#include <kfsdp/comm/stream_order.hpp>

namespace kfsdp::comm {

namespace detail {

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
