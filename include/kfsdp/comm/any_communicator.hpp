#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// any_communicator — a communicator of any backend behind one type, so that the engine is compiled
// once (in src/fsdp/engine.cpp) instead of once per backend. Collectives are per bucket, so one
// indirect call each costs nothing next to the transfer. It refers to the communicator it wraps:
// that one must outlive it.
//
// It carries host memory (std::span, span_in<T, Kokkos::HostSpace>) and, where the default
// execution space keeps its memory elsewhere (a GPU's), span_in<T, that memory space>: one table of
// calls per element type and memory space. A backend without host forms (nccl) moves host memory
// over its host() channel.
//
//   kfsdp::comm::mpi world;                       // or self, or nccl
//   kfsdp::comm::any_communicator comm(world);
//   kfsdp::comm::all_gather(comm, std::span<const float>(shard), std::span<float>(full));
//   Kokkos::View<float*> on_device("full", n);   // the default memory space
//   comm.iall_reduce_sum(kfsdp::comm::span_in(on_device)).wait();

#include <cstdint>
#include <span>
#include <tuple>
#include <type_traits>
#include <typeinfo>

#include <Kokkos_Core.hpp>

#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/batched_collectives.hpp>
#include <kfsdp/comm/memory_space.hpp>
#include <kfsdp/comm/shared_memory.hpp>
#include <kfsdp/comm/stream_order.hpp>

