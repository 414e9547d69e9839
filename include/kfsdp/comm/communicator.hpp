#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::comm — the communicator concept, the non-blocking request, and agreement over ranks
// (range_over_ranks and check_agreement, any_rank, first_rank_with built on it).
//
// Backend-free: this header never includes mpi.h, nccl.h or CUDA headers. The backends are
// opt-in headers in folders beside it: self/self.hpp (one rank), mpi/mpi.hpp (MPI), nccl/nccl.hpp
// (NCCL, over MPI), threaded/threaded.hpp (any of them on a worker thread).
//
//   template <kfsdp::comm::communicator C>
//   void gather_bucket(C& comm, std::span<const float> shard, std::span<float> full) {
//     kfsdp::comm::request pending = comm.iall_gather(shard, full);  // [rank 0 | rank 1 | ...]
//     ...                                                            // overlap: compute meanwhile
//     pending.wait();                                                // full is valid from here
//   }
//
// The blocking collectives are free functions over a backend's non-blocking ones, written once
// here for every backend: kfsdp::comm::all_gather(comm, shard, full) is
// comm.iall_gather(shard, full).wait(), and so are reduce_scatter_sum, broadcast,
// all_reduce_sum and all_to_all.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/meta/half.hpp>

namespace Kokkos {
class HostSpace;  // named, not included: a host span's memory space
}  // namespace Kokkos

namespace kfsdp::comm {

// ---------------------------------------------------------------------------------------------
// Memory spaces. A buffer that crosses a communicator says where its bytes are: a span_in<T, Space>
// is a span of T in the Kokkos memory space Space (Kokkos::HostSpace, Kokkos::CudaSpace, ...), so
// that a backend knows whether the host may touch them and which execution space runs the
// arithmetic of a collective (the ring's adds). A plain std::span<T> is host memory: every backend
// takes it as a span_in<T, Kokkos::HostSpace>.
//
//   Kokkos::View<float*> shard("shard", n), full("full", n * comm.size());   // the default space
//   comm.iall_gather(kfsdp::comm::span_in(shard), kfsdp::comm::span_in(full)).wait();
//   // or, for host memory:  comm.iall_gather(std::span<const float>(v), std::span<float>(w))
//
// The raw span (span()) is for MPI and NCCL calls and for Kokkos kernels in MemorySpace only.
KFSDP_EXPORT template <class T, class MemorySpace>
class span_in {
 public:
  using element_type = T;
  using memory_space = MemorySpace;

  constexpr span_in() noexcept = default;
  constexpr explicit span_in(std::span<T> elements) noexcept : elements_(elements) {}
  constexpr span_in(T* data, std::size_t size) noexcept : elements_(data, size) {}
  // From a flat Kokkos view (or anything with data(), extent(0) and memory_space): its space.
  template <class View>
    requires requires(const View& v) {
      { v.data() } -> std::convertible_to<T*>;
      v.extent(0);
      requires std::same_as<typename View::memory_space, MemorySpace>;
    }
  constexpr explicit span_in(const View& view) noexcept
      : elements_(view.data(), static_cast<std::size_t>(view.extent(0))) {}
  // span_in<T, S> converts to span_in<const T, S>, never to another memory space.
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr span_in(span_in<U, MemorySpace> other) noexcept  // NOLINT: implicit, as std::span's
      : elements_(other.span()) {}

  [[nodiscard]] constexpr std::span<T> span() const noexcept { return elements_; }
  [[nodiscard]] constexpr T* data() const noexcept { return elements_.data(); }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return elements_.size(); }
  [[nodiscard]] constexpr std::size_t size_bytes() const noexcept { return elements_.size_bytes(); }
  [[nodiscard]] constexpr bool empty() const noexcept { return elements_.empty(); }
  [[nodiscard]] constexpr span_in subspan(std::size_t offset, std::size_t count) const {
    return span_in(elements_.subspan(offset, count));
  }

 private:
  std::span<T> elements_;
};
template <class View>
span_in(const View&) -> span_in<std::remove_pointer_t<decltype(std::declval<const View&>().data())>,
                                typename View::memory_space>;

// Host memory, as the std::span forms of every backend take it.
template <class T>
using host_span = span_in<T, Kokkos::HostSpace>;

