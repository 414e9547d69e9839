#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The example GPT's training helpers: nanoGPT's initialisation, token batches for the trainer,
// its memory estimate, evaluation over text windows, and text generation from a trainer of
// kfsdp::gpt (model/gpt.hpp).
//
//   auto model = kfsdp::make_gpt({.layers = 4, .dim = 128, .heads = 4, .seq = 64});
//   kfsdp::trainer<decltype(model), float> t(model, world,
//                                            {.sharding_strategy = kfsdp::sharding_strategy::zero3});
//   t.initialize(1337, kfsdp::gpt2_init(4));
//   t.step({{kfsdp::device_ids(tokens), kfsdp::device_ids(targets)}}, adam);
//   std::string text = kfsdp::generate(t, config, "And God said", 200, {.temperature = 0.8});

#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/fsdp/memory_fit.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/nn/attention.hpp>
#include <kfsdp/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kfsdp {

// The run-time GPT's compute is compiled once, in kernels/compute/gpt.cpp.
extern template class network<gpt_descriptor, float>;
extern template class network<gpt_descriptor, double>;

// nanoGPT's initialisation: N(0, 0.02) for weights and embeddings, N(0, 0.02/sqrt(2L)) for the
// residual projections (attn.c_proj, mlp.c_proj), zero biases, LayerNorm weights one.
KFSDP_EXPORT inline std::function<param_init(const param_info&)> gpt2_init(std::size_t layers) {
  return [layers](const param_info& p) -> param_init {
    const std::string_view name = p.name.view();
    if (name.ends_with(".bias")) return {param_init::zeros, 0.0};
    if (name.find("ln_") != std::string_view::npos) return {param_init::ones, 0.0};
    if (name.ends_with("c_proj.weight")) return {param_init::normal, 0.02 / std::sqrt(2.0 * double(layers))};
    return {param_init::normal, 0.02};
  };
}

// What sizes one rank's memory when training the example GPT, beside its configuration.
struct gpt_memory_options {
  std::size_t scalar_bytes = sizeof(float);
  std::size_t shard_ranks = 1;       // the ranks the parameters are split over (the shard group's)
  std::size_t windows_per_rank = 1;  // the windows of one micro-batch on this rank
  std::size_t optimizer_states = 2;  // shard-sized states: AdamW 2, SGD with momentum 1, without 0
  bool checkpointing = false;        // trainer_options::checkpointing
  fsdp_options fsdp{};               // sharding, bucketing, wrap, overlap
};

// One rank's memory at its peak when training the GPT: the shard plan's (estimate_memory) and the
// activations its layers keep, measured for this GPT at about twice, per token, what the blocks
// keep for backward: 22·dim + heads·seq per block, heads·1 where attention is blocked (seq >=
// nn::blocked_from_seq_len: a logsumexp per row, not the probabilities) (one block and each block's
// input with checkpointing), and the logits. Where the sizes alone (12·dim² per block: parameters, gradients,
// optimizer states) already exceed `stop_above`, that coarse figure is returned without building the
// parameter table, which would not fit either. Where the shards live on a device only the coarse
// figure is known here (the host's memory is what this estimates).
KFSDP_EXPORT inline memory_need estimate_gpt_memory(const gpt_config& model, const gpt_memory_options& o,
                                       double stop_above = std::numeric_limits<double>::max()) {
  const double bytes = double(o.scalar_bytes), d = double(model.dim), layers = double(model.layers);
  const double table = layers * 16 * 2 * sizeof(param_info);  // the table and the plan, ~16 entries a block
  memory_need need = estimate_sharded_memory(layers * 12 * d * d, o.scalar_bytes, o.optimizer_states, o.shard_ranks);
  need.params += table;
  if (need.total() > stop_above || !std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>)
    return need;
  const model_graph graph = make_model_graph(make_gpt(model));
  const auto plan = make_shard_plan(graph.params, o.shard_ranks, o.fsdp.bucketing());
  const bool blocked_attention = model.seq >= nn::blocked_from_seq_len;
  const double block = 22 * d + double(model.heads) * (blocked_attention ? 1.0 : double(model.seq));
  const double per_token = 2 * ((o.checkpointing ? block + layers * d : layers * block) + 2 * double(model.vocab));
  return estimate_memory(plan, make_units(graph, plan, o.fsdp.wrap), o.scalar_bytes, o.optimizer_states, o.fsdp,
                         per_token * double(o.windows_per_rank * model.seq) * bytes);
}

// Host ids (tokens or targets) as a device vector.
KFSDP_EXPORT inline nn::index_vector device_ids(const std::vector<int>& ids) {
  nn::index_vector out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::ids"), ids.size());
  Kokkos::deep_copy(out, Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(ids.data(), ids.size()));
  return out;
}

// The mean per-token loss over the first `windows` windows of `data` (io::text_windows or
// io::token_windows; fewer if it holds fewer): rank r of `ranks` computes windows r, r + N, ... on
// the full model, gathered once since ranks hold different counts, and the sums are added over
// `ranks` (every rank of the job, whatever groups the trainer shards over). Collective over both.
KFSDP_EXPORT template <class Trainer, class Windows, class Communicator>
double evaluate_windows(Trainer& trainer, const Windows& data, std::size_t windows, Communicator& ranks) {
  double totals[2] = {0, 0};  // the sum of per-token losses, the tokens
  trainer.with_full_model([&] {
    for (std::size_t w = std::size_t(ranks.rank()); w < std::min(windows, data.count()); w += std::size_t(ranks.size())) {
      std::vector<int> tokens, targets;
      data.append(w, tokens, targets);
      totals[0] += trainer.forward_loss({device_ids(tokens), device_ids(targets)}) * double(tokens.size());
      totals[1] += double(tokens.size());
    }
  });
  comm::all_reduce_sum(ranks, std::span<double>(totals));
  return totals[0] / totals[1];
}

struct sampling {
  double temperature = 1.0;  // 0: the most likely byte each time
  std::uint64_t seed = 0;
  bool printable = false;  // bytes a terminal cannot show (an undertrained model emits them) as '?'
};

// Continues `prompt` by new_bytes bytes (the same on every rank: same seed). Collective.
KFSDP_EXPORT template <class Model, class Scalar>
std::string generate(trainer<Model, Scalar>& t, const gpt_config& config, std::string_view prompt, std::size_t new_bytes,
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
  for (int id : ids) {
    const bool shown = (id >= 0x20 && id < 0x7f) || id == '\n';
    text.push_back(how.printable && !shown ? '?' : char(static_cast<unsigned char>(id)));
  }
  return text;
}

}  // namespace kfsdp
