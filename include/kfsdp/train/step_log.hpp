#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::json_lines and kfsdp::step_log — what a training loop reports (opt-in: needs MPI, through
// comm/mpi/mpi.hpp). json_lines is rank 0's metrics file, one JSON object a line, flushed after each so
// that a killed run leaves whole lines; step_log measures one step (time, throughput, per-rank
// memory, bytes communicated), writes it there and prints it on rank 0:
//
//   kfsdp::step_log log(world, {.program = "train_gpt", .metrics = "m.jsonl", .unit = "tokens", .steps = 400});
//   for (std::size_t step = 0; step < 400; ++step)
//     log.measure(step, trainer, optimizer, lr, tokens_per_step, [&] { return trainer.step(batches, optimizer); });
//
//   step    1/400 | loss 5.544793 |    7323 tokens/s | memory/rank 10.81 MiB (params 1.65 MiB, grads 1.65 MiB,
//   optimizer 3.31 MiB, unsharded peak 4.19 MiB) | activations 49.51 MiB | comm 6.62 MiB
//
// and the same step as {"step": 1, "loss": 5.544793..., "grad_norm": ..., "lr": ..., "tokens_per_s": ...,
// "step_time_s": ..., "memory_per_rank_bytes": ..., "params_bytes": ..., "grads_bytes": ...,
// "optimizer_bytes": ..., "unsharded_peak_bytes": ..., "activation_peak_bytes": ..., "comm_bytes": ...}.
// Memory per rank = sharded parameters + sharded gradients + optimizer state + the unsharded peak.
// Non-finite numbers are written as null (JSON has no NaN or infinity).

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/train/trainer.hpp>

namespace kfsdp {

/// One "key": value pair of a JSON line; the value is formatted once, here, as JSON text.
struct json_field {
  std::string key;  // snake_case with its unit: written unescaped
  std::string json;
  json_field(std::string k, std::integral auto v) : key(std::move(k)), json(fmt::format("{}", v)) {}
  // fmt's shortest round-trip form, so a reader gets back the very double the program had.
  json_field(std::string k, std::floating_point auto v)
      : key(std::move(k)), json(std::isfinite(v) ? fmt::format("{}", v) : "null") {}
};

/// Rank 0's JSON-lines file, over any communicator that agrees (comm::agrees: comm::mpi, an
/// any_communicator, fit's trainer ranks). Opening is collective: rank 0's errno reaches every rank, so a bad path
/// throws std::invalid_argument on every rank alike: "train_gpt: --metrics 'm.jsonl' cannot be
/// opened for writing: No such file or directory", `what` first. Writing is collective too, where
/// a path was given: a write that fails (a full disk, /dev/full) throws std::runtime_error on every
/// rank, naming the file and the cause, instead of losing the metrics silently.
class json_lines {
 public:
  json_lines() = default;
  template <comm::agrees Ranks>
  json_lines(Ranks& world, std::string what, const std::filesystem::path& path, bool append = false)
      : what_(std::move(what)), path_(path) {
    if (path.empty()) return;
    // Rank 0's errno on every rank: the others pass 0 and errno is positive, so it is the highest.
    from_root_ = [&world](std::int64_t error) {
      return std::int64_t(comm::range_over_ranks(world, std::uint64_t(error)).highest);
    };
    std::int64_t error[1] = {0};
    if (world.rank() == 0) {
      file_ = std::fopen(path.c_str(), append ? "a" : "w");
      if (file_ == nullptr) error[0] = errno != 0 ? errno : EIO;
    }
    error[0] = from_root_(error[0]);
    if (error[0] != 0)
      throw std::invalid_argument(
          fmt::format("{} '{}' cannot be opened for writing: {}", what_, path.string(), std::strerror(int(error[0]))));
  }
  json_lines(const json_lines&) = delete;
  json_lines& operator=(const json_lines&) = delete;
  ~json_lines() {
    if (file_ != nullptr) std::fclose(file_);
  }

  /// True on the rank that writes (rank 0, with a path given).
  explicit operator bool() const noexcept { return file_ != nullptr; }

  /// One line {"key": value, ...}, written by rank 0 and flushed; collective where a path was given.
  void write(std::span<const json_field> fields) {
    if (!from_root_) return;
    std::int64_t error[1] = {0};
    if (file_ != nullptr) {
      std::string line = "{";
      for (const json_field& f : fields) line += fmt::format("{}\"{}\": {}", line.size() > 1 ? ", " : "", f.key, f.json);
      line += "}\n";
      if (std::fputs(line.c_str(), file_) == EOF || std::fflush(file_) != 0) error[0] = errno != 0 ? errno : EIO;
    }
    error[0] = from_root_(error[0]);  // every rank stops alike, none waits
    if (error[0] != 0)
      throw std::runtime_error(fmt::format("{} '{}': writing failed: {}", what_, path_.string(), std::strerror(int(error[0]))));
  }
  void write(std::initializer_list<json_field> fields) { write(std::span<const json_field>(fields.begin(), fields.size())); }

