// train_llama — trains a Llama-family model (transformers' LlamaForCausalLM layout: RMSNorm, RoPE,
// grouped-query attention, SwiGLU) with FSDP on token shards or on text as bytes, or evaluates /
// fine-tunes a Hugging Face checkpoint directory.
//
//   mpirun -np 2 build/examples/train_llama --data data/kjv-genesis-exodus.txt
//   mpirun -np 2 build/examples/train_llama --data 'corpus_train_*.bin' --val-data corpus_val_000000.bin --vocab 512
//   mpirun -np 2 build/examples/train_llama --load HF_DIR --eval 4          # prints eval_loss
//   mpirun -np 2 build/examples/train_llama --load HF_DIR --steps 50 --save TUNED_DIR
//   mpirun -np 2 build/examples/train_llama --load HF_DIR --lora-rank 8 --lora-alpha 16 --lora-targets q_proj,v_proj
//       --steps 50 --save ADAPTER_DIR --save-merged MERGED_DIR           # LoRA (one command): the base frozen, peft's files
//
// The model is one descriptor (kfsdp::make_llama), each decoder layer an FSDP unit; kfsdp::trainer
// trains it. With --load the sizes come from HF_DIR/config.json; --save writes config.json and
// model.safetensors, which transformers' from_pretrained reads. The flags train_gpt has for a run
// over text windows (optimizer, clipping, sampling, accumulation, logging, sharding) are the same.
// The vocabulary is the model's (--vocab, or config.json's vocab_size with --load); a token id at or
// above it is refused, naming the shard and the place. With --lora-rank (or --load-adapter, a peft
// adapter to continue) the base is frozen and only the adapters train; --save then writes peft's
// adapter directory, --save-merged the model with the adapters merged in.

#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <kfsdp/comm/threaded/threaded.hpp>
#include <kfsdp/io/checkpoint/hf_checkpoint.hpp>
#include <kfsdp/io/checkpoint/hf_config.hpp>
#include <kfsdp/io/checkpoint/peft_adapter.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/optim/any_optimizer.hpp>
#include <kfsdp/session.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/llama.hpp>
#include <kfsdp/train/step_log.hpp>
#include <kfsdp/train/trainer.hpp>

#include "cli.hpp"
#include "text_training.hpp"

