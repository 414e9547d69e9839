#pragma once
// What the byte-level language models' training programs (train_gpt, train_llama) share: the flags
// of a run over text windows (steps, optimizer, clipping, sampling, gradient accumulation, logging)
// and its loop, each step's global batch of windows split over the ranks.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#ifndef KFSDP_IMPORT_MODULE
#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/io/data/token_dataset.hpp>
#include <kfsdp/optim/any_optimizer.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/step_log.hpp>
#include <kfsdp/train/preemption.hpp>
#include <kfsdp/train/trainer.hpp>
#endif

#include "cli.hpp"
#include "stop_report.hpp"

namespace kfsdp::examples {

inline cli& add_text_training_flags(cli& c) {
  return c.flag("steps", "400", "optimizer steps")
      .flag("lr", "0.002", "learning rate")
      .flag("optimizer", "adamw", "adamw | sgd")
      .flag("momentum", "0.9", "SGD momentum")
      .flag("weight-decay", "0.01", "weight decay (AdamW decoupled, SGD L2)")
      .flag("clip", "1.0", "clip the global gradient norm to this (0: off)")
      .flag("sampling", "random", "random | sequential windows")
      .flag("grad-accum", "1", "micro-batches per step (each of --batch windows)")
      .flag("grad-accum-mode", "unsharded", "unsharded (no_sync: reduce once) | sharded (reduce every micro-batch)");
}

inline cli& add_step_log_flags(cli& c) {
  return c.flag("log-every", "1", "print every k-th step")
      .flag("metrics", "", "write one JSON line per step here (rank 0; loss, tokens/s, memory, comm bytes; overwritten)");
}

// What those flags set.
struct text_training {
  std::size_t steps = 0, grad_accum = 1, log_every = 1;
  double clip = 0;
  std::string metrics;
  kfsdp::optim::optimizer_choice optimizer;
  kfsdp::io::window_sampling sampling = kfsdp::io::window_sampling::random;
  kfsdp::grad_accumulation accumulation = kfsdp::grad_accumulation::unsharded;
};

inline text_training text_training_of(const cli& c) {
  text_training t{.steps = c.size("steps"), .grad_accum = c.size("grad-accum"),
                  .log_every = std::max<std::size_t>(1, c.size("log-every")), .clip = c.real_at_least("clip", 0),
                  .metrics = c.str("metrics"),
                  .optimizer = {.kind = c.choice("optimizer", {"adamw", "sgd"}), .lr = c.real_at_least("lr", 0),
                                .momentum = c.real_at_least("momentum", 0), .weight_decay = c.real_at_least("weight-decay", 0)},
                  .sampling = kfsdp::io::parse_sampling(c.str("sampling")),
                  .accumulation = kfsdp::parse_grad_accumulation(c.str("grad-accum-mode"))};
  if (t.grad_accum == 0) throw std::invalid_argument(c.program() + ": --grad-accum is 0, expected at least 1");
  return t;
}

inline cli& add_token_data_flags(cli& c) {
  return c.flag("val-data", "", "validation data: token shards or text, as --data")
      .flag("val-split", "0", "hold out the last W windows of --data for validation (instead of --val-data)")
      .flag("val-windows", "0", "evaluate the first W validation windows (0: all of them)")
      .flag("eval-every", "0", "validation loss and perplexity every k steps and at the end (0: at the end only)");
}

// A --data or --val-data path: token shards where it ends in .bin or .npy (a glob of them is one
// stream: llm.c's shards, nanoGPT's raw uint16, 1-D .npy), else text read as bytes (vocabulary 256).
inline kfsdp::io::token_windows open_windows(const std::string& path, std::size_t seq, std::size_t vocab) {
  const bool tokens = path.ends_with(".bin") || path.ends_with(".npy");
  return kfsdp::io::token_windows::open(path, seq, vocab, tokens ? kfsdp::io::token_format::automatic
                                                                 : kfsdp::io::token_format::text);
}

// The training windows and, where the flags ask, the validation windows (a file, or a split).
struct window_data {
  kfsdp::io::token_windows train;
  std::optional<kfsdp::io::token_windows> validation;
  std::size_t val_windows = 0, eval_every = 0;
};

inline window_data open_window_data(const cli& c, std::size_t seq, std::size_t vocab) {
  const std::string val_data = c.str("val-data");
  const std::size_t split = c.size("val-split");
  if (!val_data.empty() && split > 0)
    throw std::invalid_argument(c.program() + ": --val-data and --val-split both given, expected one source of validation");
  kfsdp::io::token_windows all = open_windows(c.str("data"), seq, vocab);
  if (split > 0) {
    auto [train, validation] = all.split(split);
    return {std::move(train), std::move(validation), c.size("val-windows"), c.size("eval-every")};
  }
  std::optional<kfsdp::io::token_windows> validation;
  if (!val_data.empty()) validation.emplace(open_windows(val_data, seq, vocab));
  return {std::move(all), std::move(validation), c.size("val-windows"), c.size("eval-every")};
}

// Validation loss and perplexity (exp of the mean per-token loss) after `steps_done`, on rank 0.
template <class Trainer>
void print_validation(Trainer& trainer, const window_data& data, std::size_t steps_done, std::size_t steps,
                      kfsdp::comm::mpi& world, const std::string& program) {
  if (!data.validation) return;
  const std::size_t windows = data.val_windows == 0 ? data.validation->count() : data.val_windows;
  const double loss = kfsdp::evaluate_windows(trainer, *data.validation, windows, world);
  if (world.rank() == 0)
    fmt::print("{}: validation after step {}/{} | loss {:.12g} | perplexity {:.6g} | {} windows\n", program, steps_done,
               steps, loss, std::exp(loss), std::min(windows, data.validation->count()));
}

// This process's peak resident memory (VmHWM of /proc/self/status) in bytes; 0 where there is none.
inline double peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return std::stod(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
  return 0;
}

// Rank 0 prints each rank's token bytes copied out of the data and its peak resident memory.
inline void print_data_reads(const kfsdp::io::token_windows& data, kfsdp::comm::mpi& world, const std::string& program) {
  const std::size_t ws = std::size_t(world.size()), rank = std::size_t(world.rank());
  std::vector<double> figures(2 * ws, 0.0);  // each rank its own two slots; the sum gathers them
  figures[rank] = double(data.bytes_copied());
  figures[ws + rank] = peak_resident_bytes() / (1024.0 * 1024.0);
  kfsdp::comm::all_reduce_sum(world, std::span<double>(figures));
  if (rank == 0)
    fmt::print("{}: data bytes copied per rank [{}], peak resident memory (VmHWM) per rank [{:.1f}] MiB\n", program,
               fmt::join(std::span(figures).first(ws), ", "), fmt::join(std::span(figures).last(ws), ", "));
}

// Steps first_step .. t.steps - 1 over io::text_windows or io::token_windows: step s takes micro-batches s·K .. s·K + K − 1 (K = --grad-accum) of
// `batch` windows, keyed by the step so that a resumed run sees the same data; every rank its slice.
// after_step(s + 1) runs after each step (periodic saves). SIGTERM or SIGUSR1 on any rank stops every
// rank at the next step boundary (kfsdp::stop_signals, as fit stops). Returns the steps done.
template <class Trainer, class Optimizer, class Windows, class AfterStep>
std::size_t train_on_windows(Trainer& trainer, Optimizer& optimizer, const Windows& data, const text_training& t,
                      std::size_t batch, std::uint64_t seed, std::size_t first_step, kfsdp::comm::mpi& world,
                      kfsdp::step_log& log, const std::string& program, AfterStep&& after_step) {
  using batch_type = typename Trainer::batch;
  const std::size_t ws = std::size_t(world.size());
  std::vector<batch_type> batches(t.grad_accum);
  const kfsdp::stop_signals signals;
  for (std::size_t step = first_step; step < t.steps; ++step) {
    if (signals.stop_requested(world)) return step;
    for (std::size_t k = 0; k < t.grad_accum; ++k) {
      std::vector<int> tokens, targets;
      data.rank_slice(data.micro_batch(t.sampling, seed, step * t.grad_accum + k, batch), std::size_t(world.rank()), ws,
                      tokens, targets);
      batches[k] = {kfsdp::device_ids(tokens), kfsdp::device_ids(targets)};
    }
    log.measure(step, trainer, optimizer, t.optimizer.lr, t.grad_accum * batch * data.seq(), [&] {
      try {
        return trainer.step(std::span<const batch_type>(batches), optimizer, t.clip, t.accumulation);
      } catch (const kfsdp::non_finite_loss& diverged) {  // every rank alike; nothing more is saved
        throw std::runtime_error(fmt::format("{}: step {}/{}: {} (--lr {}, --clip {})", program, step + 1, t.steps,
                                             diverged.what(), t.optimizer.lr, t.clip));
      }
    });
    after_step(step + 1);
  }
  return std::max(first_step, t.steps);
}

}  // namespace kfsdp::examples
