#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::comm::mpi::environment, MPI's start and end as a guard, and run_or_abort, which ends a
// job cleanly when some of its ranks fail. Compiled into kfsdp_mpi (src/comm/mpi/mpi.cpp) but for
// run_or_abort's call of the program.

#include <mpi.h>

#include <chrono>
#include <exception>
#include <string>

#include <kfsdp/comm/mpi/communicator.hpp>

namespace kfsdp::comm {

// RAII guard: MPI_Init_thread with at least `required_thread_level` (MPI_THREAD_FUNNELED by
// default: only the main thread calls MPI) unless MPI is already up; MPI_Finalize at the end if
// this guard initialised it. Throws when MPI cannot give the thread level asked for.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);
//     kfsdp::comm::mpi world;
//     ...                                  // every kfsdp::comm::mpi must die before mpi_up
//   }
class mpi::environment {
 public:
  environment(int& argc, char**& argv, int required_thread_level = MPI_THREAD_FUNNELED) {
    start(&argc, &argv, required_thread_level);
  }
  explicit environment(int required_thread_level = MPI_THREAD_FUNNELED) {
    start(nullptr, nullptr, required_thread_level);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment();

  // True when this guard called MPI_Init_thread (and so will call MPI_Finalize).
  [[nodiscard]] bool owns_mpi() const noexcept { return owns_mpi_; }
  // The thread level MPI provides (MPI_THREAD_SINGLE < FUNNELED < SERIALIZED < MULTIPLE).
  [[nodiscard]] int thread_level() const noexcept { return thread_level_; }

 private:
  void start(int* argc, char*** argv, int required_thread_level);

  bool owns_mpi_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

namespace detail {
// run_or_abort once program() has returned or thrown (`message` empty: it returned `status`): the
// ranks' verdicts all-reduced on `verdicts` (freed here), or MPI_Abort after `grace`; at once
// where `timed_out` (a collective of this rank was abandoned: its peers are lost, and it may still
// complete into memory that unwinding handed back).
int agree_or_abort(mpi& world, MPI_Comm verdicts, int status, const std::string& message,
                   std::chrono::duration<double> grace, bool timed_out);
}  // namespace detail

// Runs program() on every rank of `world` and ends the job cleanly whichever ranks fail:
// - no exception: every rank returns what program() returned;
// - an exception on every rank (a bad flag, seen alike everywhere): rank 0 prints
//   "error: <what>" and every rank returns 2;
// - an exception on some ranks only, while the others run on or wait in a collective: each
//   failing rank prints "error on rank r of n: <what>" and, when the others have not finished
//   within `grace`, calls MPI_Abort(MPI_COMM_WORLD, 2), so the job ends instead of hanging;
// - a collective that timed out (mpi::timeout, or any failure after one abandoned an operation):
//   that rank prints its error and calls MPI_Abort at once, so the job ends within the timeout
//   and the lost collective never completes into memory the program has handed back.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);
//     kfsdp::comm::mpi world;
//     return kfsdp::comm::run_or_abort(world, [&] { return train(world); });
//   }
KFSDP_EXPORT template <class Program>
int run_or_abort(mpi& world, Program&& program,
                 std::chrono::duration<double> grace = std::chrono::seconds(3)) {
  MPI_Comm verdicts = MPI_COMM_NULL;  // its own communicator: a failed rank's world may be mid-call
  mpi::check(MPI_Comm_dup(world.native(), &verdicts), "kfsdp::comm::run_or_abort", "MPI_Comm_dup");
  int status = 0;
  std::string message;
  bool timed_out = false;
  try {
    status = program();
  } catch (const mpi::timeout& caught) {
    timed_out = true;
    message = caught.what();
  } catch (const std::exception& caught) {
    message = caught.what();
  } catch (...) {
    message = "an exception that is not a std::exception";
  }
  timed_out = timed_out || (!message.empty() && detail::operations_abandoned.load(std::memory_order_relaxed));
  return detail::agree_or_abort(world, verdicts, status, message, grace, timed_out);
}

}  // namespace kfsdp::comm