// ---------------------------------------------------------------------------------------------
// Element types. Every backend moves (gathers, scatters, broadcasts and sums) all of element<T>;
// it also takes the max and min of ordered_element<T>: float and double for parameters and
// gradients, std::int64_t and std::uint64_t for counts and agreement fingerprints.
template <class T>
concept ordered_element = std::same_as<T, float> || std::same_as<T, double> ||
                          std::same_as<T, std::int64_t> || std::same_as<T, std::uint64_t>;

// The 16-bit floats kfsdp::bf16 and kfsdp::f16 (meta/half.hpp), moved and summed but not compared:
// a sum adds two values in float and rounds the result to the 16-bit format once per addition,
// as MPI's reduction tree and the ring do, so a sum over n ranks rounds n-1 times.
template <class T>
concept half_element = std::same_as<T, bf16> || std::same_as<T, f16>;

template <class T>
concept element = ordered_element<T> || half_element<T>;

// ---------------------------------------------------------------------------------------------
// What a backend puts behind a request: test() polls (true once the operation is complete and its
// buffers may be touched), wait() blocks until then. Both may throw on a communication error.
template <class State>
concept request_state = std::move_constructible<State> && requires(State& state) {
  { state.test() } -> std::same_as<bool>;
  state.wait();
};

// A compute queue to order work against: the native handle of an execution-space instance's stream
// (a cudaStream_t for Kokkos::Cuda, a hipStream_t for Kokkos::HIP), or null for a host instance,
// whose kernels are complete when they return. comm::stream_of(instance) (stream_order.hpp) makes one.
struct native_stream {
  void* handle = nullptr;
};

// What a backend that orders streams adds to its request state: complete_before(stream) makes work
// issued on the stream afterwards wait for the operation, without blocking the host where it can
// (a null stream: it waits as wait() does).
template <class State>
concept orders_streams = requires(State& state, native_stream stream) { state.complete_before(stream); };

namespace detail {
// Whether the waits made on this thread yield its CPU between their tests from the start: set by
// a thread that shares its core with the caller's compute (threaded's worker), so that a backend
// polling a collective does not hold the core the compute needs.
inline thread_local bool waits_yield_on_this_thread = false;

// test() and wait() of a request state that has one step more once the operation it holds
// completes (copy a result out, multiply it, unpack it): Derived gives awaited(), that operation,
// and finish(), the step, which runs once.
//   struct staged : detail::finished_on_completion<staged> {
//     request on_host;
//     request& awaited() { return on_host; }
//     void finish() { copy_out(); }
//   };
// The operations that failed while they may still be in flight (a collective that timed out while a
// peer may yet join it): their states, and every buffer a state owns, are kept until the process
// ends instead of freed, so that a late peer's data never lands in memory handed back. Reachable,
// so LeakSanitizer does not count them. Only a failure adds one.
struct abandoned_operations {
  std::mutex lock;
  std::vector<std::shared_ptr<void>> states;
};
inline abandoned_operations& abandoned() {
  static abandoned_operations* kept = new abandoned_operations;  // never destroyed: MPI may write until exit
  return *kept;
}
// Set once an operation is abandoned: a request destroyed while that failure unwinds keeps its
// operation too, instead of waiting on it again (a second full timeout on every unit in flight).
inline std::atomic<bool> operations_abandoned{false};
inline void abandon(void* state, void (*destroy)(void*) noexcept) {
  abandoned_operations& kept = abandoned();
  const std::lock_guard<std::mutex> guard(kept.lock);
  kept.states.emplace_back(state, destroy);
  operations_abandoned.store(true, std::memory_order_relaxed);
}

template <class Derived>
struct finished_on_completion {
  bool test() {
    Derived& self = static_cast<Derived&>(*this);
    if (!self.awaited().test()) return false;
    self.finish();
    return true;
  }
  void wait() {
    Derived& self = static_cast<Derived&>(*this);
    self.awaited().wait();
    self.finish();
  }
};
}  // namespace detail

