// train_gpt — the main job: trains the example GPT (nanoGPT layout, byte vocabulary) with FSDP.
//
//   mpirun -np 2 build/examples/train_gpt --data data/kjv-genesis-exodus.txt
//
// Every rank holds 1/N of the parameters, gradients and optimizer state; each step all-gathers
// the buckets it needs unit by unit (each block; the rest is the root) and reduce-scatters the
// gradients (see README.md). The model is one descriptor (kfsdp::make_gpt); kfsdp::trainer trains it.
// One line per step: step, loss, tokens/s, per-rank memory (shards, unsharded peak, and the peak of
// the layers' activations, measured), bytes communicated; --metrics F writes the same per step as
// JSON lines (examples/metrics.hpp).

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/comm/threaded.hpp>
#ifdef KFSDP_HAVE_NCCL
#include <kfsdp/comm/nccl.hpp>
#endif
#include <kfsdp/environment.hpp>
#include <kfsdp/fsdp/memory_fit.hpp>
#include <kfsdp/io/checkpoint.hpp>
#include <kfsdp/io/text_dataset.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/sgd.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/trainer.hpp>
#endif

#include "cli.hpp"
#include "metrics.hpp"
#include "mpi_program.hpp"

namespace {

using kfsdp::examples::cli;

struct settings {
  std::string data, save, load, trace, resume, metrics;
  std::size_t save_every = 0;
  std::string backend;
  std::size_t hybrid_shard = 0;  // ranks per shard group (HSDP); 0: flat
  bool hybrid_node = false;      // --hybrid-shard node: a shard group per node
  bool overlap = true;
  kfsdp::trainer_options training;
  kfsdp::gpt_config model;
  std::size_t batch, steps, grad_accum, eval_windows, sample_bytes, log_every;
  double lr, momentum, weight_decay, clip;
  std::string optimizer, dtype;
  std::uint64_t seed;
  kfsdp::io::window_sampling sampling;
  kfsdp::grad_accumulation accumulation;
  kfsdp::fsdp_options fsdp;
};

cli make_cli() {
  cli c("train_gpt", "train the example GPT with FSDP (run under mpirun)");
  kfsdp::examples::add_gpt_flags(c)
      .flag("steps", "400", "optimizer steps")
      .flag("lr", "0.002", "learning rate")
      .flag("optimizer", "adamw", "adamw | sgd")
      .flag("momentum", "0.9", "SGD momentum")
      .flag("weight-decay", "0.01", "weight decay (AdamW decoupled, SGD L2)")
      .flag("clip", "1.0", "clip the global gradient norm to this (0: off)")
      .flag("sampling", "random", "random | sequential windows")
      .flag("sharding", "zero2", "zero2 | zero3")
      .flag("bucketing", "block", "none | layer | block")
      .flag("grad-accum", "1", "micro-batches per step (each of --batch windows)")
      .flag("grad-accum-mode", "unsharded", "unsharded (no_sync: reduce once) | sharded (reduce every micro-batch)")
      .flag("broadcast-from", "", "rank whose initial weights everyone starts from")
      .flag("param-dtype", "scalar", "what the all-gathered parameters travel in: scalar (--dtype) | bf16 | f16")
      .flag("reduce-dtype", "scalar", "what the gradient reduce-scatters travel in: scalar (--dtype) | bf16 | f16")
      .flag("hybrid-shard", "0", "HSDP: shard within groups of this many consecutive ranks, or within each node (node), "
                                 "replicate across groups (0: flat FSDP)")
      .flag("gradient-division", "after", "where gradients are divided by the ranks around the SUM: after | before | split (FSDP1)")
      .flag("save", "", "write weights + optimizer state here (safetensors) at the end")
      .flag("save-every", "0", "with --save: also every k steps (0: only at the end)")
      .flag("resume", "", "continue the run saved in this checkpoint (weights, optimizer, step)")
      .flag("load", "", "start from these weights (safetensors)")
      .flag("eval", "0", "with --load: print eval_loss over the first W windows and exit")
      .flag("sample", "200", "bytes of generated text printed at the end (0: none)")
      .flag("log-every", "1", "print every k-th step")
      .flag("metrics", "", "write one JSON line per step here (rank 0; loss, tokens/s, memory, comm bytes; overwritten)")
      .flag("trace", "", "write a Chrome/Perfetto timeline of the steps here (one file per rank: FILE.rank<r>.json)")
      .flag("backend", "mpi", "mpi | nccl (one GPU per rank; needs a CUDA build of Kokkos)")
      .flag("checkpointing", "off", "on: activation checkpointing per block (recomputed in backward) | off");
  kfsdp::examples::add_schedule_flags(c, "off");
  return c;
}

settings read(const cli& c, int world_size) {
  settings s;
  s.data = c.str("data");
  s.model = kfsdp::examples::gpt_config_of(c);
  s.batch = c.size("batch");
  s.steps = c.size("steps");
  s.grad_accum = c.size("grad-accum");
  s.eval_windows = c.size("eval");
  s.sample_bytes = c.size("sample");
  s.log_every = std::max<std::size_t>(1, c.size("log-every"));
  s.lr = c.real_at_least("lr", 0);
  s.momentum = c.real_at_least("momentum", 0);
  s.weight_decay = c.real_at_least("weight-decay", 0);
  s.clip = c.real_at_least("clip", 0);
  s.optimizer = c.choice("optimizer", {"adamw", "sgd"});
  s.dtype = c.choice("dtype", {"f32", "f64"});
  s.seed = c.size("seed");
  s.sampling = kfsdp::io::parse_sampling(c.str("sampling"));
  s.accumulation = kfsdp::parse_grad_accumulation(c.str("grad-accum-mode"));
  s.fsdp.sharding_strategy = kfsdp::parse_sharding(c.str("sharding"));
  s.fsdp.bucketing_strategy = kfsdp::parse_bucketing(c.str("bucketing"));
  if (!c.str("broadcast-from").empty()) s.fsdp.broadcast_from = static_cast<int>(c.size("broadcast-from"));
  s.fsdp.gradient_division = kfsdp::parse_gradient_division(c.str("gradient-division"));
  s.hybrid_node = c.str("hybrid-shard") == "node";
  s.hybrid_shard = s.hybrid_node ? 0 : c.size("hybrid-shard");
  s.fsdp.param_dtype = kfsdp::parse_wire_precision(c.str("param-dtype"));
  s.fsdp.reduce_dtype = kfsdp::parse_wire_precision(c.str("reduce-dtype"));
  s.overlap = kfsdp::examples::read_schedule_flags(c, s.fsdp);
  s.trace = c.str("trace");
  s.metrics = c.str("metrics");
  s.training.checkpointing = c.choice("checkpointing", {"on", "off"}) == "on";
  s.backend = c.choice("backend", {"mpi", "nccl"});
  s.save = c.str("save");
  s.save_every = c.size("save-every");
  s.resume = c.str("resume");
  s.load = c.str("load");
  auto fail = [](const std::string& m) { throw std::invalid_argument("train_gpt: " + m); };
  if (s.eval_windows == 0 && (s.batch == 0 || s.batch % std::size_t(world_size) != 0))
    fail(fmt::format("--batch is {}, expected a positive multiple of the {} ranks", s.batch, world_size));
  if (s.grad_accum == 0) fail("--grad-accum is 0, expected at least 1");
  if (s.eval_windows > 0 && s.load.empty()) fail("--eval needs --load FILE (the weights to evaluate)");
  if (!s.resume.empty() && !s.load.empty()) fail("--resume and --load both given: --resume restores the weights too");
  if (s.save_every > 0 && s.save.empty()) fail("--save-every needs --save FILE");
  if (s.eval_windows > 0 && !s.metrics.empty()) fail("--metrics and --eval both given: --eval trains no steps");
  if (s.hybrid_shard > 0 && std::size_t(world_size) % s.hybrid_shard != 0)
    fail(fmt::format("--hybrid-shard is {}, expected a divisor of the {} ranks", s.hybrid_shard, world_size));
  if ((s.hybrid_shard > 0 || s.hybrid_node) && s.backend != "mpi") fail("--hybrid-shard works with --backend mpi only for now");
  return s;
}

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

// The flags that size a rank's memory, for the message of a model that does not fit.
std::string sizing_flags(const settings& s) {
  return fmt::format("--layers {} --dim {} --heads {} --seq {} --batch {} --dtype {} --optimizer {} --sharding {} "
                     "--checkpointing {}",
                     s.model.layers, s.model.dim, s.model.heads, s.model.seq, s.batch, s.dtype, s.optimizer,
                     kfsdp::to_string(s.fsdp.sharding_strategy), s.training.checkpointing ? "on" : "off");
}

// Stops, before anything is allocated, a model that cannot fit this rank's share of its node's
// memory: the need per rank from the shard plan, with the activations measured for this GPT (per
// token, about twice what the blocks keep for backward: 18·dim + heads·seq per block, or one block
// plus each block's input with --checkpointing, and the logits). Every rank decides alike.
// Returns the estimate (zero where the shards live on a GPU: only the host's memory is known here).
template <class Scalar>
kfsdp::memory_need check_fits(const settings& s, kfsdp::comm::mpi& world) {
  const double ws = double(world.size()), bytes = sizeof(Scalar), d = double(s.model.dim), layers = double(s.model.layers);
  const double shard_ranks = s.hybrid_shard > 0 ? double(s.hybrid_shard) : ws;  // what the parameters are split over
  const std::size_t states = s.optimizer == "adamw" ? 2 : (s.momentum > 0 ? 1 : 0);
  const int node_ranks = world.ranks_on_node();  // collective: once, on every rank, before any verdict
  const double available = kfsdp::available_host_memory() / double(node_ranks);
  double verdict[1] = {0};  // how many ranks the model does not fit
  const auto refuse = [&](const std::string& need) {
    verdict[0] = 1;
    kfsdp::comm::all_reduce_sum(world, std::span<double>(verdict));
    throw std::invalid_argument(fmt::format(
        "train_gpt: the model does not fit: it needs {} per rank, and {} of memory is available to each of the {} "
        "ranks on this node; set by {} (more ranks, --sharding zero3, --checkpointing on or smaller sizes need less)",
        need, kfsdp::format_bytes(available), node_ranks, sizing_flags(s)));
  };
  // A first bound from the sizes alone, before the parameter table (12·dim² per block) is built.
  const double table_bytes = layers * 16 * 2 * sizeof(kfsdp::param_info);  // the table and the plan, ~16 entries a block
  const double quick = layers * 12 * d * d * bytes * double(2 + states) / shard_ranks + table_bytes;
  if (quick > available) refuse(fmt::format("more than {}", kfsdp::format_bytes(quick)));
  kfsdp::memory_need need;
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>) {
    const auto table = kfsdp::make_param_table(kfsdp::make_gpt(s.model));
    const auto plan = kfsdp::make_shard_plan(table, s.hybrid_shard > 0 ? s.hybrid_shard : std::size_t(world.size()),
                                             s.fsdp.bucketing_strategy);
    const auto units = kfsdp::make_units(table, plan, s.fsdp.wrap);
    const double block = 18 * d + double(s.model.heads) * double(s.model.seq);
    const double per_token = 2 * ((s.training.checkpointing ? block + layers * d : layers * block) + 2 * double(s.model.vocab));
    const double tokens = double(s.batch) / ws * double(s.model.seq);
    need = kfsdp::estimate_memory(plan, units, sizeof(Scalar), states, s.fsdp, per_token * tokens * bytes);
    if (need.total() > available) refuse(kfsdp::describe(need));
  }
  kfsdp::comm::all_reduce_sum(world, std::span<double>(verdict));
  if (verdict[0] > 0)
    throw std::invalid_argument(fmt::format("train_gpt: the model does not fit the memory of another rank's node; set by {}",
                                            sizing_flags(s)));
  return need;
}

