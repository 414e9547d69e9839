#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::fit — the training loop users expect, around a trainer (opt-in: this header includes
// mpi.h, through session.hpp and io/checkpoint/checkpoint.hpp): steps or epochs over a dataset (io::dataset: an
// array_dataset in memory, an hdf5_dataset read per batch from a shared file) with a distributed sampler (the same global batches at any world size), a learning-rate schedule,
// evaluation every K steps, a progress line on rank 0 and JSON-lines metrics, checkpoints every K
// steps keeping the last N, resuming on its own from the newest complete one, and preemption:
// SIGTERM or SIGUSR1 (what Slurm sends before a time limit) writes a checkpoint at the next step
// boundary and returns, every rank alike.
//
//   kfsdp::session job(argc, argv);
//   kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
//                                     job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3}));
//   model.initialize(1);
//   kfsdp::optim::adamw<double> adam(model, {.weight_decay = 0.0});
//   const kfsdp::fit_result result = kfsdp::fit(model, adam, kfsdp::optim::cosine(3e-3, 4000), data,
//       {.steps = 4000, .global_batch = 256, .eval_data = &test, .eval_every = 500,
//        .checkpoint_dir = "checkpoints", .checkpoint_every = 500, .keep_last = 2});
//   if (result.preempted) return 0;           // the checkpoint is written: requeue the job
//
// A checkpoint, checkpoint_dir/step-00000500.safetensors, is the union of the checkpoint protocol's
// parts (tensor/stateful.hpp): the model, the optimizer's state, the sampler's, "fit.step" and the
// user's metadata (normalisation statistics, say). The schedule is a function of the step, so the
// step is its state; the sampler needs no RNG state beyond its seed and step. A file that does not
// verify (cut short, corrupted) is skipped on resume, with a line saying why; a file of another
// configuration (optimizer, seed, batch, data size, model size or dtype) is refused from its
// header, naming the file and the key.
//
// Metrics at evaluation, over every sample of eval_data: kfsdp::evaluate's (train/evaluate.hpp,
// which a loop of one's own calls too): loss, mse and relative L2 error for a model ending in mse;
// loss, accuracy and perplexity for one ending in cross_entropy; and each fit_metric.
//
// Every collective is over the trainer's ranks (its engine's communicator and, under HSDP, its
// replica group), so fit needs no session: the session only made those communicators.

#include <signal.h>
#include <csignal>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <Kokkos_Core.hpp>

#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/io/data/dataset.hpp>
#include <kfsdp/io/data/distributed_sampler.hpp>
#include <kfsdp/tensor/stateful.hpp>
#include <kfsdp/optim/adamw.hpp>     // what a fit program steps with: the optimizers
#include <kfsdp/optim/schedule.hpp>  // and the schedules
#include <kfsdp/optim/sgd.hpp>
#include <kfsdp/train/preemption.hpp>  // stop_signals, the stop marker
#include <kfsdp/session.hpp>
#include <kfsdp/train/evaluate.hpp>  // kfsdp::evaluate, fit_metric, eval_metrics
#include <kfsdp/train/step_log.hpp>
#include <kfsdp/train/trainer.hpp>