// A type-erased handle on one non-blocking collective.
//
// Move-only. An empty request (default-constructed, waited on, or moved from) counts as complete:
// wait() and test() on it are fine. The destructor waits, so no buffer is ever left in flight
// behind a forgotten request; an error found there cannot be thrown and is printed to stderr
// instead, so call wait() yourself where the error matters. An operation whose wait or test throws
// (a timeout) is abandoned, not freed: its state and the buffers it owns live until the process
// ends, and a request destroyed while such a failure unwinds abandons its operation too instead of
// waiting on it. Buffers the caller passed to a non-blocking call stay the caller's to keep alive.
//
//   kfsdp::comm::request pending = comm.iall_reduce_sum(std::span(gradient));
//   while (!pending.test()) do_other_work();   // or simply pending.wait();
class request {
 public:
  request() noexcept = default;

  // The not-a-request test comes first: checking request_state<request> would recurse.
  template <class State>
    requires(!std::same_as<std::remove_cvref_t<State>, request>) && request_state<State>
  explicit request(State state)
      : state_(new State(std::move(state))), table_(&table_for<State>) {}

  request(request&& other) noexcept
      : state_(std::exchange(other.state_, nullptr)),
        table_(std::exchange(other.table_, nullptr)) {}
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish_in_destructor();  // the request being replaced must not leave its buffers in flight
      state_ = std::exchange(other.state_, nullptr);
      table_ = std::exchange(other.table_, nullptr);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish_in_destructor(); }

  // Blocks until the operation is complete; afterwards the request is empty.
  void wait() {
    if (state_ == nullptr) return;
    const detached finishing = detach();  // destroyed, or abandoned, however wait() ends: never waited on twice
    finishing.table->wait(finishing.state);
  }

  // True when the operation is complete (the request is then empty); never blocks.
  [[nodiscard]] bool test() {
    if (state_ == nullptr) return true;
    detached testing = detach();  // abandoned if the test throws (MPI may still hold its buffers), as in wait()
    if (testing.table->test(testing.state)) return true;
    table_ = testing.table;  // still in flight: the request keeps it
    state_ = std::exchange(testing.state, nullptr);
    return false;
  }

  // Work issued on `stream` after this call starts only once the operation is complete; afterwards
  // the request is empty. A backend that orders streams (nccl) makes the stream wait on the
  // operation's event and the host does not block; for any other (and a null stream) this is wait().
  //
  //   pending.complete_before(kfsdp::comm::stream_of(compute));   // compute: an execution-space instance
  //   Kokkos::parallel_for(Kokkos::RangePolicy(compute, 0, n), reads_recv);   // runs after the collective
  void complete_before(native_stream stream) {
    if (state_ == nullptr) return;
    const detached finishing = detach();  // destroyed however it ends, as in wait()
    finishing.table->complete_before(finishing.state, stream);
  }

  // True while an operation is attached and has not been seen to complete.
  [[nodiscard]] bool in_flight() const noexcept { return state_ != nullptr; }

 private:
  // A hand-written vtable, one static table per State type (no virtual calls for the compiler
  // to devirtualise speculatively).
  struct operation_table {
    bool (*test)(void* state);
    void (*wait)(void* state);
    void (*destroy)(void* state) noexcept;
    void (*complete_before)(void* state, native_stream stream);  // wait() where State orders no stream
  };
  template <class State>
  static constexpr operation_table table_for = {
      [](void* state) -> bool { return static_cast<State*>(state)->test(); },
      [](void* state) { static_cast<State*>(state)->wait(); },
      [](void* state) noexcept { delete static_cast<State*>(state); },
      [](void* state, native_stream stream) {
        if constexpr (orders_streams<State>) static_cast<State*>(state)->complete_before(stream);
        else static_cast<State*>(state)->wait();
      },
  };

  // An operation taken out of the request; its state is destroyed with it, or abandoned
  // (detail::abandon) when it leaves by an exception or is abandoned by hand.
  struct detached {
    void* state;
    const operation_table* table;
    int exceptions_before = std::uncaught_exceptions();
    detached(void* taken_state, const operation_table* taken_table) noexcept
        : state(taken_state), table(taken_table) {}
    detached(const detached&) = delete;
    detached& operator=(const detached&) = delete;
    void abandon() noexcept {
      if (state != nullptr) detail::abandon(std::exchange(state, nullptr), table->destroy);
    }
    ~detached() {
      if (state == nullptr) return;
      if (std::uncaught_exceptions() > exceptions_before) abandon();  // its wait threw
      else table->destroy(state);
    }
  };
  detached detach() noexcept {
    return {std::exchange(state_, nullptr), std::exchange(table_, nullptr)};
  }

  void finish_in_destructor() noexcept {
    // Unwinding a failure that abandoned an operation: this one may wait on the same lost peer.
    if (state_ != nullptr && std::uncaught_exceptions() > 0 &&
        detail::operations_abandoned.load(std::memory_order_relaxed))
      return detach().abandon();
    try {
      wait();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "kfsdp::comm::request: error while waiting in the destructor: %s\n",
                   error.what());
    } catch (...) {
      std::fprintf(stderr,
                   "kfsdp::comm::request: unknown error while waiting in the destructor\n");
    }
  }

  void* state_ = nullptr;
  const operation_table* table_ = nullptr;
};

