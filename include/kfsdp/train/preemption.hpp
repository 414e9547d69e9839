#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::stop_signals — preemption as Slurm delivers it: SIGTERM, or the warning signal of
// `--signal=USR1@N`, asks a run to stop at its next step boundary; the ranks agree on it (one
// all-reduce of the flag a step), so that every rank stops at the same step. fit and the example
// programs stop through it, save a checkpoint, write its stop marker and exit 0:
//
//   kfsdp::stop_signals signals;                            // handlers in place while it lives
//   for (std::size_t step = first; step < steps; ++step) {
//     if (signals.stop_requested(world)) {                  // every rank alike
//       save(checkpoint, step);
//       kfsdp::mark_stopped(checkpoint, step, world.rank() == 0);   // "run.safetensors.stopped"
//       return 0;                                           // the job script requeues
//     }
//     ...                                                   // one step
//   }
//   kfsdp::mark_finished(checkpoint, world.rank() == 0);    // no marker: the run is complete
//
// A job script tells "stopped" from "finished" by the marker: `[ -e run.safetensors.stopped ]`.

#include <csignal>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include <kfsdp/comm/communicator.hpp>  // comm::any_rank

namespace kfsdp {

namespace detail {
// The signal that asked the run to stop (0: none); written by the handler, read between steps.
inline volatile std::sig_atomic_t stop_signal = 0;
inline void record_stop_signal(int signal) { stop_signal = signal; }
}  // namespace detail

/// SIGTERM and SIGUSR1 ask the run to stop while this lives; the program's own handlers come back
/// after. One at a time.
KFSDP_EXPORT class stop_signals {
 public:
  stop_signals() {
    detail::stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = &detail::record_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // MPI's and the file system's calls go on
    sigaction(SIGTERM, &action, &previous_term_);
    sigaction(SIGUSR1, &action, &previous_usr1_);
  }
  ~stop_signals() {
    sigaction(SIGTERM, &previous_term_, nullptr);
    sigaction(SIGUSR1, &previous_usr1_, nullptr);
  }
  stop_signals(const stop_signals&) = delete;
  stop_signals& operator=(const stop_signals&) = delete;

  /// Whether any rank of `world` has received a stop signal (collective: call it at the same step
  /// boundary on every rank).
  template <class C>
  [[nodiscard]] bool stop_requested(C& world) const {
    return comm::any_rank(world, detail::stop_signal != 0);
  }
  /// The signal this rank received (SIGTERM, SIGUSR1), or 0.
  [[nodiscard]] static int received() noexcept { return detail::stop_signal; }

 private:
  struct sigaction previous_term_ {
  }, previous_usr1_{};
};

/// "<checkpoint>.stopped": the marker of a run stopped by a signal after saving `checkpoint`.
KFSDP_EXPORT inline std::filesystem::path stop_marker(const std::filesystem::path& checkpoint) {
  std::filesystem::path marker = checkpoint;
  if (marker.filename().empty()) marker = marker.parent_path();  // "out/" is "out"
  marker += ".stopped";
  return marker;
}

/// Writes stop_marker(checkpoint) (the step it stopped at, one line) when `writer` (one rank);
/// throws std::runtime_error naming the file where it cannot.
KFSDP_EXPORT inline void mark_stopped(const std::filesystem::path& checkpoint, std::size_t step, bool writer) {
  if (!writer) return;
  const std::filesystem::path marker = stop_marker(checkpoint);
  std::ofstream out(marker, std::ios::trunc);
  out << fmt::format("stopped at step {}\n", step);
  out.close();
  if (!out) throw std::runtime_error(fmt::format("kfsdp::mark_stopped: writing '{}' failed", marker.string()));
}

/// Removes stop_marker(checkpoint), if any, when `writer`: the run has finished.
KFSDP_EXPORT inline void mark_finished(const std::filesystem::path& checkpoint, bool writer) {
  if (!writer) return;
  std::error_code ignored;  // none there: nothing to do
  std::filesystem::remove(stop_marker(checkpoint), ignored);
}

}  // namespace kfsdp
