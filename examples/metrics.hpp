#pragma once
// --metrics FILE for the training examples: rank 0 writes one JSON object per step, one a line
// (JSON Lines), flushed after each, so a killed run leaves only whole lines. Non-finite numbers
// are written as null (JSON has no NaN or infinity). scripts/plot-metrics draws the loss curve.
//
//   kfsdp::examples::metrics_file metrics("train_gpt", c.str("metrics"), world);  // throws on every rank
//   if (metrics) metrics.write({{"step", step + 1}, {"loss", r.loss}, {"step_time_s", seconds}});

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

#include <kfsdp/comm/mpi.hpp>

namespace kfsdp::examples {

// One "key": value pair; the value is formatted once, here, as JSON text.
struct metric {
  std::string_view key;  // a snake_case literal with its unit: written unescaped
  std::string json;
  metric(std::string_view k, std::integral auto v) : key(k), json(fmt::format("{}", v)) {}
  // fmt's shortest round-trip form, so a reader gets back the very double the program had.
  metric(std::string_view k, std::floating_point auto v) : key(k), json(std::isfinite(v) ? fmt::format("{}", v) : "null") {}
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
    world.broadcast(std::span<std::int64_t>(error), 0);
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
