#pragma once
// The main() of the MPI examples and benches: MPI (SERIALIZED, since with --overlap on a
// communication thread makes the MPI calls) and Kokkos up, the program run on MPI_COMM_WORLD
// under kfsdp::comm::run_or_abort: an error seen on every rank (a bad flag) is printed once by
// rank 0 with exit status 2 (so is a bad KFSDP_* variable); an error on one rank only is printed by
// that rank and ends the job.
//
//   int main(int argc, char** argv) {
//     return kfsdp::examples::mpi_program(argc, argv, [&](kfsdp::comm::mpi& world) { return run(world); });
//   }

#include <mpi.h>

#include <chrono>
#include <stdexcept>
#include <string>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/environment.hpp>
#endif

namespace kfsdp::examples {

template <class Program>
int mpi_program(int argc, char** argv, Program&& program) {
  kfsdp::comm::mpi::environment mpi_up(argc, argv, MPI_THREAD_SERIALIZED);
  kfsdp::environment kokkos_up(argc, argv);
  // mpi_options' defaults read KFSDP_CHECK_COLLECTIVES and KFSDP_COLLECTIVE_TIMEOUT: a bad value is
  // reported as a bad flag is (every rank, exit 2), so it is thrown inside run_or_abort, not here.
  std::string bad_environment;
  kfsdp::comm::mpi_options options{.check_collectives = false, .timeout = std::chrono::duration<double>(0)};
  try {
    options = kfsdp::comm::mpi_options{};
  } catch (const std::invalid_argument& bad) {
    bad_environment = bad.what();
  }
  kfsdp::comm::mpi world(MPI_COMM_WORLD, options);
  return kfsdp::comm::run_or_abort(world, [&] {
    if (!bad_environment.empty()) throw std::invalid_argument(bad_environment);
    return program(world);
  });
}

}  // namespace kfsdp::examples