// Waits on every request of a batch, in order (e.g. all the bucket all-gathers of one step).
inline void wait_all(std::span<request> requests) {
  for (request& pending : requests) pending.wait();
}

// One request for several (e.g. one all-gather per parameter of a bucket): complete once all are.
// test() tests every part, so each backend's progress runs for all of them; wait() waits in order.
//
//   std::vector<kfsdp::comm::request> parts;
//   for (auto [send, recv] : pieces) parts.push_back(comm.iall_gather(send, recv));
//   kfsdp::comm::request bucket = kfsdp::comm::when_all(std::move(parts));
[[nodiscard]] inline request when_all(std::vector<request> parts) {
  if (parts.size() == 1) return std::move(parts.front());
  struct all_of {
    std::vector<request> parts;
    bool test() {
      bool complete = true;
      for (request& part : parts) complete = part.test() && complete;
      return complete;
    }
    void wait() { wait_all(parts); }
    void complete_before(native_stream stream) {
      for (request& part : parts) part.complete_before(stream);
    }
  };
  return request(all_of{std::move(parts)});
}

// ---------------------------------------------------------------------------------------------
// The communicator concept, as a conjunction of small named concepts.
//
// A type C models communicator when, for a value `c` of type C:
//  1. c.rank() and c.size() return int, 0 <= rank() < size(), and they never change.
//  2. c.iall_gather(send, recv) with send: span<const T>, recv: span<T> needs
//     recv.size() == size()*send.size(); once its request completes, recv = [rank 0's send |
//     rank 1's | ...]. send may alias recv only in place: send.data() == recv.data() +
//     rank()*send.size().
//  3. c.ireduce_scatter_sum(send, recv) needs send.size() == size()*recv.size(); once its request
//     completes, rank r's recv[i] = sum over ranks of send[r*recv.size() + i]. send and recv must
//     not overlap. A backend may also take a factor, c.ireduce_scatter_sum(send, recv, factor):
//     recv[i] = that sum · factor (comm::scales_reduce_scatter in batched_collectives.hpp, whose free
//     ireduce_scatter_sum(c, send, recv, factor) multiplies after any other backend's).
//  4. c.ibroadcast(data, root) needs 0 <= root < size(); once its request completes, every rank's
//     data equals root's.
//  5. c.iall_reduce_sum(data) sums data in place over ranks, element by element, once its request
//     completes.
//  6. 2-5 return a request; the buffers belong to the communicator until that request completes.
//     The blocking all_gather, reduce_scatter_sum, broadcast and all_reduce_sum below are these
//     followed by wait(); a backend does not write them.
//  7. c.all_reduce_max(data) / c.all_reduce_min(data) take the element-wise max / min in place
//     (blocking: agreement checks need nothing else).
//  8. c.barrier() returns on a rank only once every rank has called it.
//  9. Collectives are collective: every rank calls the same ones, in the same order, with the same
//     sizes and root. (check_agreement below turns a mismatch into an error instead of a hang.)
// 10. Bad arguments (a span of the wrong size, a root out of range, a forbidden overlap) throw
//     std::invalid_argument before any communication; the message names the function (the
//     i-prefixed one, also when reached through a blocking free function), the parameter, the
//     size seen and the size expected. Communication errors throw std::runtime_error (or a type
//     derived from it).
// 11. c.iall_to_all(send, recv) needs send.size() == recv.size(), a multiple of size(); with
//     n = send.size() / size(), once its request completes rank r's recv[s*n + i] = rank s's
//     send[r*n + i] (block r of every rank's send goes to rank r). send and recv must not
//     overlap. It returns a request as 2-5 do (6). (int8 gradient reduction: every rank sends each
//     rank its quantized chunk.)
// 2-6 and 11 hold for T = float, double, bf16 and f16; 7 for T = std::int64_t and std::uint64_t
// (agreement checks). A backend may offer more element types (every backend here offers 2-6 and
// 11 for all of element<T>, and 7 for all of ordered_element<T>). The std::span forms are host
// memory; 2-6 and 11 on span_in<T, Space> are communicator_in<C, Space> below. For device memory
// "completes" means the request's wait() or test() has returned it complete.