namespace kfsdp {

/// What fit does; every field has a default. Exactly one of steps and epochs is set.
struct fit_options {
  std::size_t steps = 0;         // optimizer steps in all (a resumed run continues to this step)
  std::size_t epochs = 0;        // or passes over the data: steps = ceil(epochs · samples / global_batch)
  std::size_t global_batch = 0;  // samples per step over every rank: a multiple of the ranks
  std::uint64_t seed = 0;        // the sampler's shuffle
  double max_norm = 0;           // clip the global gradient norm to this (0: no clipping)
  io::dataset_ref eval_data = nullptr;           // &any io::dataset: evaluated every eval_every steps and at the end
  std::size_t eval_every = 0;                    // 0: only at the end
  std::vector<fit_metric> metrics{};             // computed at each evaluation besides the built-in ones
  std::size_t log_every = 0;                     // a progress line every k steps on rank 0 (0: ten per run)
  std::filesystem::path metrics_file{};          // JSON lines, one a step, rank 0 (appended to when resuming)
  std::filesystem::path checkpoint_dir{};        // empty: no checkpoints, no resume
  std::size_t checkpoint_every = 0;              // 0: only at the end and on SIGTERM / SIGUSR1
  std::size_t keep_last = 3;                     // checkpoints kept in checkpoint_dir (the newest)
  bool resume = true;                            // continue from the newest complete checkpoint there
  io::metadata_map metadata{};                   // the user's keys, written into every checkpoint
};

/// How a fit ended.
KFSDP_EXPORT struct fit_result {
  std::size_t step = 0;          // steps done: the options' total, unless preempted
  std::size_t resumed_from = 0;  // the step of the checkpoint it resumed from (0: a fresh start)
  bool preempted = false;        // SIGTERM / SIGUSR1: a checkpoint at `step` was written, then fit returned
  double loss = std::numeric_limits<double>::quiet_NaN();  // the last training step's
  eval_metrics eval{};                                     // the last evaluation (all NaN: none)
  std::filesystem::path checkpoint{};                      // the last checkpoint written or resumed
  io::metadata_map metadata{};                             // the resumed checkpoint's (user keys included)
};

/// checkpoint_dir/step-00000500.safetensors: the name fit gives the checkpoint of a step.
inline std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::size_t step) {
  return dir / fmt::format("step-{:08}.safetensors", step);
}

