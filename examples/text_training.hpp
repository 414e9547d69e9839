#pragma once
// What the byte-level language models' training programs (train_gpt, train_llama) share: the flags
// of a run over text windows (steps, optimizer, clipping, sampling, gradient accumulation, logging)
// and its loop, each step's global batch of windows split over the ranks.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#ifndef KFSDP_IMPORT_MODULE
#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
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

// Steps first_step .. t.steps - 1: step s takes micro-batches s·K .. s·K + K − 1 (K = --grad-accum) of
// `batch` windows, keyed by the step so that a resumed run sees the same data; every rank its slice.
// after_step(s + 1) runs after each step (periodic saves). SIGTERM or SIGUSR1 on any rank stops every
// rank at the next step boundary (kfsdp::stop_signals, as fit stops). Returns the steps done.
template <class Trainer, class Optimizer, class AfterStep>
std::size_t train_on_windows(Trainer& trainer, Optimizer& optimizer, const kfsdp::io::text_windows& data, const text_training& t,
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