 private:
  std::string what_;
  std::filesystem::path path_;
  std::function<std::int64_t(std::int64_t)> from_root_;  // set where a path was given: every rank then takes part in write
  std::FILE* file_ = nullptr;
};

struct step_log_options {
  std::string program;              // names the metrics file in errors: "train_gpt: --metrics is ..."
  std::filesystem::path metrics;    // rank 0's JSON lines, one per step (empty: none)
  std::string unit = "samples";     // what a step processes: "tokens/s" printed, "tokens_per_s" written
  std::size_t steps = 0;            // the run's last step, always printed
  std::size_t log_every = 1;        // a line every k steps (and the first and last)
};

/// One step measured, written and printed; collective only where it opens the metrics file.
KFSDP_EXPORT class step_log {
 public:
  step_log(comm::mpi& world, step_log_options options)
      : options_(std::move(options)),
        metrics_(world, options_.program + ": --metrics", options_.metrics),
        root_(world.rank() == 0),
        terminal_(root_ && isatty(STDERR_FILENO)) {
    if (options_.log_every == 0) options_.log_every = 1;
  }
  step_log(const step_log&) = delete;
  step_log& operator=(const step_log&) = delete;
  ~step_log() { clear_progress(); }

  /// Runs `step_fn` (it returns the trainer's step_result) as step `step` (0-based) of `items`
  /// samples or tokens at `lr`; the engine's peak memory is reset before it.
  template <class Trainer, class Optimizer, class StepFn>
  step_result measure(std::size_t step, Trainer& trainer, const Optimizer& optimizer, double lr, std::size_t items,
                      StepFn&& step_fn) {
    auto& engine = trainer.engine();
    const std::size_t bytes_before = engine.bytes_communicated();
    engine.reset_peak_memory();
    const auto start = std::chrono::steady_clock::now();
    const step_result r = std::forward<StepFn>(step_fn)();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const memory_report m = engine.memory();
    const std::size_t optimizer_bytes = optimizer.state_bytes(), comm_bytes = engine.bytes_communicated() - bytes_before,
                      activations = trainer.peak_activation_bytes(),
                      per_rank = m.sharded_params + m.sharded_grads + optimizer_bytes + m.unsharded_peak;
    const double rate = double(items) / seconds;
    if (measured_++ == 0) first_loss_ = r.loss;
    last_loss_ = r.loss;
    metrics_.write({{"step", step + 1},
                    {"loss", r.loss},
                    {"grad_norm", r.grad_norm},
                    {"lr", lr},
                    {options_.unit + "_per_s", rate},
                    {"step_time_s", seconds},
                    {"memory_per_rank_bytes", per_rank},
                    {"params_bytes", m.sharded_params},
                    {"grads_bytes", m.sharded_grads},
                    {"optimizer_bytes", optimizer_bytes},
                    {"unsharded_peak_bytes", m.unsharded_peak},
                    {"activation_peak_bytes", activations},
                    {"comm_bytes", comm_bytes}});
    if (!root_) return r;
    if (step % options_.log_every == 0 || step + 1 == options_.steps) {
      clear_progress();
      fmt::print("step {:>4}/{} | loss {:.7g} | {:>7.0f} {}/s | memory/rank {} (params {}, grads {}, optimizer {}, "
                 "unsharded peak {}) | activations {} | comm {}\n",
                 step + 1, options_.steps, r.loss, rate, options_.unit, mib(per_rank), mib(m.sharded_params),
                 mib(m.sharded_grads), mib(optimizer_bytes), mib(m.unsharded_peak), mib(activations), mib(comm_bytes));
      std::fflush(stdout);
    }
    if (terminal_ && options_.steps > 0) {  // a progress bar on stderr, redrawn in place
      const std::size_t width = 40, done = std::min(step + 1, options_.steps) * width / options_.steps;
      fmt::print(stderr, "\r[{}{}] {}/{}", std::string(done, '#'), std::string(width - done, '.'), step + 1, options_.steps);
      std::fflush(stderr);
      drawn_ = true;
    }
    return r;
  }

  /// "loss 5.5448 -> 1.6954": the first and the last step's, on rank 0, where a step was measured.
  void print_loss_change() {
    clear_progress();
    if (root_ && measured_ > 0) fmt::print("loss {:.4f} -> {:.4f}\n", first_loss_, last_loss_);
  }

 private:
  static std::string mib(std::size_t bytes) { return fmt::format("{:.2f} MiB", double(bytes) / (1024.0 * 1024.0)); }
  void clear_progress() {
    if (!drawn_) return;
    fmt::print(stderr, "\r\033[K");
    drawn_ = false;
  }

  step_log_options options_;
  json_lines metrics_;
  bool root_, terminal_, drawn_ = false;
  std::size_t measured_ = 0;
  double first_loss_ = 0, last_loss_ = 0;
};

}  // namespace kfsdp