// The model's configuration as a checkpoint's metadata records it: a file holds weights for one
// configuration only (heads, say, change no shape, but every attention's meaning).
std::vector<std::pair<std::string, std::string>> model_config(const kfsdp::gpt_config& model) {
  return {{"layers", std::to_string(model.layers)}, {"dim", std::to_string(model.dim)},
          {"heads", std::to_string(model.heads)},   {"seq", std::to_string(model.seq)},
          {"vocab", std::to_string(model.vocab)},   {"tie_weights", model.tie_weights ? "on" : "off"}};
}

// Refuses a file saved for another configuration, naming the field, before its weights are read.
// A file that records no configuration (a plain safetensors file) passes unless it is `required`.
void check_model_config(const std::string& flag, const std::string& path, const settings& s, kfsdp::comm::mpi& world,
                        bool required) {
  const kfsdp::io::metadata_map metadata = kfsdp::io::read_metadata(path, world);
  for (const auto& [field, value] : model_config(s.model)) {
    auto saved = metadata.find(field);
    std::string found = saved != metadata.end() ? saved->second : std::string();
    if (field == "tie_weights" && saved == metadata.end() && metadata.contains("layers"))  // saved before the key
      found = metadata.contains("tied") ? "on" : "off";
    if (found.empty() && !required) continue;
    if (found.empty())
      throw std::invalid_argument(fmt::format("train_gpt: {} {}: no '{}' in its metadata (not written by train_gpt --save)",
                                              flag, path, field));
    if (found != value)
      throw std::invalid_argument(fmt::format("train_gpt: checkpoint {} ({}) was saved with {} = {}, this model has {} = {}",
                                              path, flag, field, found, field, value));
  }
}

