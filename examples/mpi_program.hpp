#pragma once
// The main() of the MPI examples and benches: a kfsdp::session (MPI SERIALIZED, since with
// --overlap a communication thread makes the MPI calls; Kokkos; the world) runs the program on its
// world under kfsdp::comm::run_or_abort: an error seen on every rank (a bad flag, a bad KFSDP_*
// variable) is printed once by rank 0 with exit status 2; an error on one rank only is printed by
// that rank and ends the job.
//
//   int main(int argc, char** argv) {
//     return kfsdp::examples::mpi_program(argc, argv, [&](kfsdp::comm::mpi& world) { return run(world); });
//   }

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/session.hpp>
#endif

namespace kfsdp::examples {

template <class Program>
int mpi_program(int argc, char** argv, Program&& program) {
  kfsdp::session job(argc, argv);
  return job.run([&] { return program(job.world()); });
}

}  // namespace kfsdp::examples
