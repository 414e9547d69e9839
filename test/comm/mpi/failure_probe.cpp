// A program that fails the way a user's job can, for test_failures.py: one rank throws mid-run,
// every rank throws, one rank is killed, the ranks call different collectives, a rank waits on a
// collective that the others never call, a collective that times out (the job's end, and timeouts
// tight enough to race the peers). Run under mpirun: failure_probe <mode>.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>

namespace comm = kfsdp::comm;

namespace {

// Steps of a training loop: an all-reduce each; rank `failing` fails at step 5 as `fail` says.
template <class Fail>
void steps(comm::mpi& world, int failing, Fail&& fail) {
  for (int step = 0; step < 1000000; ++step) {
    if (step == 5 && (failing < 0 || world.rank() == failing)) fail(step);
    std::vector<double> loss{1.0};
    comm::all_reduce_sum(world, std::span(loss));
  }
}

int run(comm::mpi& world, std::string_view mode) {
  if (mode == "one-throws") {
    steps(world, 1, [&](int step) {
      throw std::runtime_error(fmt::format("probe: rank {} failed at step {}", world.rank(), step));
    });
  } else if (mode == "all-throw") {
    steps(world, -1, [](int step) {
      throw std::invalid_argument(fmt::format("probe: --flag is bad (seen at step {})", step));
    });
  } else if (mode == "one-killed") {
    steps(world, 1, [](int) { std::raise(SIGKILL); });
  } else if (mode == "mismatch") {
    // A user's bug: rank 0 gathers where the others broadcast.
    comm::mpi checked(MPI_COMM_WORLD, {.check_collectives = true});
    std::vector<float> shard(4), full(4 * static_cast<std::size_t>(world.size()));
    std::vector<double> data(8);
    if (world.rank() == 0) comm::all_gather(checked, std::span<const float>(shard), std::span(full));
    else comm::broadcast(checked, std::span(data), 0);
  } else if (mode == "timeout") {
    // Rank 0 waits in a barrier that the others, stuck elsewhere, never call.
    comm::mpi timed(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(1)});
    if (world.rank() == 0) timed.barrier();
    else std::this_thread::sleep_for(std::chrono::seconds(60));
  } else if (mode == "timeout-ends-job") {
    // Rank 0 all-reduces under the world's timeout (KFSDP_COLLECTIVE_TIMEOUT) while the others sleep:
    // the job must end within the timeout, measured from here.
    if (world.rank() == 0) {
      std::printf("probe: rank 0 enters the collective at %.6f\n",
                  std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
      std::fflush(stdout);
      std::vector<double> loss{1.0};
      comm::all_reduce_sum(world, std::span(loss));
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
  } else if (mode == "tight-timeouts") {
    // Steps whose ranks arrive up to 2 ms apart under a timeout of about that (KFSDP_COLLECTIVE_TIMEOUT
    // = 0.001): some time out, and a late peer then completes the abandoned call. The job ends with
    // an error or finishes; it never crashes.
    std::minstd_rand jitter(static_cast<unsigned>(world.rank()) + 1);
    for (int step = 0; step < 300; ++step) {
      if (jitter() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 2000));
      double local[16] = {1.0};  // on this frame, as a user's loss would be
      comm::all_reduce_sum(world, std::span<double>(local));
    }
  } else {
    throw std::invalid_argument(fmt::format("failure_probe: mode '{}', expected one-throws, all-throw, one-killed, "
                                            "mismatch, timeout, timeout-ends-job or tight-timeouts", mode));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  comm::mpi::environment mpi_up(argc, argv);
  comm::mpi world;
  const std::string_view mode = argc > 1 ? argv[1] : "";
  return comm::run_or_abort(world, [&] { return run(world, mode); });
}
