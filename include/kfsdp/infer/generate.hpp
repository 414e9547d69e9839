#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::generate — token ids in, token ids out, from a predictor of a Llama-family model, with a
// key/value cache (compute/kv_cache.hpp): the prompt runs once, whole (prefill), then each new token
// is one row through every layer, attending to the cached positions. Greedy takes the likeliest
// token (the lowest id of equals), as transformers' generate(do_sample=False); sampling draws from
// softmax(logits / temperature) over the top_k likeliest, from a seed (the same seed, the same tokens).
// Generation stops after max_new_tokens or after a token of eos_token_ids (which is returned).
//
//   const kfsdp::llama_config config = kfsdp::io::read_llama_config("tiny-llama");
//   kfsdp::predictor<kfsdp::llama_descriptor, float> model(kfsdp::make_llama(config), "tiny-llama/model.safetensors");
//   kfsdp::kv_cache<float> cache(config.seq);                        // max_position_embeddings
//   std::vector<int> ids = kfsdp::generate(model, cache, prompt,
//       {.max_new_tokens = 32, .eos_token_ids = kfsdp::io::read_eos_token_ids("tiny-llama")});
//   std::vector<int> drawn = kfsdp::generate(model, cache, prompt, {.sample = true, .top_k = 40, .temperature = 0.8, .seed = 7});

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <kfsdp/compute/kv_cache.hpp>
#include <kfsdp/infer/predictor.hpp>

namespace kfsdp {

KFSDP_EXPORT struct generation_options {
  std::size_t max_new_tokens = 32;
  bool sample = false;               // false: greedy
  std::optional<std::size_t> top_k;  // sampling among the k likeliest tokens (absent: all); 0 is refused
  double temperature = 1.0;          // sampling: softmax(logits / temperature); > 0
  std::uint64_t seed = 0;            // sampling: std::mt19937_64's seed
  std::vector<int> eos_token_ids;    // stop after generating one of these (io::read_eos_token_ids)
};

namespace detail {
// The next token from one row of logits: greedy, or a draw as `options` says.
inline int pick_token(std::span<const double> logits, const generation_options& options, std::mt19937_64& rng) {
  if (!options.sample) return int(std::max_element(logits.begin(), logits.end()) - logits.begin());  // the first of equals
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const std::size_t k = std::min(options.top_k.value_or(logits.size()), logits.size());
  // The k likeliest, ties to the lower id: top_k = 1 is greedy.
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(),
                    [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> weights(k);
  double total = 0;
  for (std::size_t i = 0; i < k; ++i)
    total += weights[i] = std::exp((logits[order[i]] - logits[order[0]]) / options.temperature);
  double pick = (double(rng() >> 11) + 1.0) * 0x1.0p-53 * total;  // uniform in (0, total], the same on every platform
  for (std::size_t i = 0; i < k; ++i)
    if ((pick -= weights[i]) <= 0) return order[i];
  return order[k - 1];  // rounding left a sliver: the last kept token
}
}  // namespace detail

/// The tokens that follow `prompt` (ids < the model's vocabulary), at most options.max_new_tokens,
/// the last an eos token when one came. `cache` is cleared first and holds the sequence after (but
/// its last token's keys and values). Throws std::invalid_argument naming the parameter, the value
/// and what was expected for an empty prompt, a token outside the vocabulary, a prompt and
/// max_new_tokens that need more positions than cache.max_positions() (make it
/// max_position_embeddings), top_k 0, or a sampling temperature that is not > 0.
KFSDP_EXPORT template <descriptor Model, class Scalar>
std::vector<int> generate(predictor<Model, Scalar>& model, kv_cache<Scalar>& cache, std::span<const int> prompt,
                          const generation_options& options) {
  const std::size_t vocab = model.out_features();
  if (prompt.empty()) throw std::invalid_argument("kfsdp::generate: the prompt is empty, expected at least one token");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || std::size_t(prompt[i]) >= vocab)
      throw std::invalid_argument(fmt::format("kfsdp::generate: prompt token {} is {}, expected 0 <= id < vocab_size = {}", i,
                                              prompt[i], vocab));
  if (options.max_new_tokens > cache.max_positions() || prompt.size() > cache.max_positions() - options.max_new_tokens)
    throw std::invalid_argument(fmt::format("kfsdp::generate: max_new_tokens = {} after a prompt of {} tokens needs {} positions, "
                                            "expected at most max_position_embeddings = {} (the cache's max_positions)",
                                            options.max_new_tokens, prompt.size(), double(options.max_new_tokens) + double(prompt.size()),
                                            cache.max_positions()));
  if (options.top_k && *options.top_k == 0)
    throw std::invalid_argument("kfsdp::generate: top_k is 0, expected at least 1 (or none: every token)");
  if (options.sample && !(options.temperature > 0 && std::isfinite(options.temperature)))
    throw std::invalid_argument(fmt::format("kfsdp::generate: temperature is {}, expected a finite number > 0 for sampling "
                                            "(greedy: sample = false)", options.temperature));
  std::mt19937_64 rng(options.seed);
  std::vector<int> out;
  std::vector<double> row(vocab);
  nn::index_vector ids(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::generate::prompt"), prompt.size());
  const auto host_ids = Kokkos::create_mirror_view(ids);
  for (std::size_t i = 0; i < prompt.size(); ++i) host_ids(i) = prompt[i];
  Kokkos::deep_copy(ids, host_ids);
  cache.clear();
  nn::matrix<Scalar> logits = model.predict_cached(ids, cache);  // prefill: the whole prompt at once
  const nn::index_vector next_id(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::generate::next"), 1);
  const auto host_next = Kokkos::create_mirror_view(next_id);
  while (out.size() < options.max_new_tokens) {
    const auto last = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(logits, logits.extent(0) - 1, Kokkos::ALL));
    for (std::size_t v = 0; v < vocab; ++v) row[v] = double(last(v));
    const int next = detail::pick_token(row, options, rng);
    out.push_back(next);
    const bool eos = std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), next) != options.eos_token_ids.end();
    if (eos || out.size() == options.max_new_tokens) break;
    host_next(0) = next;
    Kokkos::deep_copy(next_id, host_next);
    logits = model.predict_cached(next_id, cache);  // one row: the new token at the next position
  }
  return out;
}

}  // namespace kfsdp
