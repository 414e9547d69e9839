// train_gpt — the main job: trains the example GPT (nanoGPT layout, byte vocabulary) with FSDP.
//
//   mpirun -np 2 build/examples/train_gpt --data data/kjv-genesis-exodus.txt
//   mpirun -np 2 build/examples/train_gpt --data 'corpus_train_*.bin' --val-data corpus_val_000000.bin --vocab 50257
//
// Every rank holds 1/N of the parameters, gradients and optimizer state; each step all-gathers
// the buckets it needs unit by unit (each block; the rest is the root) and reduce-scatters the
// gradients (see docs/semantics.md). The model is one descriptor (kfsdp::make_gpt); kfsdp::trainer trains it.
// kfsdp::step_log prints a line per step (loss, tokens/s, per-rank memory, bytes communicated) and
// --metrics F writes the same as JSON lines.

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/comm/threaded/threaded.hpp>
#ifdef KFSDP_HAVE_NCCL
#include <kfsdp/comm/nccl/nccl.hpp>
#endif
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/optim/any_optimizer.hpp>
#include <kfsdp/session.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/step_log.hpp>
#include <kfsdp/train/trainer.hpp>
#endif

#include "cli.hpp"
#include "text_training.hpp"

namespace {

using kfsdp::examples::cli;

struct settings {
  std::string data, save, load, trace, resume, backend, dtype;
  std::size_t save_every, hybrid_shard, batch, eval_windows, sample_bytes;
  std::uint64_t seed;
  kfsdp::gpt_config model;
  kfsdp::examples::text_training training;  // steps, optimizer, clipping, sampling, accumulation, logging
  kfsdp::examples::fsdp_flags flags;  // sharding, bucketing, checkpointing, wire dtypes, overlap
};

cli make_cli() {
  cli c("train_gpt", "train the example GPT with FSDP (run under mpirun)");
  kfsdp::examples::add_token_data_flags(kfsdp::examples::add_text_training_flags(kfsdp::examples::add_gpt_flags(c)))
      .flag("hybrid-shard", "0", "HSDP: shard within groups of this many consecutive ranks, or within each node (node), "
                                 "replicate across groups (0: flat FSDP)")
      .flag("save", "", "write weights + optimizer state here (safetensors) at the end")
      .flag("save-every", "0", "with --save: also every k steps (0: only at the end)")
      .flag("resume", "", "continue the run saved in this checkpoint (weights, optimizer, step)")
      .flag("load", "", "start from these weights (safetensors)")
      .flag("eval", "0", "with --load: print eval_loss over the first W windows and exit")
      .flag("sample", "200", "bytes of generated text printed at the end, one forward pass each (0: none; at most 65536; "
                             "text data with --vocab 256 only)");
  kfsdp::examples::add_step_log_flags(c)
      .flag("trace", "", "write a Chrome/Perfetto timeline of the steps here (one file per rank: FILE.rank<r>.json)")
      .flag("backend", "mpi", "mpi | nccl (one GPU per rank; needs a CUDA build of Kokkos)");
  kfsdp::examples::add_fsdp_flags(c, "zero2", "block");
  return c;
}

settings read(const cli& c, int world_size) {
  settings s{.data = c.str("data"), .save = c.str("save"), .load = c.str("load"), .trace = c.str("trace"),
             .resume = c.str("resume"), .backend = c.choice("backend", {"mpi", "nccl"}),
             .dtype = c.choice("dtype", {"f32", "f64"}), .save_every = c.size("save-every"),
             .hybrid_shard = c.str("hybrid-shard") == "node" ? kfsdp::shard_per_node : c.size("hybrid-shard"),
             .batch = c.size("batch"), .eval_windows = c.size("eval"), .sample_bytes = c.size("sample", 65536),
             .seed = c.size("seed"), .model = kfsdp::examples::gpt_config_of(c),
             .training = kfsdp::examples::text_training_of(c), .flags = kfsdp::examples::fsdp_flags_of(c)};
  auto fail = [](const std::string& m) { throw std::invalid_argument("train_gpt: " + m); };
  if (s.eval_windows == 0 && (s.batch == 0 || s.batch % std::size_t(world_size) != 0))
    fail(fmt::format("--batch is {}, expected a positive multiple of the {} ranks", s.batch, world_size));
  if (s.eval_windows > 0 && s.load.empty()) fail("--eval needs --load FILE (the weights to evaluate)");
  if (!s.resume.empty() && !s.load.empty()) fail("--resume and --load both given: --resume restores the weights too");
  if (s.save_every > 0 && s.save.empty()) fail("--save-every needs --save FILE");
  if (s.eval_windows > 0 && !s.training.metrics.empty()) fail("--metrics and --eval both given: --eval trains no steps");
  if (s.hybrid_shard > 0 && s.backend != "mpi") fail("--hybrid-shard works with --backend mpi only for now");
  return s;
}

// The flags that size a rank's memory, for the message of a model that does not fit.
std::string sizing_flags(const settings& s) {
  return fmt::format("--layers {} --dim {} --heads {} --seq {} --batch {} --dtype {} --optimizer {} --sharding {} "
                     "--checkpointing {} (more ranks, --sharding zero3, --checkpointing on or smaller sizes need less)",
                     s.model.layers, s.model.dim, s.model.heads, s.model.seq, s.batch, s.dtype, s.training.optimizer.kind,
                     kfsdp::to_string(s.flags.fsdp.sharding()), s.flags.checkpointing ? "on" : "off");
}

template <class Scalar>
int run(const settings& s, const cli& c, kfsdp::session& job) {
  kfsdp::comm::mpi& world = job.world();
  job.set_hybrid_shard(s.hybrid_shard);  // HSDP: shard within groups, replicate across them
  const std::size_t ws = std::size_t(world.size());
  const bool root = job.is_root();
  // Stops, before anything is allocated, a model that cannot fit this rank's share of its node's memory.
  const kfsdp::memory_need need = kfsdp::estimate_gpt_memory(
      s.model,
      {.scalar_bytes = sizeof(Scalar), .shard_ranks = std::size_t(job.shard_group().size()), .windows_per_rank = s.batch / ws,
       .optimizer_states = s.training.optimizer.states(),
       .checkpointing = s.flags.checkpointing, .fsdp = s.flags.fsdp},
      job.host_memory_per_rank());
  job.require_memory(need, sizing_flags(s));
  // Memory-mapped: each rank reads only its windows, checked against the model's vocabulary.
  const kfsdp::examples::window_data windows = kfsdp::examples::open_window_data(c, s.model.seq, s.model.vocab);
  const kfsdp::io::token_windows& data = windows.train;
  // A checkpoint records the model's configuration; one saved for another is refused, naming the field.
  const auto config = kfsdp::gpt_metadata(s.model);
  for (const auto& [flag, path] : {std::pair<std::string, std::string>{"--resume", s.resume}, {"--load", s.load}}) {
    if (path.empty()) continue;
    const kfsdp::io::metadata_map saved = kfsdp::io::read_metadata(path, world);
    kfsdp::io::check_config(saved, config, /*required=*/flag == "--resume", fmt::format("train_gpt: checkpoint {} ({}) ", path, flag));
    if (flag == "--resume") try {  // windows are drawn by step from the seed and the batch: others would train on others
        kfsdp::io::check_metadata(saved, "seed", std::to_string(s.seed));
        kfsdp::io::check_metadata(saved, "batch", std::to_string(s.batch));
      } catch (const std::invalid_argument& other_run) {
        throw std::invalid_argument(fmt::format("train_gpt: --resume {}: {}: resume with the --seed and --batch it was saved with",
                                                path, other_run.what()));
      }
  }
  // Overlap: the engine's collectives go through a worker thread that keeps them progressing, or
  // the compute thread polls them between kernels.
  kfsdp::comm::threaded overlapped(job.shard_group());
  auto overlap = kfsdp::examples::overlap_of(s.flags.overlap, job);
  kfsdp::comm::any_communicator engine_comm = overlap == kfsdp::examples::overlap_mode::thread
                                                  ? kfsdp::comm::any_communicator(overlapped)
                                                  : kfsdp::comm::any_communicator(job.shard_group());
  kfsdp::fsdp_options options = job.fsdp(s.flags.fsdp);
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
  const kfsdp::trainer_options training{.checkpointing = s.flags.checkpointing};
  kfsdp::trainer<kfsdp::gpt_descriptor, Scalar> trainer(kfsdp::make_gpt(s.model), engine_comm, options, training);
  auto& engine = trainer.engine();
  engine.set_progress_between_kernels(overlap == kfsdp::examples::overlap_mode::poll);
  if (!s.trace.empty()) engine.set_trace(&trace);
  if (s.load.empty())
    trainer.initialize(s.seed, kfsdp::gpt2_init(s.model.layers));
  else if (!kfsdp::io::load_model(s.load, engine).contains(std::string(kfsdp::io::header_checksum_key)) &&
           root)
    fmt::print("train_gpt: {} has no kfsdp checksums (a standard safetensors file): its layout was "
               "checked, its data could not be verified\n", s.load);

  if (s.eval_windows > 0) {  // evaluation only
    const double loss = kfsdp::evaluate_windows(trainer, data, s.eval_windows, world);
    if (root) fmt::print("eval_loss {:.12g}\n", loss);
    return 0;
  }

  kfsdp::optim::any_optimizer<Scalar> optimizer(trainer, s.training.optimizer);  // 2-D weights decay, 1-D parameters not
  // A checkpoint: the weights, the optimizer's state (the checkpoint protocol), the step and the configuration.
  // Under HSDP the first shard group writes the (flat) file; every group resumes from it.
  const auto save = [&](std::size_t steps_done) {
    kfsdp::io::metadata_map metadata{{"format", "pt"}, {"step", std::to_string(steps_done)}, {"seed", std::to_string(s.seed)},
                                      {"batch", std::to_string(s.batch)}};
    metadata.insert(config.begin(), config.end());
    kfsdp::io::save_training_state(s.save, engine, metadata, optimizer);
  };
  std::size_t first_step = 0;  // windows are keyed by step: the data resumes too
  if (!s.resume.empty()) {
    try {
      first_step = kfsdp::io::metadata_count(
          kfsdp::io::load_training_state(s.resume, engine, optimizer), "step");
    } catch (const std::invalid_argument& refused) {
      throw std::invalid_argument(fmt::format("train_gpt: --resume {}: {}", s.resume, refused.what()));
    }
    if (root) fmt::print("resumed {} at step {}\n", s.resume, first_step);
  }

  if (root)
    fmt::print("train_gpt: {} ranks, {} ({} parameters, {} per rank), {} / {} bucketing ({} buckets), overlap {}, {}, "
               "batch {} x {} windows of {} tokens, {} windows in {} (vocabulary {})\n",
               ws, s.dtype, engine.plan().full_numel, engine.plan().shard_numel, kfsdp::to_string(s.flags.fsdp.sharding()),
               kfsdp::to_string(s.flags.fsdp.bucketing()), engine.plan().buckets.size(), kfsdp::examples::to_string(overlap),
               s.training.optimizer.kind,
               s.training.grad_accum, s.batch, s.model.seq + 1, data.count(), s.data, s.model.vocab);
  if (root && need.activations > 0) fmt::print("train_gpt: estimated memory per rank {}\n", kfsdp::describe(need));
  kfsdp::step_log log(world, {.program = "train_gpt", .metrics = s.training.metrics, .unit = "tokens",
                              .steps = s.training.steps, .log_every = s.training.log_every});
  const std::size_t steps_done = kfsdp::examples::train_on_windows(
      trainer, optimizer, data, s.training, s.batch, s.seed, first_step, world, log, "train_gpt",
                                    [&](std::size_t steps_done) {
                                      if (windows.eval_every > 0 && steps_done % windows.eval_every == 0 &&
                                          steps_done < s.training.steps)
                                        kfsdp::examples::print_validation(trainer, windows, steps_done, s.training.steps,
                                                                          world, "train_gpt");
                                      if (s.save_every > 0 && steps_done % s.save_every == 0 && steps_done < s.training.steps) {
                                        save(steps_done);
                                        if (root) fmt::print("saved {} at step {}\n", s.save, steps_done);  // one line per save
                                      }
                                    });
  if (!s.trace.empty()) {
    engine.set_trace(nullptr);
    trace.write(fmt::format("{}.rank{}.json", s.trace, world.rank()));
    if (root) fmt::print("trace: {} events per rank in {}.rank<r>.json\n", trace.size(), s.trace);
  }
  if (steps_done < s.training.steps) {  // SIGTERM / SIGUSR1: saved, marked, exit 0; --resume goes on
    if (!s.save.empty()) save(steps_done);
    kfsdp::examples::report_stopped("train_gpt", steps_done, s.save, root);
    return 0;
  }
  log.print_loss_change();
  kfsdp::examples::print_validation(trainer, windows, steps_done, s.training.steps, world, "train_gpt");
  kfsdp::examples::print_data_reads(data, world, "train_gpt");
  if (!s.save.empty()) {
    save(steps_done);
    kfsdp::mark_finished(s.save, root);
    if (root) fmt::print("saved {}\n", s.save);
  }
  if (s.sample_bytes > 0 && data.tokens_are_bytes() && s.model.vocab == 256) {  // a sample of text: bytes in, bytes out
    const std::string text = kfsdp::generate(trainer, s.model, "And God said", s.sample_bytes,
                                             {.temperature = 0.8, .seed = s.seed, .printable = true});
    if (root) fmt::print("sample:\n{}\n", text);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::session job(argc, argv);  // MPI, Kokkos, the world; a bad flag or KFSDP_* variable: "error: ..." and exit 2
  return job.run([&] {
    cli c = make_cli();
    if (!c.parse(argc, argv)) return 0;
    const settings s = read(c, job.size());
    return s.dtype == "f32" ? run<float>(s, c, job) : run<double>(s, c, job);
  });
}