namespace {

using kfsdp::examples::cli;

struct settings {
  std::string data, load, save, save_merged, load_adapter, dtype;
  std::size_t batch, window, eval_windows;
  std::uint64_t seed;
  kfsdp::llama_config model;
  kfsdp::lora_config lora{};  // rank 0: a full fine-tune
  kfsdp::examples::text_training training;
  kfsdp::examples::fsdp_flags flags;
};

cli make_cli() {
  cli c("train_llama", "train a Llama-family model with FSDP, or evaluate a Hugging Face checkpoint (run under mpirun)");
  c.flag("data", "data/kjv-genesis-exodus.txt",
         "training data: token shards (.bin: llm.c's or nanoGPT's raw uint16; 1-D .npy; a quoted glob of them) or text (bytes)")
      .flag("vocab", "256", "vocabulary (vocab_size; with --load config.json's); every token id must be below it")
      .flag("layers", "4", "decoder layers (num_hidden_layers)")
      .flag("dim", "128", "hidden_size")
      .flag("hidden", "352", "the MLP's width (intermediate_size)")
      .flag("heads", "4", "query heads (num_attention_heads)")
      .flag("kv-heads", "2", "key/value heads, a divisor of --heads (num_key_value_heads)")
      .flag("rope-theta", "10000", "RoPE's base (rope_theta)")
      .flag("seq", "64", "context length T (a window is T+1 tokens); with --load at most max_position_embeddings")
      .flag("tie-weights", "off", "on: lm_head.weight is model.embed_tokens.weight (tie_word_embeddings) | off")
      .flag("batch", "16", "global batch in windows, split evenly over the ranks")
      .flag("dtype", "f32", "f32 | f64")
      .flag("seed", "1337", "initialisation and sampling seed");
  kfsdp::examples::add_token_data_flags(kfsdp::examples::add_text_training_flags(c))
      .flag("load", "",
            "start from this Hugging Face directory (config.json + safetensors; its sizes replace the size "
            "flags)")
      .flag("eval", "0", "with --load: print eval_loss over the first W windows and exit")
      .flag("save", "",
            "write the trained model here as a Hugging Face directory (config.json + model.safetensors; its "
            "other files stay); with LoRA, peft's adapter directory (adapter_config.json + adapter_model.safetensors)")
      .flag("lora-rank", "0", "LoRA: adapters of this rank on --lora-targets, the base frozen (0: train every parameter)")
      .flag("lora-alpha", "8", "LoRA: the adapters' output is scaled by alpha / rank (peft's lora_alpha)")
      .flag("lora-targets", "q_proj,v_proj",
            "LoRA: the projections adapted, comma-separated (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, "
            "or all-linear)")
      .flag("load-adapter", "", "LoRA: continue this peft adapter directory (its adapter_config.json gives rank, alpha, targets)")
      .flag("save-merged", "", "LoRA: also write the model with the adapters merged in, as a Hugging Face directory");
  kfsdp::examples::add_step_log_flags(c);
  kfsdp::examples::add_fsdp_flags(c, "zero2", "block");
  return c;
}

settings read(const cli& c, int world_size) {
  settings s{.data = c.str("data"), .load = c.str("load"), .save = c.str("save"), .save_merged = c.str("save-merged"),
             .load_adapter = c.str("load-adapter"), .dtype = c.choice("dtype", {"f32", "f64"}),
             .batch = c.size("batch"), .window = c.positive("seq"), .eval_windows = c.size("eval"), .seed = c.size("seed"),
             .model = {.vocab = c.positive("vocab"), .dim = c.positive("dim"), .hidden = c.positive("hidden"), .layers = c.positive("layers"),
                       .heads = c.positive("heads"), .kv_heads = c.positive("kv-heads"), .seq = c.positive("seq"),
                       .rope_theta = c.real("rope-theta"), .tie_weights = c.choice("tie-weights", {"on", "off"}) == "on"},
             .training = kfsdp::examples::text_training_of(c), .flags = kfsdp::examples::fsdp_flags_of(c)};
  s.lora.rank = c.size("lora-rank");
  auto fail = [](const std::string& m) { throw std::invalid_argument("train_llama: " + m); };
  if (s.load.empty()) {
    try {
      s.model.validate();
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("the size flags: {}", e.what()));
    }
  }
  if (s.eval_windows == 0 && (s.batch == 0 || s.batch % std::size_t(world_size) != 0))
    fail(fmt::format("--batch is {}, expected a positive multiple of the {} ranks", s.batch, world_size));
  if (s.eval_windows > 0 && s.load.empty()) fail("--eval needs --load HF_DIR (the model to evaluate)");
  if (!s.load_adapter.empty()) {  // the adapter says what it is; flags that say otherwise are refused
    s.lora = kfsdp::io::read_lora_config(s.load_adapter);
    for (const char* flag : {"lora-rank", "lora-alpha", "lora-targets"})
      if (c.given(flag)) fail(fmt::format("--{} and --load-adapter both given: the adapter's adapter_config.json says it", flag));
  } else if (s.lora.rank > 0) {
    s.lora.alpha = c.real("lora-alpha");
    for (std::size_t from = 0; from <= c.str("lora-targets").size();) {
      const std::size_t comma = std::min(c.str("lora-targets").find(',', from), c.str("lora-targets").size());
      if (comma > from) s.lora.targets.push_back(c.str("lora-targets").substr(from, comma - from));
      from = comma + 1;
    }
  }
  if (s.lora.rank > 0 && s.load.empty()) fail("--lora-rank or --load-adapter needs --load HF_DIR (the base the adapters adapt)");
  if (!s.save_merged.empty() && s.lora.rank == 0) fail("--save-merged needs --lora-rank or --load-adapter (adapters to merge)");
  if (s.eval_windows > 0 && !s.training.metrics.empty()) fail("--metrics and --eval both given: --eval trains no steps");
  return s;
}

