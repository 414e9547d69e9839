// generate_llama — continues a prompt of token ids with a Llama-family model from a Hugging Face
// directory (config.json + model.safetensors, as transformers' save_pretrained or train_llama --save
// writes it): no MPI, one process, a key/value cache (each new token is one row through the model).
//
//   build/examples/generate_llama --model HF_DIR --prompt 73,110,32,116,104,101
//   build/examples/generate_llama --model HF_DIR --prompt 73,110 --sample on --top-k 40 --temperature 0.8 --seed 7
//
// It prints the new token ids on one line, separated by spaces. Greedy (the default) gives
// transformers' generate(do_sample=False) tokens; generation stops at HF_DIR/generation_config.json's
// eos_token_id (an int or a list; no file: no eos), which is printed, or after --max-new-tokens.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kfsdp/environment.hpp>
#include <kfsdp/infer/generate.hpp>
#include <kfsdp/io/checkpoint/hf_config.hpp>
#include <kfsdp/meta/parse.hpp>
#include <kfsdp/model/llama.hpp>

#include "cli.hpp"

namespace {

// "73,110 32" -> {73, 110, 32}: ids separated by commas or spaces.
std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::string item;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ',' && text[i] != ' ') {
      item += text[i];
      continue;
    }
    if (!item.empty()) ids.push_back(int(kfsdp::parse_count(item, fmt::format("--prompt token {}", ids.size()), 0, 0x7fffffff)));
    item.clear();
  }
  return ids;
}

template <class Scalar>
std::vector<int> run(const std::filesystem::path& directory, const std::vector<int>& prompt, const kfsdp::generation_options& options) {
  const kfsdp::llama_config config = kfsdp::io::read_llama_config(directory);
  // The window is max_position_embeddings: RoPE's table holds every position a generation reaches.
  kfsdp::predictor<kfsdp::llama_descriptor, Scalar> model(kfsdp::make_llama(config), directory / "model.safetensors");
  kfsdp::kv_cache<Scalar> cache(config.seq);
  return kfsdp::generate(model, cache, prompt, options);
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::environment kokkos_up(argc, argv);
  kfsdp::examples::cli c("generate_llama", "continue a prompt of token ids with a Hugging Face Llama-family model, without MPI");
  c.flag("model", "", "a Hugging Face directory: config.json, model.safetensors, generation_config.json (optional)")
      .flag("prompt", "", "the prompt's token ids, separated by commas or spaces")
      .flag("max-new-tokens", "32", "tokens generated at most (prompt + these <= max_position_embeddings)")
      .flag("sample", "off", "off: greedy (the likeliest token) | on: draw from softmax(logits / temperature)")
      .flag("top-k", "all", "sampling among the k likeliest tokens (at least 1) | all")
      .flag("temperature", "1", "sampling: logits are divided by it (> 0)")
      .flag("seed", "0", "sampling: the random seed (the same seed, the same tokens)")
      .flag("eos", "config", "config: stop at generation_config.json's eos_token_id | none: never stop early")
      .flag("dtype", "f32", "f32 | f64: the scalar the model computes in");
  try {
    if (!c.parse(argc, argv)) return 0;
    const std::filesystem::path directory = c.str("model");
    if (directory.empty()) throw std::invalid_argument("generate_llama: --model is empty, expected a Hugging Face directory");
    const std::vector<int> prompt = parse_ids(c.str("prompt"));
    kfsdp::generation_options options;
    options.max_new_tokens = c.size("max-new-tokens");
    options.sample = c.choice("sample", {"off", "on"}) == "on";
    options.temperature = c.real("temperature");
    options.seed = c.size("seed");
    if (const std::string k = c.str("top-k"); k != "all") options.top_k = c.size("top-k");
    if (c.choice("eos", {"config", "none"}) == "config") options.eos_token_ids = kfsdp::io::read_eos_token_ids(directory);
    const std::vector<int> ids =
        c.choice("dtype", {"f32", "f64"}) == "f32" ? run<float>(directory, prompt, options) : run<double>(directory, prompt, options);
    fmt::print("{}\n", fmt::join(ids, " "));
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return 2;
  }
}
