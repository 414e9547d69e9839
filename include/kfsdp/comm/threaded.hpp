#pragma once
// threaded<C> — runs every collective of a communicator on one worker thread, in the order they
// were issued, so that a non-blocking collective progresses while the caller computes. MPI
// libraries progress a non-blocking collective only inside MPI calls; with the calls made by a
// thread of their own, the next bucket's all-gather really overlaps the current bucket's compute.
//
// Only the worker calls the backend (from its first collective on), so MPI needs
// MPI_THREAD_SERIALIZED (or MULTIPLE): kfsdp::comm::mpi::environment env(argc, argv, MPI_THREAD_SERIALIZED).
//
//   kfsdp::comm::mpi world;
//   kfsdp::comm::threaded overlapped(world);      // a communicator too
//   auto pending = overlapped.iall_gather(shard, full);
//   compute();                                   // the all-gather runs meanwhile
//   pending.wait();

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <type_traits>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>

namespace kfsdp::comm {

template <class C>
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

  template <element T>
  request iall_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    detail::check_all_gather<T>("kfsdp::comm::threaded::iall_gather", rank(), size(), send, recv);  // here, not later
    return submit([this, send, recv] { backend_.all_gather(send, recv); });
  }
  template <element T>
  request ireduce_scatter_sum(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    detail::check_reduce_scatter<T>("kfsdp::comm::threaded::ireduce_scatter_sum", size(), send, recv);
    return submit([this, send, recv] { backend_.reduce_scatter_sum(send, recv); });
  }
  template <element T>
  request ibroadcast(std::span<T> data, int root) {
    detail::check_root("kfsdp::comm::threaded::ibroadcast", root, size());
    return submit([this, data, root] { backend_.broadcast(data, root); });
  }
  template <element T>
  request iall_reduce_sum(std::span<T> data) {
    return submit([this, data] { backend_.all_reduce_sum(data); });
  }

  template <element T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) { iall_gather<T>(send, recv).wait(); }
  template <element T>
  void reduce_scatter_sum(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    ireduce_scatter_sum<T>(send, recv).wait();
  }
  template <element T>
  void broadcast(std::span<T> data, int root) { ibroadcast(data, root).wait(); }
  template <element T>
  void all_reduce_sum(std::span<T> data) { iall_reduce_sum(data).wait(); }
  template <element T>
  void all_reduce_max(std::span<T> data) { submit([this, data] { backend_.all_reduce_max(data); }).wait(); }
  template <element T>
  void all_reduce_min(std::span<T> data) { submit([this, data] { backend_.all_reduce_min(data); }).wait(); }

 private:
  // What a request waits on: set by the worker when the task ran (or threw).
  struct completion {
    std::mutex mutex;
    std::condition_variable done_signal;
    bool done = false;
    std::exception_ptr error;
  };
  struct pending_task {
    std::shared_ptr<completion> state;
    bool test() {
      std::lock_guard lock(state->mutex);
      if (state->done && state->error) std::rethrow_exception(state->error);
      return state->done;
    }
    void wait() {
      std::unique_lock lock(state->mutex);
      state->done_signal.wait(lock, [&] { return state->done; });
      if (state->error) std::rethrow_exception(state->error);
    }
  };

  request submit(std::function<void()> work) {
    auto state = std::make_shared<completion>();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({std::move(work), state});
    }
    wake_.notify_one();
    return request(pending_task{std::move(state)});
  }

  void serve() {
    for (;;) {
      std::pair<std::function<void()>, std::shared_ptr<completion>> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to run
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        task.first();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(task.second->mutex);
        task.second->done = true;
        task.second->error = error;
      }
      task.second->done_signal.notify_all();
    }
  }

  C& backend_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<completion>>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once everything it uses exists
};

}  // namespace kfsdp::comm