template <class Scalar>
int run(const settings& s, const cli& c, kfsdp::session& job) {
  kfsdp::comm::mpi& world = job.world();
  const bool root = job.is_root();
  const kfsdp::llama_config config = s.load.empty() ? s.model : kfsdp::io::read_llama_config(s.load);
  // Stops, before the model is built, one that cannot fit this rank's share of its node's memory.
  job.require_memory(kfsdp::estimate_sharded_memory(config.parameters(), sizeof(Scalar), s.training.optimizer.states(),
                                                    std::size_t(job.shard_group().size())),
                     s.load.empty() ? fmt::format("--layers {} --dim {} --hidden {} --dtype {} (more ranks or smaller sizes "
                                                  "need less)", config.layers, config.dim, config.hidden, s.dtype)
                                    : fmt::format("{}'s config.json (num_hidden_layers {}, hidden_size {}, intermediate_size "
                                                  "{}, vocab_size {})", s.load, config.layers, config.dim, config.hidden,
                                                  config.vocab));
  // Memory-mapped: each rank reads only its windows, checked against the model's vocabulary.
  const kfsdp::examples::window_data windows = kfsdp::examples::open_window_data(c, s.window, config.vocab);
  const kfsdp::io::token_windows& data = windows.train;
  // Overlap: the engine's collectives go through a worker thread that keeps them progressing, or
  // the compute thread polls them between kernels.
  kfsdp::comm::threaded overlapped(job.shard_group());
  const auto overlap = kfsdp::examples::overlap_of(s.flags.overlap, job);
  const kfsdp::comm::any_communicator engine_comm = overlap == kfsdp::examples::overlap_mode::thread
                                                        ? kfsdp::comm::any_communicator(overlapped)
                                                        : kfsdp::comm::any_communicator(job.shard_group());
  const kfsdp::trainer_options training{.checkpointing = s.flags.checkpointing};
  kfsdp::trainer<kfsdp::llama_descriptor, Scalar> trainer(kfsdp::make_llama(config, s.window, s.lora), engine_comm,
                                                          job.fsdp(s.flags.fsdp), training);
  auto& engine = trainer.engine();
  engine.set_progress_between_kernels(overlap == kfsdp::examples::overlap_mode::poll);
  if (s.load.empty())
    trainer.initialize(s.seed, kfsdp::llama_init());
  else {
    if (s.lora.rank > 0) trainer.initialize(s.seed);  // the adapters' start: A uniform, B zero (peft's)
    // The base; a tied model's directory may still hold lm_head.weight (some writers keep it).
    kfsdp::io::load_pretrained(s.load, engine,
                               config.tie_weights ? std::vector<std::string>{"lm_head.weight"} : std::vector<std::string>{});
    if (!s.load_adapter.empty()) kfsdp::io::load_adapter(s.load_adapter, engine);
  }

  if (s.eval_windows > 0) {  // evaluation only
    const double loss = kfsdp::evaluate_windows(trainer, data, s.eval_windows, world);
    if (root) fmt::print("eval_loss {:.12g}\n", loss);
    return 0;
  }

  // 2-D weights decay, 1-D not; with LoRA everything but the adapters is frozen (no gradient, no state).
  kfsdp::optim::any_optimizer<Scalar> optimizer(
      trainer, s.training.optimizer,
      s.lora.rank > 0 ? std::vector<kfsdp::optim::param_group>{kfsdp::optim::lora_frozen_base()} : std::vector<kfsdp::optim::param_group>{});
  if (root)
    fmt::print("train_llama: {} ranks, {} ({} parameters, {} per rank; {} layers, dim {}, {} heads, {} kv heads), "
               "{} / {} bucketing ({} buckets), {}, batch {} x {} windows of {} tokens, {} windows in {} (vocabulary {})\n",
               world.size(), s.dtype, engine.plan().full_numel, engine.plan().shard_numel, config.layers, config.dim,
               config.heads, config.kv_heads, kfsdp::to_string(s.flags.fsdp.sharding()),
               kfsdp::to_string(s.flags.fsdp.bucketing()), engine.plan().buckets.size(),
               s.training.optimizer.kind, s.training.grad_accum, s.batch, s.window + 1, data.count(), s.data, config.vocab);
  kfsdp::step_log log(world, {.program = "train_llama", .metrics = s.training.metrics, .unit = "tokens",
                              .steps = s.training.steps, .log_every = s.training.log_every});
  const std::size_t steps_done = kfsdp::examples::train_on_windows(
      trainer, optimizer, data, s.training, s.batch, s.seed, 0, world, log, "train_llama", [&](std::size_t done) {
        if (windows.eval_every > 0 && done % windows.eval_every == 0 && done < s.training.steps)
          kfsdp::examples::print_validation(trainer, windows, done, s.training.steps, world, "train_llama");
      });
  const bool stopped = steps_done < s.training.steps;  // SIGTERM / SIGUSR1: the weights so far, marked
  if (!stopped) log.print_loss_change();
  kfsdp::examples::print_validation(trainer, windows, steps_done, s.training.steps, world, "train_llama");
  kfsdp::examples::print_data_reads(data, world, "train_llama");
  if (!s.save_merged.empty()) {
    kfsdp::io::save_merged(s.save_merged, engine, s.lora, kfsdp::io::llama_config_json(config, kfsdp::io::dtype_of<Scalar>));
    if (root) fmt::print("saved {} (the adapters merged)\n", s.save_merged);
  }
  if (!s.save.empty()) {
    if (s.lora.rank > 0)
      kfsdp::io::save_adapter(s.save, engine, s.lora, s.load, kfsdp::io::dtype_of<Scalar>);
    else
      kfsdp::io::save_pretrained(s.save, engine, kfsdp::io::llama_config_json(config, kfsdp::io::dtype_of<Scalar>),
                                 kfsdp::io::dtype_of<Scalar>);
    if (!stopped) kfsdp::mark_finished(s.save, root);
    if (root && !stopped) fmt::print("saved {}\n", s.save);
  }
  if (stopped) kfsdp::examples::report_stopped("train_llama", steps_done, s.save, root);
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
