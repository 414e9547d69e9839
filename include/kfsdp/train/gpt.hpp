#pragma once
// The example GPT's training helpers: nanoGPT's initialisation, token batches for the trainer,
// and text generation from a trainer of kfsdp::gpt (model/gpt.hpp).
//
//   auto model = kfsdp::make_gpt({.layers = 4, .dim = 128, .heads = 4, .seq = 64});
//   kfsdp::trainer<decltype(model), float, kfsdp::zero3> t(model, world);
//   t.initialize(1337, kfsdp::gpt2_init(4));
//   t.step({{kfsdp::device_ids(tokens), kfsdp::device_ids(targets)}}, adam);
//   std::string text = kfsdp::generate(t, config, "And God said", 200, {.temperature = 0.8});

#include <kfsdp/model/gpt.hpp>
#include <kfsdp/train/trainer.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kfsdp {

// The run-time GPT's compute is compiled once, in kernels/train/gpt.cpp.
extern template class network<gpt_descriptor, float>;
extern template class network<gpt_descriptor, double>;

// nanoGPT's initialisation: N(0, 0.02) for weights and embeddings, N(0, 0.02/sqrt(2L)) for the
// residual projections (attn.c_proj, mlp.c_proj), zero biases, LayerNorm weights one.
inline std::function<param_init(const param_info&)> gpt2_init(std::size_t layers) {
  return [layers](const param_info& p) -> param_init {
    const std::string_view name = p.name.view();
    if (name.ends_with(".bias")) return {param_init::zeros, 0.0};
    if (name.find("ln_") != std::string_view::npos) return {param_init::ones, 0.0};
    if (name.ends_with("c_proj.weight")) return {param_init::normal, 0.02 / std::sqrt(2.0 * double(layers))};
    return {param_init::normal, 0.02};
  };
}

// Host ids (tokens or targets) as a device vector.
inline nn::index_vector device_ids(const std::vector<int>& ids) {
  nn::index_vector out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::ids"), ids.size());
  Kokkos::deep_copy(out, Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(ids.data(), ids.size()));
  return out;
}

struct sampling {
  double temperature = 1.0;  // 0: the most likely byte each time
  std::uint64_t seed = 0;
};

// Continues `prompt` by new_bytes bytes (the same on every rank: same seed). Collective.
template <class Model, class Scalar>
std::string generate(trainer_core<Model, Scalar>& t, const gpt_config& config, std::string_view prompt, std::size_t new_bytes,
                     sampling how) {
  if (prompt.empty()) throw std::invalid_argument("kfsdp::generate: the prompt is empty");
  std::vector<int> ids;
  for (unsigned char byte : prompt) ids.push_back(int(byte));
  std::mt19937_64 rng(how.seed);
  const std::size_t seq = config.seq;
  t.with_full_model([&] {
    std::vector<int> window(seq);
    for (std::size_t step = 0; step < new_bytes; ++step) {
      // The last <= seq tokens, zero-padded after: causal masking keeps the padding out of them.
      const std::size_t used = std::min(seq, ids.size());
      std::fill(window.begin(), window.end(), 0);
      std::copy(ids.end() - std::ptrdiff_t(used), ids.end(), window.begin());
      const auto logits = t.predict(device_ids(window));
      const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(logits, used - 1, Kokkos::ALL));
      std::size_t next = 0;
      if (how.temperature <= 0) {
        for (std::size_t v = 1; v < config.vocab; ++v)
          if (host(v) > host(next)) next = v;
      } else {
        double max_logit = double(host(0));
        for (std::size_t v = 1; v < config.vocab; ++v) max_logit = std::max(max_logit, double(host(v)));
        std::vector<double> weights(config.vocab);
        double total = 0;
        for (std::size_t v = 0; v < config.vocab; ++v) total += weights[v] = std::exp((double(host(v)) - max_logit) / how.temperature);
        double pick = (double(rng() >> 11) + 1.0) * 0x1.0p-53 * total;  // uniform in (0, total]
        next = config.vocab - 1;
        for (std::size_t v = 0; v < config.vocab; ++v)
          if ((pick -= weights[v]) <= 0) {
            next = v;
            break;
          }
      }
      ids.push_back(int(next));
    }
  });
  std::string text;
  for (int id : ids) text.push_back(char(static_cast<unsigned char>(id)));
  return text;
}

}  // namespace kfsdp