// 1.
template <class C>
concept ranked = requires(const C& c) {
  { c.rank() } -> std::same_as<int>;
  { c.size() } -> std::same_as<int>;
};

// 2 and 6.
template <class C, class T>
concept gathers = requires(C& c, std::span<const T> send, std::span<T> recv) {
  { c.iall_gather(send, recv) } -> std::same_as<request>;
};

// 3 and 6.
template <class C, class T>
concept reduce_scatters = requires(C& c, std::span<const T> send, std::span<T> recv) {
  { c.ireduce_scatter_sum(send, recv) } -> std::same_as<request>;
};

// 4 and 6.
template <class C, class T>
concept broadcasts = requires(C& c, std::span<T> data, int root) {
  { c.ibroadcast(data, root) } -> std::same_as<request>;
};

// 5 and 6.
template <class C, class T>
concept all_reduces = requires(C& c, std::span<T> data) {
  { c.iall_reduce_sum(data) } -> std::same_as<request>;
};

// 7.
template <class C, class T>
concept reduces_extrema = requires(C& c, std::span<T> data) {
  c.all_reduce_max(data);
  c.all_reduce_min(data);
};

// 8.
template <class C>
concept synchronises = requires(C& c) { c.barrier(); };

// 11.
template <class C, class T>
concept exchanges = requires(C& c, std::span<const T> send, std::span<T> recv) {
  { c.iall_to_all(send, recv) } -> std::same_as<request>;
};

// 2-6 and 11 for one element type.
template <class C, class T>
concept moves_elements = gathers<C, T> && reduce_scatters<C, T> && broadcasts<C, T> &&
                         all_reduces<C, T> && exchanges<C, T>;

KFSDP_EXPORT template <class C>
concept communicator = ranked<C> && synchronises<C> && moves_elements<C, float> &&
                       moves_elements<C, double> && moves_elements<C, bf16> &&
                       moves_elements<C, f16> && reduces_extrema<C, std::int64_t> &&
                       reduces_extrema<C, std::uint64_t>;

// 2-6 on buffers of one memory space (span_in<T, Space>, see above). mpi, self and threaded move
// every memory space (device memory through MPI either directly, when MPI is CUDA-aware, or staged
// through host buffers), nccl device memory; communicator<C> is communicator_in<C, Kokkos::HostSpace>
// spelled with std::span.
template <class C, class T, class Space>
concept moves_elements_in =
    requires(C& c, span_in<const T, Space> send, span_in<T, Space> recv, int root) {
      { c.iall_gather(send, recv) } -> std::same_as<request>;
      { c.ireduce_scatter_sum(send, recv) } -> std::same_as<request>;
      { c.ibroadcast(recv, root) } -> std::same_as<request>;
      { c.iall_reduce_sum(recv) } -> std::same_as<request>;
      { c.iall_to_all(send, recv) } -> std::same_as<request>;
    };

template <class C, class Space>
concept communicator_in = ranked<C> && synchronises<C> && moves_elements_in<C, float, Space> &&
                          moves_elements_in<C, double, Space> && moves_elements_in<C, bf16, Space> &&
                          moves_elements_in<C, f16, Space>;

// ---------------------------------------------------------------------------------------------
// The blocking collectives: a backend's non-blocking one, waited on. send is a non-deduced
// parameter, so a std::vector or a span of mutable data converts.
//
//   kfsdp::comm::all_gather(comm, shard, std::span(full));   // = comm.iall_gather(...).wait()