template <class Scalar>
int run(const settings& given, kfsdp::comm::mpi& world, kfsdp::examples::metrics_file& metrics) {
  settings s = given;
  if (s.hybrid_node) {  // a shard group per node: every node must hold as many ranks
    s.hybrid_shard = std::size_t(world.ranks_on_node());
    kfsdp::comm::check_agreement(world, s.hybrid_shard, "the ranks per node (--hybrid-shard node)");
  }
  const kfsdp::memory_need need = check_fits<Scalar>(s, world);
  const bool root = world.rank() == 0;
  const auto data = kfsdp::io::text_windows::from_file(s.data, s.model.seq);
  const auto model = kfsdp::make_gpt(s.model);
  if (!s.resume.empty()) check_model_config("--resume", s.resume, s, world, /*required=*/true);
  if (!s.load.empty()) check_model_config("--load", s.load, s, world, /*required=*/false);
  const std::size_t ws = std::size_t(world.size());

  // HSDP: shard groups of consecutive ranks, or the ranks of each node; across them, the ranks
  // holding the same shard (the same rank in their group).
  const int group = int(s.hybrid_shard);
  std::optional<kfsdp::comm::mpi> shard_group, replicas;
  if (group > 0) {
    shard_group.emplace(s.hybrid_node ? world.split_shared() : world.split(world.rank() / group, world.rank()));
    replicas.emplace(world.split(shard_group->rank(), world.rank()));
  }
  kfsdp::comm::mpi& sharding = shard_group ? *shard_group : world;
  // Overlap: the engine's collectives go through a worker thread that keeps them progressing.
  kfsdp::comm::threaded overlapped(sharding);
  kfsdp::comm::any_communicator engine_comm = s.overlap ? kfsdp::comm::any_communicator(overlapped)
                                                        : kfsdp::comm::any_communicator(sharding);
  kfsdp::fsdp_options options = s.fsdp;
  if (replicas) options.replica_group = kfsdp::comm::any_communicator(*replicas);
#ifdef KFSDP_HAVE_NCCL
  std::optional<kfsdp::comm::nccl> gpus;
  if (s.backend == "nccl") {
    gpus.emplace(world);  // the GPU of this rank's node-local index; throws clearly without one
    if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>)
      throw std::invalid_argument("train_gpt: --backend nccl needs Kokkos built with CUDA (the shards must live on the GPU)");
    engine_comm = kfsdp::comm::any_communicator(*gpus);
    options.device = gpus->device();
  }
