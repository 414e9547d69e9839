#pragma once
// --metrics FILE for the training examples: rank 0 writes one JSON object per step, one a line
// (JSON Lines), flushed after each, so a killed run leaves only whole lines. Non-finite numbers
// are written as null (JSON has no NaN or infinity). scripts/plot-metrics draws the loss curve.
//
//   kfsdp::examples::metrics_file metrics("train_gpt", c.str("metrics"), world);  // throws on every rank
//   if (metrics) metrics.write({{"step", step + 1}, {"loss", r.loss}, {"step_time_s", seconds}});
//   if (metrics) metrics.write_step({.step = step + 1, .loss = r.loss, ..., .memory = engine.memory()});

#include <cerrno>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/fsdp/engine.hpp>
#endif

namespace kfsdp::examples {

// One "key": value pair; the value is formatted once, here, as JSON text.
struct metric {
  std::string_view key;  // a snake_case literal with its unit: written unescaped
  std::string json;
  metric(std::string_view k, std::integral auto v) : key(k), json(fmt::format("{}", v)) {}
  // fmt's shortest round-trip form, so a reader gets back the very double the program had.
  metric(std::string_view k, std::floating_point auto v) : key(k), json(std::isfinite(v) ? fmt::format("{}", v) : "null") {}
};

// What a training example records each step (one write_step line).
struct step_metrics {
  std::size_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  std::string_view throughput_key;  // "tokens_per_s", "samples_per_s", ...
  double throughput = 0, step_time_s = 0;
  kfsdp::memory_report memory;      // the engine's, after the step (its peak reset before it)
  std::size_t optimizer_bytes = 0, activation_peak_bytes = 0, comm_bytes = 0;
};

class metrics_file {
 public:
  metrics_file() = default;

  // Rank 0 opens (truncates) `path` and broadcasts its errno, so a bad path stops every rank alike.
  metrics_file(std::string_view program, const std::string& path, kfsdp::comm::mpi& world) {
    if (path.empty()) return;
    std::int64_t error[1] = {0};
    if (world.rank() == 0) {
      file_ = std::fopen(path.c_str(), "w");
      if (file_ == nullptr) error[0] = errno != 0 ? errno : EIO;
    }
    kfsdp::comm::broadcast(world, std::span<std::int64_t>(error), 0);
    if (error[0] != 0)
      throw std::invalid_argument(
          fmt::format("{}: --metrics '{}' cannot be opened for writing: {}", program, path, std::strerror(int(error[0]))));
  }
  metrics_file(const metrics_file&) = delete;
  metrics_file& operator=(const metrics_file&) = delete;
  ~metrics_file() {
    if (file_ != nullptr) std::fclose(file_);
  }

  // True on the rank that writes (rank 0, with --metrics given).
  explicit operator bool() const noexcept { return file_ != nullptr; }

  // The per-step line both training examples write; memory per rank = shards + optimizer + unsharded peak.
  void write_step(const step_metrics& s) {
    const kfsdp::memory_report& m = s.memory;
    write({{"step", s.step},
           {"loss", s.loss},
           {"grad_norm", s.grad_norm},
           {"lr", s.lr},
           {s.throughput_key, s.throughput},
           {"step_time_s", s.step_time_s},
           {"memory_per_rank_bytes", m.sharded_params + m.sharded_grads + s.optimizer_bytes + m.unsharded_peak},
           {"params_bytes", m.sharded_params},
           {"grads_bytes", m.sharded_grads},
           {"optimizer_bytes", s.optimizer_bytes},
           {"unsharded_peak_bytes", m.unsharded_peak},
           {"activation_peak_bytes", s.activation_peak_bytes},
           {"comm_bytes", s.comm_bytes}});
  }

  // One line: {"key": value, ...}; flushed, so a reader (or a killed run) sees whole lines only.
  void write(std::initializer_list<metric> fields) {
    if (file_ == nullptr) return;
    std::string line = "{";
    for (const metric& m : fields) line += fmt::format("{}\"{}\": {}", line.size() > 1 ? ", " : "", m.key, m.json);
    line += "}\n";
    if (std::fputs(line.c_str(), file_) == EOF || std::fflush(file_) != 0) {
      // Only rank 0 writes: throwing here would leave the other ranks waiting in a collective.
      fmt::print(stderr, "warning: --metrics: writing failed ({}); no more metrics are written\n", std::strerror(errno));
      std::fclose(file_);
      file_ = nullptr;
    }
  }

 private:
  std::FILE* file_ = nullptr;
};

}  // namespace kfsdp::examples
