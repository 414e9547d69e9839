#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// threaded<C> — runs every collective of a communicator on one worker thread, in the order they
// were issued, so that a non-blocking collective progresses while the caller computes. MPI
// libraries progress a non-blocking collective only inside MPI calls; with the calls made by a
// thread of their own, the next bucket's all-gather really overlaps the current bucket's compute.
//
// Only the worker calls the backend (from its first collective on; with one rank only the caller), so MPI needs
// MPI_THREAD_SERIALIZED (or MULTIPLE): kfsdp::comm::mpi::environment env(argc, argv, MPI_THREAD_SERIALIZED).
//
//   kfsdp::comm::mpi world;
//   kfsdp::comm::threaded overlapped(world);      // a communicator too
//   auto pending = overlapped.iall_gather(shard, full);
//   compute();                                   // the all-gather runs meanwhile
//   pending.wait();

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/batched_collectives.hpp>
#include <kfsdp/comm/memory_space.hpp>
#include <kfsdp/comm/shared_memory.hpp>

namespace kfsdp::comm {

KFSDP_EXPORT template <class C>
class threaded {
 public:
  explicit threaded(C& backend) : backend_(backend), worker_([this] { serve(); }) {}
  threaded(const threaded&) = delete;
  threaded& operator=(const threaded&) = delete;
  ~threaded() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();  // runs what was queued first: no collective is left half-issued
  }

  [[nodiscard]] int rank() const { return backend_.rank(); }
  [[nodiscard]] int size() const { return backend_.size(); }
  [[nodiscard]] C& backend() noexcept { return backend_; }

  void barrier() { submit([this] { backend_.barrier(); }).wait(); }

  // Memory the backend's ranks read in place (comm::allocate_shared), made on the worker and freed
  // there too: the worker must still run (this communicator alive) when the last owner goes.
  [[nodiscard]] shared_bytes allocate_shared(std::size_t bytes)
    requires shares_memory<C>
  {
    shared_bytes made;
    submit([this, &made, bytes] { made = backend_.allocate_shared(bytes); }).wait();
    if (made.owner == nullptr) return made;
    void* const owned = made.owner.get();  // kept, so that the owner still reads as non-null
    made.owner = std::shared_ptr<void>(owned, [this, backend_owner = std::move(made.owner)](void*) mutable {
      // Unwinding, the backend leaves the memory to MPI's end without a call here (its peers may be anywhere).
      if (std::uncaught_exceptions() > 0) return backend_owner.reset();
      submit([owner = std::move(backend_owner)]() mutable { owner.reset(); }).wait();
    });
    return made;
  }

