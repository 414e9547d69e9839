#pragma once
// kfsdp::comm::mpi — the MPI communicator backend (opt-in: this header includes mpi.h).
//
// It wraps MPI_COMM_WORLD, or any MPI_Comm you pass, duplicated with MPI_Comm_dup so kfsdp's
// messages never match yours; the duplicate is freed in the destructor (kfsdp's ring
// reduce-scatter and gather batches send point-to-point messages on it, tags 0-32767: send none
// of your own there). Errors come back as exceptions (MPI_ERRORS_RETURN is set on the
// duplicate), never as an abort. Two guards against a user's mismatched collectives
// (mpi_options): the ranks compare each call before making it, and a call that waits longer than
// a timeout (10 minutes unless set) throws. run_or_abort ends a job in which one rank failed.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);    // MPI_Init_thread(FUNNELED), finalize
//     kfsdp::comm::mpi world;                              // MPI_COMM_WORLD, duplicated
//     std::vector<double> shard(4, world.rank()), full(4 * world.size());
//     kfsdp::comm::all_gather(world, shard, std::span(full));  // [0,0,0,0, 1,1,1,1, ...]
//     kfsdp::comm::request pending = world.iall_reduce_sum(std::span(full));
//     pending.wait();
//   }
//
// Its parts, beside it in kfsdp/comm/mpi/: options.hpp (mpi_options), call_check.hpp (errors, the ranks'
// comparison of calls, timeouts), datatypes.hpp (MPI datatypes and sums of kfsdp's elements),
// ring.hpp (the ring reduce-scatter), shared_memory.hpp (allocate_shared's windows and the gather
// that reads them in place), communicator.hpp (mpi), environment.hpp (mpi::environment,
// run_or_abort). What is not a template is compiled into the library kfsdp_mpi: link it
// (pkg-config kfsdp-mpi, CMake kfsdp::mpi, Meson dependency('kfsdp-mpi')).

#include <kfsdp/comm/mpi/options.hpp>
#include <kfsdp/comm/mpi/call_check.hpp>
#include <kfsdp/comm/mpi/datatypes.hpp>
#include <kfsdp/comm/mpi/ring.hpp>
#include <kfsdp/comm/mpi/shared_memory.hpp>
#include <kfsdp/comm/mpi/communicator.hpp>
#include <kfsdp/comm/mpi/environment.hpp>
