#pragma once
// The main() of the MPI examples and benches: MPI (SERIALIZED, since with --overlap on a
// communication thread makes the MPI calls) and Kokkos up, the program run on MPI_COMM_WORLD
// under kfsdp::comm::run_or_abort: an error seen on every rank (a bad flag) is printed once by
// rank 0 with exit status 2; an error on one rank only is printed by that rank and ends the job.
//
//   int main(int argc, char** argv) {
//     return kfsdp::examples::mpi_program(argc, argv, [&](kfsdp::comm::mpi& world) { return run(world); });
//   }

#include <mpi.h>

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
  kfsdp::comm::mpi world;
  return kfsdp::comm::run_or_abort(world, [&] { return program(world); });
}

}  // namespace kfsdp::examples