/// The steps of the checkpoints in `dir`, ascending: the files named exactly as checkpoint_path
/// names them ("step-5.safetensors", a folder, fit's temporary files are not listed, so keep-last
/// never counts or removes them).
inline std::vector<std::size_t> checkpoint_steps(const std::filesystem::path& dir) {
  std::vector<std::size_t> steps;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view prefix = "step-", suffix = ".safetensors";
    if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix))
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::size_t step = std::stoull(digits);
    std::error_code not_a_file;
    if (checkpoint_path(dir, step).filename() == name && entry.is_regular_file(not_a_file))
      steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace detail {

// "loss 0.0123 | mse 0.0123 | relative_l2 0.045" and the JSON fields of the same, for the metrics that apply.
inline std::vector<std::pair<std::string, double>> named_metrics(const eval_metrics& m) {
  std::vector<std::pair<std::string, double>> named;
  for (const auto& [name, value] : {std::pair<std::string, double>{"loss", m.loss},
                                    {"mse", m.mse},
                                    {"relative_l2", m.relative_l2},
                                    {"accuracy", m.accuracy},
                                    {"perplexity", m.perplexity}})
    if (!std::isnan(value) || name == "loss") named.emplace_back(name, value);
  for (const auto& user : m.user) named.push_back(user);
  return named;
}

inline std::string duration_text(double seconds) {
  const auto whole = static_cast<long long>(seconds + 0.5);
  if (whole >= 3600) return fmt::format("{}h{:02}m", whole / 3600, whole % 3600 / 60);
  if (whole >= 60) return fmt::format("{}m{:02}s", whole / 60, whole % 60);
  return fmt::format("{}s", whole);
}

// Refuses (std::invalid_argument, naming the key) a checkpoint whose configuration is not this
// run's: every key that the parts write but progress (the optimizer and its kind, the sampler's
// seed, batch and data size), and the model's parameter count, elements and dtype.
template <class Scalar>
void check_configuration(const io::metadata_map& saved,
                         const io::metadata_map& ours, const io::metadata_map& user, fsdp_engine<Scalar>& engine) {
  std::size_t numel = 0;
  for (const param_info& param : engine.params()) numel += param.numel;
  io::metadata_map expected{{std::string(io::parameters_key), std::to_string(engine.params().size())},
                            {std::string(io::numel_key), std::to_string(numel)}};
  if constexpr (std::is_same_v<Scalar, double> || std::is_same_v<Scalar, float>)
    expected[std::string(io::dtype_key)] = std::is_same_v<Scalar, double> ? "F64" : "F32";
  for (const auto& [key, value] : ours)
    if (key != "fit.step" && key != "sampler.step" && key != "optimizer.step_count" && !user.contains(key))
      expected[key] = value;
  for (const auto& [key, value] : expected) io::check_metadata(saved, key, value);
}

inline void check_options(const fit_options& options, std::size_t ranks) {
  if ((options.steps == 0) == (options.epochs == 0))
    throw std::invalid_argument(
        fmt::format("fit: steps is {} and epochs is {}, expected exactly one of them above 0", options.steps,
                    options.epochs));
  if (options.global_batch == 0 || options.global_batch % ranks != 0)
    throw std::invalid_argument(
        fmt::format("fit: global_batch is {}, expected a positive multiple of the {} ranks",
                    options.global_batch, ranks));
  if (options.eval_every > 0 && !options.eval_data)
    throw std::invalid_argument(fmt::format(
        "fit: eval_every is {}, and eval_data is unset: expected eval_data too", options.eval_every));
  if (options.checkpoint_every > 0 && options.checkpoint_dir.empty())
    throw std::invalid_argument(
        fmt::format("fit: checkpoint_every is {}, and checkpoint_dir is empty: expected a directory too",
                    options.checkpoint_every));
  if (options.keep_last == 0)
    throw std::invalid_argument("fit: keep_last is 0, expected at least 1 (the newest)");
  if (!(options.max_norm >= 0) || std::isinf(options.max_norm))
    throw std::invalid_argument(
        fmt::format("fit: max_norm is {}, expected a finite value >= 0", options.max_norm));
  for (const auto& [key, value] : options.metadata)
    for (const std::string_view reserved : {"fit.", "sampler.", "optimizer", "kfsdp.", "checksum."})
      if (key.starts_with(reserved))
        throw std::invalid_argument(fmt::format(
            "fit: metadata key '{}' starts with '{}', expected a key of your own (fit writes those)", key,
            reserved));
  for (const fit_metric& metric : options.metrics)
    if (metric.name.empty() || !metric.per_sample)
      throw std::invalid_argument(
          fmt::format("fit: a metric named '{}' has {}, expected a name and a per_sample function",
                      metric.name, metric.per_sample ? "a function" : "no function"));
}

}  // namespace detail

/// Trains `trainer` with `optimizer` (any stateful optimizer: adamw, sgd) at lr = schedule(step)
/// over `data` (any io::dataset) as `options` say; collective over the trainer's ranks. Returns how it ended; a
/// NaN or infinite loss throws std::runtime_error naming the step (nothing is saved for it), as
/// does a bad option (std::invalid_argument, naming the field, the value and what is expected).
KFSDP_EXPORT template <class Trainer, class Optimizer, class Schedule, io::dataset Data>
  requires io::stateful<Optimizer, typename Trainer::scalar_type> &&
           std::is_invocable_r_v<double, const Schedule&, std::size_t>
