#pragma once
// The main() of the MPI examples and benches: MPI (SERIALIZED, since with --overlap on a
// communication thread makes the MPI calls) and Kokkos up, the program run on MPI_COMM_WORLD, and
// an error turned into "error: ..." on rank 0 and exit status 2 on every rank (every rank parses
// the same flags and meets the same checks, so every rank fails alike instead of hanging).
//
//   int main(int argc, char** argv) {
//     return kfsdp::examples::mpi_program(argc, argv, [&](kfsdp::comm::mpi& world) { return run(world); });
//   }

#include <cstdio>
#include <exception>

#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/environment.hpp>

namespace kfsdp::examples {

template <class Program>
int mpi_program(int argc, char** argv, Program&& program) {
  kfsdp::comm::mpi::environment mpi_up(argc, argv, MPI_THREAD_SERIALIZED);
  kfsdp::environment kokkos_up(argc, argv);
  kfsdp::comm::mpi world;
  try {
    return program(world);
  } catch (const std::exception& e) {
    if (world.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

}  // namespace kfsdp::examples