// On host memory (std::span) of up to own_copy_max_bytes they run on copies that their request
// owns and copy the result out once complete: an operation abandoned by a timeout (request) keeps
// its copies, so a late peer never writes into the caller's frame after it has returned. A copy
// costs far less than the collective at those sizes (a loss, a norm, a count: what a frame holds);
// larger buffers (heap memory, a parameter) go to the backend as they are, unchecked copies of
// gigabytes being worse than the risk, and a program under session::run ends at once after a timeout.
namespace detail {
inline constexpr std::size_t own_copy_max_bytes = std::size_t(256) << 10;
template <class T>
struct on_own_copy : finished_on_completion<on_own_copy<T>> {
  std::vector<T> send, recv;  // what the backend reads and writes
  std::span<T> result;        // the caller's, written once the operation completes
  request operation;
  request& awaited() { return operation; }
  void finish() { std::copy(recv.begin(), recv.end(), result.begin()); }
};
// start(send copy, recv copy) -> request, waited on; `recv`'s elements are copied in first when
// `in_place` (broadcast, all-reduce), and the result copied out into `recv`.
template <class T, class Start>
void wait_on_own_copy(std::span<const T> send, std::span<T> recv, bool in_place, Start&& start) {
  if (send.size_bytes() + recv.size_bytes() > own_copy_max_bytes) return start(send, recv).wait();
  on_own_copy<T> state;
  state.result = recv;
  // Overlapping buffers (an in-place all-gather, or an overlap the backend refuses) go as they are,
  // so that the backend checks them before anything is read.
  const std::less<const T*> before;
  if (!send.empty() && !recv.empty() && before(send.data(), recv.data() + recv.size()) &&
      before(recv.data(), send.data() + send.size()))
    return start(send, recv).wait();
  state.send.assign(send.begin(), send.end());
  if (in_place) state.recv.assign(recv.begin(), recv.end());
  else state.recv.resize(recv.size());
  const std::span<const T> send_copy(state.send);
  const std::span<T> recv_copy(state.recv);
  state.operation = start(send_copy, recv_copy);  // moving the state keeps the vectors' heap buffers
  request(std::move(state)).wait();
}
}  // namespace detail

// Requirement 2: recv = [rank 0's send | rank 1's | ...].
KFSDP_EXPORT template <class C, element T>
  requires gathers<C, T>
void all_gather(C& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
  detail::wait_on_own_copy<T>(send, recv, false, [&](std::span<const T> in, std::span<T> out) {
    return comm.template iall_gather<T>(in, out);
  });
}

// Requirement 3: rank r's recv[i] = sum over ranks of send[r*recv.size() + i].
template <class C, element T>
  requires reduce_scatters<C, T>
void reduce_scatter_sum(C& comm, std::span<const std::type_identity_t<T>> send,
                        std::span<T> recv) {
  detail::wait_on_own_copy<T>(send, recv, false, [&](std::span<const T> in, std::span<T> out) {
    return comm.template ireduce_scatter_sum<T>(in, out);
  });
}

// Requirement 4: every rank's data becomes root's.
template <class C, element T>
  requires broadcasts<C, T>
void broadcast(C& comm, std::span<T> data, int root) {
  detail::wait_on_own_copy<T>({}, data, true, [&](std::span<const T>, std::span<T> copy) {
    return comm.template ibroadcast<T>(copy, root);
  });
}

// Requirement 5: data summed in place over ranks.
KFSDP_EXPORT template <class C, element T>
  requires all_reduces<C, T>
void all_reduce_sum(C& comm, std::span<T> data) {
  detail::wait_on_own_copy<T>({}, data, true, [&](std::span<const T>, std::span<T> copy) {
    return comm.template iall_reduce_sum<T>(copy);
  });
}

// Requirement 11: rank r's recv block s = rank s's send block r.
template <class C, element T>
  requires exchanges<C, T>
void all_to_all(C& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
  detail::wait_on_own_copy<T>(send, recv, false, [&](std::span<const T> in, std::span<T> out) {
    return comm.template iall_to_all<T>(in, out);
  });
}

// The same on buffers of a memory space.
KFSDP_EXPORT template <class C, element T, class Space>
  requires moves_elements_in<C, T, Space>
void all_gather(C& comm, std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
  comm.iall_gather(send, recv).wait();
}
template <class C, element T, class Space>
  requires moves_elements_in<C, T, Space>