#else
  if (s.backend == "nccl") throw std::invalid_argument("train_gpt: this build has no NCCL backend (configure with -Dnccl=enabled)");
#endif
  kfsdp::trace_recorder trace(world.rank());
  return kfsdp::with_trainer<Scalar>(model, engine_comm, options, s.training, [&](auto& trainer) {
    auto& engine = trainer.engine();
    using batch = typename std::remove_reference_t<decltype(trainer)>::batch;
    if (!s.trace.empty()) engine.set_trace(&trace);
    if (s.load.empty())
      trainer.initialize(s.seed, kfsdp::gpt2_init(s.model.layers));
    else if (!kfsdp::io::load_model(s.load, engine, sharding).contains(std::string(kfsdp::io::header_checksum_key)) &&
             world.rank() == 0)
      fmt::print("train_gpt: {} has no kfsdp checksums (a standard safetensors file): its layout was "
                 "checked, its data could not be verified\n", s.load);

    if (s.eval_windows > 0) {  // evaluation only: this rank's windows are rank, rank + N, ...
      double totals[2] = {0, 0};  // the sum of per-byte losses, the bytes
      trainer.with_full_model([&] {  // ranks hold different counts of windows: gather once, compute locally
        for (std::size_t w = std::size_t(world.rank()); w < std::min(s.eval_windows, data.count()); w += ws) {
          std::vector<int> tokens, targets;
          data.append(w, tokens, targets);
          totals[0] += trainer.forward_loss({kfsdp::device_ids(tokens), kfsdp::device_ids(targets)}) * double(tokens.size());
          totals[1] += double(tokens.size());
        }
      });
      kfsdp::comm::all_reduce_sum(world, std::span<double>(totals));
      if (root) fmt::print("eval_loss {:.12g}\n", totals[0] / totals[1]);
      return 0;
    }

    const std::size_t shard = engine.plan().shard_numel;
    std::variant<kfsdp::optim::adamw<Scalar>, kfsdp::optim::sgd<Scalar>> optimizer =
        s.optimizer == "adamw"
            ? decltype(optimizer)(std::in_place_index<0>, shard,
                                  kfsdp::optim::adamw_options{.lr = s.lr, .weight_decay = s.weight_decay})
            : decltype(optimizer)(std::in_place_index<1>, shard,
                                  kfsdp::optim::sgd_options{.lr = s.lr, .momentum = s.momentum, .weight_decay = s.weight_decay});
    const std::size_t optimizer_bytes = (s.optimizer == "adamw" ? 2 : (s.momentum > 0 ? 1 : 0)) * shard * sizeof(Scalar);

    // A checkpoint: the weights, then the optimizer's state through the checkpoint protocol
    // (io/stateful.hpp: its moments or momentum, its kind, its step count) and the progress.
    auto optimizer_state = [&](kfsdp::io::checkpoint_state<Scalar>& state) {
      std::visit([&](const auto& opt) { opt.add_state(state); }, optimizer);
    };
    auto save = [&](std::size_t steps_done) {
      kfsdp::io::checkpoint_state<Scalar> state{
          .metadata = {{"format", "pt"}, {"step", std::to_string(steps_done)}, {"seed", std::to_string(s.seed)}}};
      optimizer_state(state);
      for (const auto& [field, value] : model_config(s.model)) state.metadata[field] = value;  // checked on --resume, --load
      // A tied parameter is stored once, under its owner's name; the metadata says which.
      if (s.model.tie_weights) state.metadata["tied"] = "lm_head.weight=transformer.wte.weight";
      // Under HSDP the first shard group writes the (flat) file; every group resumes from it.
      kfsdp::io::save_checkpoint(s.save, engine, sharding, state);
    };
    std::size_t first_step = 0;
    if (!s.resume.empty()) {
      kfsdp::io::checkpoint_state<Scalar> state;
      optimizer_state(state);  // its views are restored in place
      kfsdp::io::load_checkpoint(s.resume, engine, sharding, state);  // every shard group reads the same file
      // Files saved before the protocol kept AdamW's step count only as the run's step.
      if (!state.metadata.contains("optimizer.step_count") && state.metadata.contains("step"))
        state.metadata["optimizer.step_count"] = state.metadata["step"];
      try {
        std::visit([&](auto& opt) { opt.restore_state(state.metadata); }, optimizer);
        first_step = kfsdp::io::metadata_count(state.metadata, "step");  // windows are keyed by step: the data resumes too
      } catch (const std::invalid_argument& refused) {
        throw std::invalid_argument(fmt::format("train_gpt: --resume {}: {}", s.resume, refused.what()));
      }
      if (root) fmt::print("resumed {} at step {}\n", s.resume, first_step);
    }

    if (root)
      fmt::print("train_gpt: {} ranks, {} ({} parameters, {} per rank), {} / {} bucketing ({} buckets), {}, "
                 "batch {} x {} windows of {} bytes, {} windows in {}\n",
                 ws, s.dtype, engine.plan().full_numel, shard, kfsdp::to_string(s.fsdp.sharding_strategy),
                 kfsdp::to_string(s.fsdp.bucketing_strategy), engine.plan().buckets.size(), s.optimizer,
                 s.grad_accum, s.batch, s.model.seq + 1, data.count(), s.data);
    if (root && need.total() > 0) fmt::print("train_gpt: estimated memory per rank {}\n", kfsdp::describe(need));
    const bool terminal = root && isatty(STDERR_FILENO);
    std::vector<batch> batches(s.grad_accum);
    double first_loss = 0, last_loss = 0;
    for (std::size_t step = first_step; step < s.steps; ++step) {
      for (std::size_t k = 0; k < s.grad_accum; ++k) {
        std::vector<int> tokens, targets;
        data.rank_slice(data.micro_batch(s.sampling, s.seed, step * s.grad_accum + k, s.batch),
                        std::size_t(world.rank()), ws, tokens, targets);
        batches[k] = {kfsdp::device_ids(tokens), kfsdp::device_ids(targets)};
      }
      const std::size_t bytes_before = engine.bytes_communicated();
      engine.reset_peak_memory();
      const auto start = std::chrono::steady_clock::now();
      kfsdp::step_result r;
      try {
        r = std::visit([&](auto& opt) { return trainer.step(std::span<const batch>(batches), opt, s.clip, s.accumulation); },
                       optimizer);
      } catch (const kfsdp::non_finite_loss& diverged) {  // every rank alike; nothing more is saved
        throw std::runtime_error(fmt::format("train_gpt: step {}/{}: {} (--lr {}, --clip {})", step + 1, s.steps,
                                             diverged.what(), s.lr, s.clip));
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (metrics)
        metrics.write_step({.step = step + 1, .loss = r.loss, .grad_norm = r.grad_norm, .lr = s.lr,
                            .throughput_key = "tokens_per_s",
                            .throughput = double(s.grad_accum * s.batch * s.model.seq) / seconds,
                            .step_time_s = seconds, .memory = engine.memory(), .optimizer_bytes = optimizer_bytes,
                            .activation_peak_bytes = trainer.peak_activation_bytes(),
                            .comm_bytes = engine.bytes_communicated() - bytes_before});
      if (step == first_step) first_loss = r.loss;
      last_loss = r.loss;
      if (root && (step % s.log_every == 0 || step + 1 == s.steps)) {
        const auto m = engine.memory();
        if (terminal) fmt::print(stderr, "\r\033[K");
        fmt::print("step {:>4}/{} | loss {:.6f} | {:>7.0f} tokens/s | memory/rank {} (params {}, grads {}, optimizer {}, "
                   "unsharded peak {}) | activations {} | comm {}\n",
                   step + 1, s.steps, r.loss, double(s.grad_accum * s.batch * s.model.seq) / seconds,
                   mib(double(m.sharded_params + m.sharded_grads + optimizer_bytes + m.unsharded_peak)),
                   mib(double(m.sharded_params)), mib(double(m.sharded_grads)), mib(double(optimizer_bytes)),
                   mib(double(m.unsharded_peak)), mib(double(trainer.peak_activation_bytes())),
                   mib(double(engine.bytes_communicated() - bytes_before)));
        std::fflush(stdout);
      }
      if (s.save_every > 0 && (step + 1) % s.save_every == 0 && step + 1 < s.steps) {
        save(step + 1);
        if (root) fmt::print("saved {} at step {}\n", s.save, step + 1);  // one line per save
      }
      if (terminal) {
        const std::size_t width = 40, done = (step + 1) * width / s.steps;
        fmt::print(stderr, "\r[{}{}] {}/{}", std::string(done, '#'), std::string(width - done, '.'), step + 1, s.steps);
        std::fflush(stderr);
      }
    }
    if (terminal) fmt::print(stderr, "\r\033[K");
    if (!s.trace.empty()) {
      engine.set_trace(nullptr);
      const std::string file = fmt::format("{}.rank{}.json", s.trace, world.rank());
      trace.write(file);
      if (root) fmt::print("trace: {} events per rank in {}.rank<r>.json\n", trace.size(), s.trace);
    }
    if (root && s.steps > first_step) fmt::print("loss {:.4f} -> {:.4f}\n", first_loss, last_loss);

    if (!s.save.empty()) {
      save(std::max(s.steps, first_step));
      if (root) fmt::print("saved {}\n", s.save);
    }
    if (s.sample_bytes > 0) {
      const std::string text =
          kfsdp::generate(trainer, s.model, "And God said", s.sample_bytes, {.temperature = 0.8, .seed = s.seed});
      std::string printable = text;  // an undertrained byte model may emit bytes a terminal cannot show
      for (char& c : printable)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || static_cast<unsigned char>(c) >= 0x7f) c = '?';
      if (root) fmt::print("sample:\n{}\n", printable);
    }
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  return kfsdp::examples::mpi_program(argc, argv, [&](kfsdp::comm::mpi& world) {
    cli c = make_cli();
    if (!c.parse(argc, argv)) return 0;
    const settings s = read(c, world.size());
    kfsdp::examples::metrics_file metrics("train_gpt", s.metrics, world);  // before any step: a bad path stops every rank
    return s.dtype == "f32" ? run<float>(s, world, metrics) : run<double>(s, world, metrics);
  });
}
