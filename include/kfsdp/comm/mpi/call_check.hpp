#pragma once
// The checks around an MPI call of kfsdp::comm::mpi: an error code turned into mpi::error, the
// ranks' comparison of a collective before it is made (mpi::collective_mismatch, naming each rank's
// call), and the wait that gives up after mpi_options::timeout (mpi::timeout). The descriptions and
// messages are compiled into kfsdp_mpi (src/comm/mpi/mpi.cpp).
//
//   detail::check_mpi(MPI_Barrier(comm), "kfsdp::comm::mpi::barrier", "MPI_Barrier");  // throws mpi::error
//   detail::describe({collective_kind::broadcast, 4, 10, 0})  // "broadcast(10 elements of 4 bytes, root 0)"

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include <kfsdp/comm/communicator.hpp>  // detail::waits_yield_on_this_thread
#include <kfsdp/meta/half.hpp>

namespace kfsdp::comm::detail {

// MPI_Error_string's text for `code`.
std::string mpi_error_text(int code);

// An MPI call that returned an error code; what() carries MPI_Error_string's text (mpi::error).
class mpi_error : public std::runtime_error {
 public:
  mpi_error(std::string_view function, std::string_view mpi_call, int code);
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};
// Ranks that called different collectives (mpi_options::check_collectives; mpi::collective_mismatch).
class collective_mismatch : public std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A collective not complete within mpi_options::timeout (mpi::timeout).
class collective_timeout : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws mpi_error unless `code` is MPI_SUCCESS.
inline void check_mpi(int code, std::string_view function, std::string_view mpi_call) {
  if (code != MPI_SUCCESS) throw mpi_error(function, mpi_call, code);
}

// The collective_timeout that wait_polling throws.
[[noreturn]] void throw_timeout(std::string_view function, std::chrono::duration<double> limit, int rank, int size);

// How a wait on a collective waits: it gives up after `limit` (zero: never, and MPI waits), and
// between two tests yields its CPU from the start only where the node runs more of the ranks than
// it has CPUs for (node_oversubscribed), as MPI's own waits do then, or where the waiting thread
// shares its core with compute (waits_yield_on_this_thread: threaded's worker; polling there
// slowed a 2-rank GPT step by 8-12 %); elsewhere only once the wait has lasted spin_before_yield
// (a node shared with other work). A yield between tests cost a 1 MiB all-gather of four messages
// 3-4 % at 2 ranks on 2 cores.
struct wait_rule {
  std::chrono::duration<double> limit;
  bool yield = true;
  [[nodiscard]] bool timed() const noexcept { return limit.count() > 0; }
};
inline constexpr std::chrono::microseconds spin_before_yield{1000};

// Polls operation.test() until it completes; throws collective_timeout once rule.limit has passed.
template <class Operation>
void wait_polling(Operation& operation, std::string_view function, wait_rule rule, int rank, int size) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::nanoseconds>(rule.limit);
  while (!operation.test()) {
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) throw_timeout(function, rule.limit, rank, size);
    if (rule.yield || waits_yield_on_this_thread || now - start > spin_before_yield) std::this_thread::yield();
  }
}

// Whether `node`'s ranks, which share a node (mpi::split_shared), outnumber the CPUs in the union
// of their affinity masks (collective over node). E.g. 4 ranks unbound on 2 CPUs: true; 2 ranks,
// each bound to a core of its own: false.
bool node_oversubscribed(MPI_Comm node);
// The same rule for given figures: `ranks` on a node whose ranks may run on `cpus` CPUs.
constexpr bool oversubscribed(int ranks, int cpus) noexcept { return cpus <= 0 || ranks > cpus; }

// What the ranks compare before a checked collective: the same on every rank, or a user's bug.
enum class collective_kind : std::uint64_t {
  all_gather, reduce_scatter_sum, broadcast, all_reduce_sum, all_reduce_max, all_reduce_min, barrier,
  all_gather_parts, reduce_scatter_parts, all_to_all,
  all_gather_parts_in_place  // a batch whose sends lie in shared memory (mpi::allocate_shared)
};
// The last kind: a larger value read from another rank (another kfsdp version) reads as this one.
constexpr collective_kind collective_kind_last = collective_kind::all_gather_parts_in_place;
// What the ranks compare of an element type: its bytes, and for the two 2-byte floating-point
// formats a tag, so that bf16 on one rank against f16 on another is a mismatch too.
constexpr std::uint64_t half_tag_bf16 = 0x100, half_tag_f16 = 0x200;
template <class T>
constexpr std::uint64_t element_code() {
  if constexpr (std::is_same_v<T, bf16>) return sizeof(T) | half_tag_bf16;
  else if constexpr (std::is_same_v<T, f16>) return sizeof(T) | half_tag_f16;
  else return sizeof(T);
}
struct collective_call {
  collective_kind kind;
  std::uint64_t element_bytes;  // element_code<T>(); 0 for a barrier
  std::uint64_t count;          // per rank for all_gather (send), reduce_scatter_sum (recv) and all_to_all (a block)
  std::uint64_t root;           // broadcast: the root; *_parts: the number of parts
  friend bool operator==(const collective_call&, const collective_call&) = default;
};
// "broadcast(10 elements of 4 bytes, root 0)".
std::string describe(const collective_call& call);
// "all_gather(...) on ranks 0, 2; broadcast(...) on rank 1": each distinct call once.
std::string describe_calls(std::span<const collective_call> by_rank);

}  // namespace kfsdp::comm::detail
