#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::comm::self — the one-rank communicator: no MPI, every collective is a copy in the
// buffers' memory space (or nothing), and every request is complete when it is returned; the
// blocking collectives are communicator.hpp's free functions. For tests, examples and
// single-process runs.
//
//   kfsdp::comm::self comm;
//   std::vector<float> shard{1, 2}, full(2);
//   kfsdp::comm::all_gather(comm, shard, std::span(full));   // full == {1, 2}
//   kfsdp::comm::check_agreement(comm, 42, "the plan");     // one rank always agrees

#include <span>
#include <type_traits>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/memory_space.hpp>

namespace kfsdp::comm {

KFSDP_EXPORT class self {
 public:
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }

  // Buffers of any memory space; the copies are Kokkos copies in that space (memory_space.hpp).
  template <element T, class Space>
  [[nodiscard]] request iall_gather(std::type_identity_t<span_in<const T, Space>> send,
                                    span_in<T, Space> recv) {
    detail::check_all_gather("kfsdp::comm::self::iall_gather", rank(), size(), send.span(), recv.span());
    detail::copy(send, recv);
    return {};
  }
  template <element T, class Space>
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv) {
    detail::check_reduce_scatter("kfsdp::comm::self::ireduce_scatter_sum", size(), send.span(), recv.span());
    detail::copy(send, recv);
    return {};
  }
  template <element T, class Space>
  [[nodiscard]] request ibroadcast(span_in<T, Space> /*data*/, int root) {
    detail::check_root("kfsdp::comm::self::ibroadcast", root, size());
    return {};
  }
  // One rank sends its only block to itself.
  template <element T, class Space>
  [[nodiscard]] request iall_to_all(std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
    detail::check_all_to_all("kfsdp::comm::self::iall_to_all", size(), send.span(), recv.span());
    detail::copy(send, recv);
    return {};
  }
  // Over one rank a sum, max or min leaves the data as it is.
  template <element T, class Space>
  [[nodiscard]] request iall_reduce_sum(span_in<T, Space> /*data*/) {
    return {};
  }

  // Host memory. send is a non-deduced parameter, so a std::vector or a span<T> of mutable data
  // converts.
  template <element T>
  [[nodiscard]] request iall_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    return iall_gather<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }
  template <element T>
  [[nodiscard]] request ireduce_scatter_sum(std::span<const std::type_identity_t<T>> send,
                                            std::span<T> recv) {
    return ireduce_scatter_sum<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }
  template <element T>
  [[nodiscard]] request ibroadcast(std::span<T> data, int root) {
    return ibroadcast<T, Kokkos::HostSpace>(host_span<T>(data), root);
  }
  template <element T>
  [[nodiscard]] request iall_reduce_sum(std::span<T> /*data*/) {
    return {};
  }
  template <element T>
  [[nodiscard]] request iall_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    return iall_to_all<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }
  template <ordered_element T>
  void all_reduce_max(std::span<T> /*data*/) {}
  template <ordered_element T>
  void all_reduce_min(std::span<T> /*data*/) {}

  void barrier() noexcept {}
};

static_assert(communicator<self>);
static_assert(communicator_in<self, Kokkos::HostSpace>);

}  // namespace kfsdp::comm