fit_result fit(Trainer& trainer, Optimizer& optimizer, const Schedule& schedule, const Data& data,
               const fit_options& options) {
  using Scalar = typename Trainer::scalar_type;
  detail::trainer_ranks world(trainer.engine());
  const std::size_t rank = std::size_t(world.rank()), ranks = std::size_t(world.size());
  const bool root = rank == 0;
  detail::check_options(options, ranks);
  io::distributed_sampler sampler(data, options.global_batch, options.seed);
  const std::size_t total = options.steps > 0 ? options.steps : sampler.steps_for_epochs(options.epochs);
  const bool checkpoints = !options.checkpoint_dir.empty();
  fit_result result;

  // A checkpoint: the weights, the optimizer's and the sampler's state, the step and the user's keys.
  const auto checkpoint_metadata = [&](std::size_t step) {
    io::metadata_map metadata = options.metadata;
    metadata["fit.step"] = std::to_string(step);
    return metadata;
  };
  const auto save = [&](std::size_t step) {
    const std::filesystem::path path = checkpoint_path(options.checkpoint_dir, step);
    io::save_training_state(path, trainer.engine(), checkpoint_metadata(step), optimizer, sampler);
    result.checkpoint = path;
    if (root) {  // the newest keep_last stay; save_checkpoint returned on every rank, so none is being read
      const std::vector<std::size_t> saved = checkpoint_steps(options.checkpoint_dir);
      for (std::size_t k = 0; k + options.keep_last < saved.size(); ++k) {
        std::error_code ignored;  // a file another process removed first is gone all the same
        std::filesystem::remove(checkpoint_path(options.checkpoint_dir, saved[k]), ignored);
      }
    }
  };

  if (checkpoints) {
    double error[1] = {0};  // an errno: exact in a double, which the trainer's communicator carries
    if (root) {
      std::error_code made;
      std::filesystem::create_directories(options.checkpoint_dir, made);
      error[0] = double(made.value());
    }
    // Also: the directory exists before any rank lists it.
    world.broadcast_from_first(std::span<double>(error));
    if (error[0] != 0)
      throw std::invalid_argument(
          fmt::format("fit: checkpoint_dir is '{}', expected a directory that can be made ({})",
                      options.checkpoint_dir.string(), std::generic_category().message(int(error[0]))));
  }
  if (checkpoints && options.resume) {
    // Rank 0's listing for every rank, newest first: all try the same files in the same order.
    std::vector<std::size_t> listed =
        root ? checkpoint_steps(options.checkpoint_dir) : std::vector<std::size_t>{};
    // As doubles, which the trainer's communicator carries: steps are exact up to 2^53.
    double count[1] = {double(listed.size())};
    world.broadcast_from_first(std::span<double>(count));
    std::vector<double> steps(listed.begin(), listed.end());
    steps.resize(std::size_t(count[0]));
    if (!steps.empty()) world.broadcast_from_first(std::span<double>(steps));
    for (auto newest = steps.rbegin(); newest != steps.rend(); ++newest) {
      const std::filesystem::path path = checkpoint_path(options.checkpoint_dir, std::size_t(*newest));
      io::metadata_map metadata;
      std::size_t step = 0;
      try {
        // Header first: a file of another configuration is refused before its data is read, so
        // that a load error below means a file cut short or corrupted, which is skipped.
        io::checkpoint_state<Scalar> ours{.metadata = checkpoint_metadata(0)};
        optimizer.add_state(ours);
        sampler.add_state(ours);
        detail::check_configuration(io::read_metadata(path, trainer.engine()), ours.metadata, options.metadata,
                                    trainer.engine());
        metadata = io::load_training_state(path, trainer.engine(), optimizer, sampler);
        step = io::metadata_count(metadata, "fit.step");
      } catch (const io::format_error& incomplete) {  // every rank alike
        if (root) fmt::print("fit: skipping {}: {}\n", path.string(), incomplete.what());
        continue;
      } catch (const std::invalid_argument& refused) {  // another configuration, naming the key
        throw std::invalid_argument(fmt::format("fit: resuming from {}: {}", path.string(), refused.what()));
      }
      if (step != sampler.step())
        throw std::invalid_argument(
            fmt::format("fit: {}: 'fit.step' is {} and 'sampler.step' {}, expected equal", path.string(),
                        step, sampler.step()));
      result.resumed_from = step;
      result.checkpoint = path;
      result.metadata = std::move(metadata);
      if (root) fmt::print("fit: resumed from {} at step {}\n", path.string(), step);
      break;
    }
  }

  json_lines metrics(world, "fit: metrics_file", options.metrics_file, /*append=*/result.resumed_from > 0);
  const auto evaluate = [&](std::size_t step) {
    result.eval = detail::evaluate(trainer, options.eval_data, options.metrics, "fit: eval_data");
    const auto named = detail::named_metrics(result.eval);
    std::vector<json_field> fields{{"step", step}};
    std::string line = fmt::format("fit: eval at step {}", step);
    for (const auto& [name, value] : named) {
      fields.emplace_back("eval_" + name, value);
      line += fmt::format(" | {} {:.6g}", name, value);
    }
    metrics.write(fields);
    if (root) fmt::print("{}\n", line);
  };

  const std::size_t log_every =
      options.log_every > 0 ? options.log_every : std::max<std::size_t>(1, total / 10);
  const stop_signals signals;  // train/preemption.hpp, as the example programs stop
  std::size_t step = sampler.step(), last_saved = result.resumed_from > 0 ? step : total + 1,
              logged_step = step;
  auto logged_time = std::chrono::steady_clock::now(), step_started = logged_time;
  while (step < total) {
    // One agreement per step: a signal seen by any rank stops every rank at the same boundary.
    if (signals.stop_requested(world)) {
      if (checkpoints && last_saved != step) save(step);
      if (checkpoints) mark_stopped(options.checkpoint_dir, step, root);  // "checkpoints.stopped": requeue me
      result.preempted = true;
      if (root)
        fmt::print("fit: stopped by a signal at step {}{}\n", step,
                   checkpoints ? fmt::format(", checkpoint {}", result.checkpoint.string()) : std::string());
      break;
    }
    const double lr = schedule(step);
    optimizer.set_lr(lr);
    auto [x, y] = sampler.next<Scalar>(data, rank, ranks);
    step_result stepped;
    try {
      stepped = trainer.step({typename Trainer::batch{x, detail::targets_of<Trainer>(y)}}, optimizer,
                             options.max_norm);
    } catch (const non_finite_loss& diverged) {  // every rank alike: the sums are global
      throw std::runtime_error(
          fmt::format("fit: step {} of {} (lr {}): {}", step + 1, total, lr, diverged.what()));
    }
    ++step;
    result.loss = stepped.loss;
    const auto now = std::chrono::steady_clock::now();
    const double step_seconds = std::chrono::duration<double>(now - step_started).count();
    step_started = now;
    metrics.write({{"step", step},
                   {"epoch", sampler.epoch()},
                   {"loss", stepped.loss},
                   {"grad_norm", stepped.grad_norm},
                   {"lr", lr},
                   {"samples_per_s", double(options.global_batch) / step_seconds},
                   {"step_time_s", step_seconds}});
    if (root && (step % log_every == 0 || step == total)) {
      // The rate over the steps since the last line (evaluations and checkpoints included).
      const double seconds_per_step =
          std::chrono::duration<double>(now - logged_time).count() / double(step - logged_step);
      fmt::print("fit: step {}/{} | epoch {:.2f} | loss {:.6g} | lr {:.3g} | {:.0f} samples/s | eta {}\n", step,
                 total, sampler.epoch(), stepped.loss, lr, double(options.global_batch) / seconds_per_step,
                 detail::duration_text(seconds_per_step * double(total - step)));
      std::fflush(stdout);
      logged_step = step;
      logged_time = now;
    }
    if (options.eval_every > 0 && step % options.eval_every == 0 && step < total) evaluate(step);
    if (options.checkpoint_every > 0 && step % options.checkpoint_every == 0 && step < total) {
      save(step);
      last_saved = step;
    }
  }
  result.step = step;
  if (!result.preempted) {
    if (options.eval_data) evaluate(step);
    if (checkpoints && last_saved != step) save(step);
    if (checkpoints) mark_finished(options.checkpoint_dir, root);  // a requeued run that finishes clears it
  }
  return result;
}

}  // namespace kfsdp