  // Arguments are checked here, on the caller's thread, not later on the worker. The worker runs
  // the backend's blocking form (comm::all_gather etc.) on the same memory space; a bf16 or f16 sum
  // is the backend's.
  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request iall_gather(std::type_identity_t<span_in<const T, Space>> send,
                                    span_in<T, Space> recv) {
    detail::check_all_gather<T>("kfsdp::comm::threaded::iall_gather", rank(), size(), send.span(), recv.span());
    return submit([this, send, recv] { comm::all_gather<C, T, Space>(backend_, send, recv); });
  }
  // A batch of all-gathers as one task: the backend's batch where it has one (iall_gather_parts).
  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request iall_gather_parts(std::span<const gather_part<T, Space>> parts) {
    detail::check_all_gather_parts("kfsdp::comm::threaded::iall_gather_parts", rank(), size(), parts);
    return submit([this, batch = std::vector<gather_part<T, Space>>(parts.begin(), parts.end())] {
      comm::iall_gather_parts<T, Space>(backend_, std::span<const gather_part<T, Space>>(batch)).wait();
    });
  }
  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv) {
    detail::check_reduce_scatter<T>("kfsdp::comm::threaded::ireduce_scatter_sum", size(), send.span(),
                                    recv.span());
    return submit([this, send, recv] { comm::reduce_scatter_sum<C, T, Space>(backend_, send, recv); });
  }
  // sums · factor, folded in by the backend where it can (comm::ireduce_scatter_sum with a factor).
  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv, std::type_identity_t<scale_type<T>> factor) {
    detail::check_reduce_scatter<T>("kfsdp::comm::threaded::ireduce_scatter_sum", size(), send.span(),
                                    recv.span());
    return submit([this, send, recv, factor] {
      comm::ireduce_scatter_sum<T, Space>(backend_, send, recv, factor).wait();
    });
  }
  // A batch of reduce-scatters as one task: the backend's batch where it has one.
  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request ireduce_scatter_sum_parts(std::span<const reduce_scatter_part<T, Space>> parts,
                                                  std::type_identity_t<scale_type<T>> factor = scale_type<T>(1)) {
    detail::check_reduce_scatter_parts("kfsdp::comm::threaded::ireduce_scatter_sum_parts", size(), parts);
    return submit([this, batch = std::vector<reduce_scatter_part<T, Space>>(parts.begin(), parts.end()), factor] {
      comm::ireduce_scatter_sum_parts<T, Space>(backend_, std::span<const reduce_scatter_part<T, Space>>(batch), factor)
          .wait();
    });
  }
  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request ibroadcast(span_in<T, Space> data, int root) {
    detail::check_root("kfsdp::comm::threaded::ibroadcast", root, size());
    return submit([this, data, root] { comm::broadcast<C, T, Space>(backend_, data, root); });
  }
  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request iall_reduce_sum(span_in<T, Space> data) {
    return submit([this, data] { comm::all_reduce_sum<C, T, Space>(backend_, data); });
  }

  template <element T, class Space>
    requires moves_elements_in<C, T, Space>
  [[nodiscard]] request iall_to_all(std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
    detail::check_all_to_all<T>("kfsdp::comm::threaded::iall_to_all", size(), send.span(), recv.span());
    return submit([this, send, recv] { comm::all_to_all<C, T, Space>(backend_, send, recv); });
  }

  // Host memory (std::span), as the backend takes it (a backend may have only these forms).
  template <element T>
  [[nodiscard]] request iall_gather(std::span<const std::type_identity_t<T>> send,
                                    std::span<T> recv) {
    detail::check_all_gather<T>("kfsdp::comm::threaded::iall_gather", rank(), size(), send, recv);
    return submit([this, send, recv] { comm::all_gather<C, T>(backend_, send, recv); });
  }
  template <element T>
  [[nodiscard]] request ireduce_scatter_sum(std::span<const std::type_identity_t<T>> send,
                                            std::span<T> recv) {
    detail::check_reduce_scatter<T>("kfsdp::comm::threaded::ireduce_scatter_sum", size(), send, recv);
    return submit([this, send, recv] { comm::reduce_scatter_sum<C, T>(backend_, send, recv); });
  }
  template <element T>
  [[nodiscard]] request ibroadcast(std::span<T> data, int root) {
    detail::check_root("kfsdp::comm::threaded::ibroadcast", root, size());
    return submit([this, data, root] { comm::broadcast<C, T>(backend_, data, root); });
  }
  template <element T>
  [[nodiscard]] request iall_reduce_sum(std::span<T> data) {
    return submit([this, data] { comm::all_reduce_sum<C, T>(backend_, data); });
  }
  template <element T>
  [[nodiscard]] request iall_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    detail::check_all_to_all<T>("kfsdp::comm::threaded::iall_to_all", size(), send, recv);
    return submit([this, send, recv] { comm::all_to_all<C, T>(backend_, send, recv); });
  }

  template <ordered_element T>
  void all_reduce_max(std::span<T> data) {
    submit([this, data] { backend_.all_reduce_max(data); }).wait();
  }
  template <ordered_element T>
  void all_reduce_min(std::span<T> data) {
    submit([this, data] { backend_.all_reduce_min(data); }).wait();
  }

 private:
  // What a request waits on: the future of the task's promise, set by the worker when the task
  // ran (or threw). test() polls with a zero timeout; get() rethrows the task's exception.
  struct pending_task {
    std::future<void> done;
    bool test() {
      if (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
      done.get();
      return true;
    }
    void wait() { done.get(); }
  };
  struct queued_task {
    std::function<void()> work;
    std::promise<void> done;
  };

  bool single_rank() {
    if constexpr (requires { backend_.size(); })
      return backend_.size() == 1;
    else
      return false;
  }

  request submit(std::function<void()> work) {
    // One rank: a collective is a local copy with nothing to overlap, and a handoff to the worker
    // would cost two context switches; it runs at once on the caller (its error thrown by wait()).
    if (single_rank() && !uses_worker_) {
      std::promise<void> done;
      try {
        work();
        done.set_value();
      } catch (...) {
        done.set_exception(std::current_exception());
      }
      return request(pending_task{done.get_future()});
    }
    uses_worker_ = true;
    queued_task task{std::move(work), {}};
    std::future<void> done = task.done.get_future();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return request(pending_task{std::move(done)});
  }

  void serve() {
    detail::waits_yield_on_this_thread = true;  // the caller computes on the same cores meanwhile
    for (;;) {
      queued_task task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to run
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        task.work();
        task.done.set_value();
      } catch (...) {
        task.done.set_exception(std::current_exception());
      }
    }
  }

  C& backend_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<queued_task> queue_;
  bool stopping_ = false;
  bool uses_worker_ = false;  // once a task went to the worker, every later one does (their order kept)
  std::thread worker_;  // last: starts once everything it uses exists
};

}  // namespace kfsdp::comm