void reduce_scatter_sum(C& comm, std::type_identity_t<span_in<const T, Space>> send,
                        span_in<T, Space> recv) {
  comm.ireduce_scatter_sum(send, recv).wait();
}
template <class C, element T, class Space>
  requires moves_elements_in<C, T, Space>
void broadcast(C& comm, span_in<T, Space> data, int root) {
  comm.ibroadcast(data, root).wait();
}
KFSDP_EXPORT template <class C, element T, class Space>
  requires moves_elements_in<C, T, Space>
void all_reduce_sum(C& comm, span_in<T, Space> data) {
  comm.iall_reduce_sum(data).wait();
}
template <class C, element T, class Space>
  requires moves_elements_in<C, T, Space>
void all_to_all(C& comm, std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
  comm.iall_to_all(send, recv).wait();
}

// A device backend (NCCL) whose collectives move device memory also offers host(): a communicator over
// the same ranks for small host-memory values, which check_agreement uses.
template <class C>
concept has_host_channel = requires(C& c) {
  requires communicator<std::remove_cvref_t<decltype(c.host())>>;
};

// ---------------------------------------------------------------------------------------------
// Agreement over ranks: one primitive, range_over_ranks, and what is built on it. Every one is
// collective (every rank calls it) and costs one all_reduce_max of two 64-bit words (on the host
// channel of a device backend). check_agreement compares a value, any_rank a flag, first_rank_with
// names the lowest rank that raised one (how the checkpoints agree on an error).

// The lowest and highest of `value` over the ranks: one all_reduce_max of {v, ~v} gives max(v) and ~min(v).
struct value_range {
  std::uint64_t lowest = 0;
  std::uint64_t highest = 0;
};

// A backend that provides the primitive itself (any_communicator: one virtual call for it).
template <class C>
concept has_range_over_ranks = requires(C& c, std::uint64_t v) {
  { c.range_over_ranks(v) } -> std::same_as<value_range>;
};

template <class C>
concept agrees = has_range_over_ranks<C> || communicator<C> || has_host_channel<C>;

template <agrees C>
value_range range_over_ranks(C& comm, std::uint64_t value) {
  if constexpr (has_range_over_ranks<C>) {
    return comm.range_over_ranks(value);
  } else if constexpr (has_host_channel<C>) {
    return range_over_ranks(comm.host(), value);
  } else {
    std::uint64_t max_and_complement_of_min[2] = {value, ~value};
    comm.all_reduce_max(std::span<std::uint64_t>(max_and_complement_of_min));
    return {~max_and_complement_of_min[1], max_and_complement_of_min[0]};
  }
}

// Throws std::runtime_error on EVERY rank when the ranks' fingerprints of `what` differ, so a
// mismatched plan is reported up front instead of hanging in a collective of mismatched size.
//
//   kfsdp::comm::check_agreement(comm, plan_fingerprint, "the shard plan");
//   // rank 1 of 2: "ranks disagree on the shard plan: fingerprints range from 0x1f to 0x2a;
//   //               this rank (1 of 2) has 0x2a"
KFSDP_EXPORT template <agrees C>
void check_agreement(C& comm, std::uint64_t fingerprint, std::string_view what) {
  const value_range range = range_over_ranks(comm, fingerprint);
  if (range.lowest != range.highest) {
    throw std::runtime_error(fmt::format(
        "ranks disagree on {}: fingerprints range from {:#x} to {:#x}; this rank ({} of {}) has "
        "{:#x}",
        what, range.lowest, range.highest, comm.rank(), comm.size(), fingerprint));
  }
}

// True on every rank when any rank passed true (e.g. "this rank failed").
template <agrees C>
[[nodiscard]] bool any_rank(C& comm, bool flag) {
  return range_over_ranks(comm, flag ? 1 : 0).highest != 0;
}

// The lowest rank that passed true, the same on every rank; size() when none did.
template <agrees C>
[[nodiscard]] int first_rank_with(C& comm, bool flag) {
  const std::uint64_t size = static_cast<std::uint64_t>(comm.size());
  return static_cast<int>(range_over_ranks(comm, flag ? static_cast<std::uint64_t>(comm.rank()) : size).lowest);
}

}  // namespace kfsdp::comm
