// bench/generation — time per generated token with the key/value cache (kfsdp::generate: the prompt
// once, then one row through the model per token) against the whole-window forward per token (as
// train_gpt's --sample does: the window of max_position_embeddings tokens, zero-padded, one forward
// each), on a random-weight Llama (no file needed: the weights are written to a temporary
// safetensors file and loaded by kfsdp::predictor). Greedy both ways; it checks that both give the
// same tokens.
//
//   OPENBLAS_NUM_THREADS=1 build/bench/bench_generation --tokens 32,256
//   build/bench/bench_generation --layers 2 --dim 64 --hidden 176 --heads 4 --kv-heads 2 --vocab 256 --seq 320
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/environment.hpp>
#include <kfsdp/infer/generate.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/model/llama.hpp>
#include <kfsdp/model/model_graph.hpp>

#include "../examples/cli.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

// Random weights for every parameter of `model` (norms 1, linears and embeddings N(0, 1/in)), as a file.
void write_random_weights(const kfsdp::llama_descriptor& model, const std::filesystem::path& file) {
  const kfsdp::model_graph graph = kfsdp::make_model_graph(model);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  kfsdp::state_dict weights;
  for (const kfsdp::param_info& p : graph.params) {
    kfsdp::tensor t = kfsdp::tensor::zeros(std::string(p.name.view()), {p.shape.begin(), p.shape.begin() + p.rank}, kfsdp::dtype::F32);
    const float scale = p.rank == 2 ? 1.0f / std::sqrt(float(p.shape[1])) : 0.0f;
    for (float& v : t.values<float>()) v = p.rank == 2 ? scale * normal(rng) : 1.0f;
    weights.add(std::move(t));
  }
  kfsdp::io::save_state_dict_file(file, weights);
}

std::vector<std::size_t> parse_counts(const std::string& text) {
  std::vector<std::size_t> out;
  std::size_t start = 0;
  for (std::size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(kfsdp::parse_count(text.substr(start, comma - start), "--tokens", 1));
  out.push_back(kfsdp::parse_count(text.substr(start), "--tokens", 1));
  return out;
}

// Greedy by a whole-window forward per token: the last tokens zero-padded to the window, the logits at the last one.
template <class Model>
std::vector<int> whole_window(Model& model, std::vector<int> ids, std::size_t window, std::size_t count) {
  std::vector<int> out;
  kfsdp::nn::index_vector device("window", window);
  const auto host = Kokkos::create_mirror_view(device);
  for (std::size_t step = 0; step < count; ++step) {
    const std::size_t used = std::min(window, ids.size());
    for (std::size_t i = 0; i < window; ++i) host(i) = i < used ? ids[ids.size() - used + i] : 0;
    Kokkos::deep_copy(device, host);
    const auto logits = model.predict(device);
    const auto row = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(logits, used - 1, Kokkos::ALL));
    std::size_t next = 0;
    for (std::size_t v = 1; v < row.extent(0); ++v)
      if (row(v) > row(next)) next = v;
    ids.push_back(int(next));
    out.push_back(int(next));
  }
  return out;
}

double seconds_since(clock_type::time_point start) { return std::chrono::duration<double>(clock_type::now() - start).count(); }

}  // namespace

int main(int argc, char** argv) {
  kfsdp::environment kokkos_up(argc, argv);
  kfsdp::examples::cli c("bench_generation", "time per generated token: key/value cache against a whole-window forward per token");
  c.flag("layers", "4", "decoder layers").flag("dim", "128", "hidden_size").flag("hidden", "352", "intermediate_size")
      .flag("heads", "4", "attention heads").flag("kv-heads", "2", "key/value heads").flag("vocab", "512", "vocabulary")
      .flag("seq", "320", "max_position_embeddings: the cache's positions and the whole window")
      .flag("prompt", "16", "prompt tokens").flag("tokens", "32,256", "generated tokens, one run each")
      .flag("repeats", "3", "runs of each (the fastest is reported)");
  try {
    if (!c.parse(argc, argv)) return 0;
    kfsdp::llama_config config{.vocab = c.positive("vocab"), .dim = c.positive("dim"), .hidden = c.positive("hidden"),
                               .layers = c.positive("layers"), .heads = c.positive("heads"), .kv_heads = c.positive("kv-heads"),
                               .seq = c.positive("seq")};
    const kfsdp::llama_descriptor descriptor = kfsdp::make_llama(config);
    const auto file = std::filesystem::temp_directory_path() / fmt::format("kfsdp-bench-generation-{}.safetensors", ::getpid());
    write_random_weights(descriptor, file);
    kfsdp::predictor<kfsdp::llama_descriptor, float> model(descriptor, file);
    std::filesystem::remove(file);
    kfsdp::kv_cache<float> cache(config.seq);
    std::vector<int> prompt(c.positive("prompt"));
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = int((i * 7919) % config.vocab);
    const std::size_t repeats = c.positive("repeats");
    fmt::print("Llama layers {} dim {} hidden {} heads {} kv_heads {} vocab {}, window {} (max_position_embeddings), "
               "prompt {} tokens, f32, greedy, best of {}\n",
               config.layers, config.dim, config.hidden, config.heads, config.kv_heads, config.vocab, config.seq, prompt.size(), repeats);
    fmt::print("{:>8} {:>18} {:>22} {:>8} {:>12}\n", "tokens", "kv cache ms/token", "whole window ms/token", "ratio", "same tokens");
    for (const std::size_t count : parse_counts(c.str("tokens"))) {
      kfsdp::generation_options options;
      options.max_new_tokens = count;
      double cached = 1e300, whole = 1e300;
      std::vector<int> with_cache, without;
      for (std::size_t r = 0; r < repeats; ++r) {
        auto start = clock_type::now();
        with_cache = kfsdp::generate(model, cache, prompt, options);
        cached = std::min(cached, seconds_since(start) / double(count));
        start = clock_type::now();
        without = whole_window(model, prompt, config.seq, count);
        whole = std::min(whole, seconds_since(start) / double(count));
      }
      fmt::print("{:>8} {:>18.3f} {:>22.3f} {:>8.1f} {:>12}\n", count, cached * 1e3, whole * 1e3, whole / cached,
                 with_cache == without ? "yes" : "NO");
    }
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return 2;
  }
}
