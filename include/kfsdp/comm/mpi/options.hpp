#pragma once
// mpi_options — how a kfsdp::comm::mpi communicator guards against collectives that the ranks do
// not call alike, and how it reaches device memory. The defaults come from the environment
// (KFSDP_CHECK_COLLECTIVES, KFSDP_COLLECTIVE_TIMEOUT, KFSDP_SHARED_MEMORY), read in src/comm/mpi/mpi.cpp.
//
//   kfsdp::comm::mpi world(MPI_COMM_WORLD, {.check_collectives = true, .timeout = std::chrono::minutes(2)});

#include <chrono>
#include <string_view>

namespace kfsdp::comm {

namespace detail {
// The defaults of mpi_options, from the environment so a job can switch them without a rebuild.
// A switch `name`: 1, on, 0 or off; unset, `when_unset`; anything else throws, naming it.
bool switch_from_environment(const char* name, bool when_unset);
// KFSDP_CHECK_COLLECTIVES; unset, on in the caller's builds without NDEBUG (decided here, in the
// caller's translation unit).
inline bool default_check_collectives() {
#ifdef NDEBUG
  return switch_from_environment("KFSDP_CHECK_COLLECTIVES", false);
#else
  return switch_from_environment("KFSDP_CHECK_COLLECTIVES", true);
#endif
}
// 10 minutes, as PyTorch's process groups: a rank that skips a collective ends the job with an
// error naming the call instead of a hang, and no healthy collective waits that long.
inline constexpr std::chrono::duration<double> collective_timeout_default{600.0};
// A timeout is 0 (none) or from 1 ms (below, a healthy collective's own latency would time out)
// to 1e9 s; check_collective_timeout throws std::invalid_argument naming `what` otherwise.
inline constexpr std::chrono::duration<double> collective_timeout_least{1e-3}, collective_timeout_most{1e9};
void check_collective_timeout(std::chrono::duration<double> timeout, std::string_view what);
// KFSDP_COLLECTIVE_TIMEOUT: 0 (no timeout) or seconds from 0.001; unset, collective_timeout_default.
std::chrono::duration<double> default_collective_timeout();
}  // namespace detail

// How an mpi communicator guards against collectives that the ranks do not call alike.
//
//   kfsdp::comm::mpi world(MPI_COMM_WORLD, {.check_collectives = true, .timeout = std::chrono::minutes(2)});
struct mpi_options {
  // Before each collective the ranks all-gather what they are about to call (kind, element size,
  // count, root) and, where they differ, throw collective_mismatch on every rank naming each
  // rank's call, instead of hanging or failing with MPI_ERR_TRUNCATE. One 32-byte all-gather per
  // call: on by default in builds without NDEBUG; KFSDP_CHECK_COLLECTIVES=1|0 sets the default.
  bool check_collectives = detail::default_check_collectives();
  // A collective that has not completed after this long throws mpi::timeout naming the call (as
  // NCCL's watchdog does), e.g. when another rank never calls it; the communicator must not be
  // used afterwards. 600 s by default; KFSDP_COLLECTIVE_TIMEOUT=<seconds> sets the default; zero
  // waits forever; anything else below 1 ms is refused.
  std::chrono::duration<double> timeout = detail::default_collective_timeout();
  // How MPI reaches buffers that the host cannot touch (span_in<T, Kokkos::CudaSpace>):
  //   automatic  the device pointers themselves when MPI says it reads device memory
  //              (MPIX_Query_cuda_support), else through host copies (staged);
  //   direct     the device pointers themselves (you know your MPI is CUDA-aware);
  //   staged     through host copies in staging_space (pinned with CUDA), also for host memory,
  //              which is how the tests run this path on a CPU machine.
  // Host memory takes the direct path unless staged is set. Every rank must pass the same value.
  enum class device_memory_path { automatic, direct, staged };
  device_memory_path device_memory = device_memory_path::automatic;
  // Whether allocate_shared hands out MPI shared-memory windows where all the ranks share a node and
  // its shared-memory filesystem has room: an engine's parameter shards then lie there, and its
  // unshard copies the peers' chunks out of their memory instead of sending messages. On by
  // default; KFSDP_SHARED_MEMORY=0 sets the default. Every rank must pass the same value.
  bool shared_memory = detail::switch_from_environment("KFSDP_SHARED_MEMORY", true);
};

}  // namespace kfsdp::comm