namespace kfsdp::comm {

KFSDP_EXPORT class any_communicator {
 public:
  // The memory spaces carried: the host's, and the default execution space's if it is another.
  using device_space = Kokkos::DefaultExecutionSpace::memory_space;

  template <class C>
    requires(!std::same_as<std::remove_cvref_t<C>, any_communicator>)
  any_communicator(C& backend)  // NOLINT: implicit, so that any backend converts
      : backend_(&backend), table_(&table_for<C>) {}

  [[nodiscard]] int rank() const { return table_->rank(backend_); }
  [[nodiscard]] int size() const { return table_->size(backend_); }
  void barrier() { table_->barrier(backend_); }

  // The element types carried: float, double, bf16, f16. The blocking forms are communicator.hpp's
  // free functions.
  template <class T, class Space>
  [[nodiscard]] request iall_gather(std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
    return calls<T, Space>().all_gather(backend_, send, recv);
  }
  // A batch of all-gathers, as the backend issues it (comm::iall_gather_parts).
  template <class T, class Space>
  [[nodiscard]] request iall_gather_parts(std::span<const gather_part<T, Space>> parts) {
    return calls<T, Space>().all_gather_parts(backend_, parts);
  }
  template <class T, class Space>
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv) {
    return calls<T, Space>().reduce_scatter_sum(backend_, send, recv);
  }
  // sums · factor, folded in by the backend where it can (comm::ireduce_scatter_sum with a factor).
  template <class T, class Space>
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv, std::type_identity_t<scale_type<T>> factor) {
    return calls<T, Space>().reduce_scatter_scaled(backend_, send, recv, factor);
  }
  // A batch of reduce-scatters, multiplied by factor, as the backend issues it
  // (comm::ireduce_scatter_sum_parts).
  template <class T, class Space>
  [[nodiscard]] request ireduce_scatter_sum_parts(std::span<const reduce_scatter_part<T, Space>> parts,
                                                  std::type_identity_t<scale_type<T>> factor = scale_type<T>(1)) {
    return calls<T, Space>().reduce_scatter_parts(backend_, parts, factor);
  }
  template <class T, class Space>
  [[nodiscard]] request ibroadcast(span_in<T, Space> data, int root) {
    return calls<T, Space>().broadcast(backend_, data, root);
  }
  template <class T, class Space>
  [[nodiscard]] request iall_reduce_sum(span_in<T, Space> data) {
    return calls<T, Space>().all_reduce_sum(backend_, data);
  }
  template <class T, class Space>
  [[nodiscard]] request iall_to_all(std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
    return calls<T, Space>().all_to_all(backend_, send, recv);
  }

  // Host memory.
  template <class T>
  [[nodiscard]] request iall_gather(std::span<const T> send, std::span<T> recv) {
    return iall_gather<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }
  template <class T>
  [[nodiscard]] request ireduce_scatter_sum(std::span<const T> send, std::span<T> recv) {
    return ireduce_scatter_sum<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }
  template <class T>
  [[nodiscard]] request ibroadcast(std::span<T> data, int root) {
    return ibroadcast<T, Kokkos::HostSpace>(host_span<T>(data), root);
  }
  template <class T>
  [[nodiscard]] request iall_reduce_sum(std::span<T> data) {
    return iall_reduce_sum<T, Kokkos::HostSpace>(host_span<T>(data));
  }
  template <class T>
  [[nodiscard]] request iall_to_all(std::span<const T> send, std::span<T> recv) {
    return iall_to_all<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }

  // Host memory the other ranks read in place, where the backend has it (comm::allocate_shared).
  [[nodiscard]] shared_bytes allocate_shared(std::size_t bytes) { return table_->allocate_shared(backend_, bytes); }

  // Collectives issued after this call read what `compute` has written so far (comm::order_after).
  void order_after(const Kokkos::DefaultExecutionSpace& compute) { table_->order_after(backend_, compute); }

  // The agreement primitive over the wrapped backend, so that comm::check_agreement, any_rank and
  // first_rank_with take an any_communicator too.
  [[nodiscard]] value_range range_over_ranks(std::uint64_t value) { return table_->range(backend_, value); }

  // The backend of type B under this communicator: the wrapped one, or one it runs over in turn
  // (threaded's backend(), a device backend's host() channel); null where there is none. For code
  // that needs the backend's own calls, MPI-IO over comm::mpi, say.
  //
  //   if (kfsdp::comm::mpi* world = engine.communicator().find_backend<kfsdp::comm::mpi>()) ...
  template <class B>
  [[nodiscard]] B* find_backend() noexcept {
    return static_cast<B*>(table_->find(backend_, typeid(B)));
  }

 private:
  // The collectives of one element type in one memory space.
  template <class T, class Space>
  struct collective_calls {
    request (*all_gather)(void*, span_in<const T, Space>, span_in<T, Space>);
    request (*all_gather_parts)(void*, std::span<const gather_part<T, Space>>);
    request (*reduce_scatter_sum)(void*, span_in<const T, Space>, span_in<T, Space>);
    request (*reduce_scatter_scaled)(void*, span_in<const T, Space>, span_in<T, Space>, scale_type<T>);
    request (*reduce_scatter_parts)(void*, std::span<const reduce_scatter_part<T, Space>>, scale_type<T>);
    request (*broadcast)(void*, span_in<T, Space>, int);
    request (*all_reduce_sum)(void*, span_in<T, Space>);
    request (*all_to_all)(void*, span_in<const T, Space>, span_in<T, Space>);
  };
  template <class... Spaces>
  struct space_list {};
  using carried_spaces = std::conditional_t<std::is_same_v<device_space, Kokkos::HostSpace>,
                                            space_list<Kokkos::HostSpace>,
                                            space_list<Kokkos::HostSpace, device_space>>;
  template <class... Spaces>
  static auto calls_over(space_list<Spaces...>)
      -> std::tuple<collective_calls<float, Spaces>..., collective_calls<double, Spaces>...,
                    collective_calls<bf16, Spaces>..., collective_calls<f16, Spaces>...>;
  using carried_calls = decltype(calls_over(carried_spaces{}));

  struct operation_table {
    int (*rank)(const void*);
    int (*size)(const void*);
    void (*barrier)(void*);
    value_range (*range)(void*, std::uint64_t);
    void (*order_after)(void*, const Kokkos::DefaultExecutionSpace&);
    shared_bytes (*allocate_shared)(void*, std::size_t);
    void* (*find)(void*, const std::type_info&);
    carried_calls collectives;
  };

  // The backend itself where it moves Space, else (host memory of a device backend) its host().
  template <class T, class Space, class C>
  static auto& mover(C& backend) {
    if constexpr (moves_elements_in<C, T, Space>) {
      return backend;
    } else {
      static_assert(std::is_same_v<Space, Kokkos::HostSpace> && has_host_channel<C>,
                    "any_communicator: this backend moves neither this memory space nor host memory "
                    "through a host() channel");
      return backend.host();
    }
  }
  template <class C, class T, class Space>
  static constexpr collective_calls<T, Space> calls_for() {
    return {
        [](void* c, span_in<const T, Space> s, span_in<T, Space> r) {
          return mover<T, Space>(*static_cast<C*>(c)).template iall_gather<T, Space>(s, r);
        },
        [](void* c, std::span<const gather_part<T, Space>> parts) {
          return comm::iall_gather_parts<T, Space>(mover<T, Space>(*static_cast<C*>(c)), parts);
        },
        [](void* c, span_in<const T, Space> s, span_in<T, Space> r) {
          return mover<T, Space>(*static_cast<C*>(c)).template ireduce_scatter_sum<T, Space>(s, r);
        },
        [](void* c, span_in<const T, Space> s, span_in<T, Space> r, scale_type<T> factor) {
          return comm::ireduce_scatter_sum<T, Space>(mover<T, Space>(*static_cast<C*>(c)), s, r, factor);
        },
        [](void* c, std::span<const reduce_scatter_part<T, Space>> parts, scale_type<T> factor) {
          return comm::ireduce_scatter_sum_parts<T, Space>(mover<T, Space>(*static_cast<C*>(c)), parts, factor);
        },
        [](void* c, span_in<T, Space> d, int root) {
          return mover<T, Space>(*static_cast<C*>(c)).template ibroadcast<T, Space>(d, root);
        },
        [](void* c, span_in<T, Space> d) {
          return mover<T, Space>(*static_cast<C*>(c)).template iall_reduce_sum<T, Space>(d);
        },
        [](void* c, span_in<const T, Space> s, span_in<T, Space> r) {
          return mover<T, Space>(*static_cast<C*>(c)).template iall_to_all<T, Space>(s, r);
        },
    };
  }
  // C itself when it is `wanted`, else what it runs over (threaded's backend(), host()), searched alike.
  template <class C>
  static void* find_in(C& backend, const std::type_info& wanted) noexcept {
    if (typeid(C) == wanted) return &backend;
    if constexpr (requires { backend.backend(); }) {
      if (void* found = find_in(backend.backend(), wanted)) return found;
    }
    if constexpr (has_host_channel<C>) {
      if (void* found = find_in(backend.host(), wanted)) return found;
    }
    return nullptr;
  }
  template <class C, class... Spaces>
  static constexpr carried_calls all_calls_for(space_list<Spaces...>) {
    return {calls_for<C, float, Spaces>()..., calls_for<C, double, Spaces>()...,
            calls_for<C, bf16, Spaces>()..., calls_for<C, f16, Spaces>()...};
  }
  template <class C>
  static constexpr operation_table table_for = {
      [](const void* c) { return static_cast<const C*>(c)->rank(); },
      [](const void* c) { return static_cast<const C*>(c)->size(); },
      [](void* c) { static_cast<C*>(c)->barrier(); },
      [](void* c, std::uint64_t value) { return kfsdp::comm::range_over_ranks(*static_cast<C*>(c), value); },
      [](void* c, const Kokkos::DefaultExecutionSpace& compute) { comm::order_after(*static_cast<C*>(c), compute); },
      [](void* c, std::size_t bytes) { return comm::allocate_shared(*static_cast<C*>(c), bytes); },
      [](void* c, const std::type_info& wanted) { return find_in(*static_cast<C*>(c), wanted); },
      all_calls_for<C>(carried_spaces{}),
  };

  template <class T, class Space>
  [[nodiscard]] const collective_calls<T, Space>& calls() const {
    return std::get<collective_calls<T, Space>>(table_->collectives);
  }

  void* backend_;
  const operation_table* table_;
};

}  // namespace kfsdp::comm
