#pragma once
// What an example program prints and leaves when SIGTERM or SIGUSR1 stopped it (kfsdp::stop_signals):
// one line, and the marker beside its checkpoint that a job script tests to requeue the job.

#include <cstddef>
#include <string>

#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/train/preemption.hpp>
#endif

namespace kfsdp::examples {

// After `steps` steps, its checkpoint (if any) saved: "train_gpt: stopped by a signal at step 40, saved
// ckpt.st (marker ckpt.st.stopped)".
inline void report_stopped(const std::string& program, std::size_t steps, const std::string& checkpoint, bool root) {
  if (!checkpoint.empty()) kfsdp::mark_stopped(checkpoint, steps, root);
  if (root)
    fmt::print("{}: stopped by a signal at step {}{}\n", program, steps,
               checkpoint.empty() ? std::string(" (no --save: nothing kept)")
                                  : fmt::format(", saved {} (marker {})", checkpoint, kfsdp::stop_marker(checkpoint).string()));
}

}  // namespace kfsdp::examples
