#pragma once
// gpt_trainer — trains the example GPT (kfsdp::nn::gpt, staged compute) on an FSDP engine: the
// forward and backward passes run stage by stage (embeddings, each block, the head) through the
// engine's schedule, the optimizer touches only the local shards.
//
//   kfsdp::with_fsdp<float>(model, world, options, [&](auto& engine) {
//     kfsdp::gpt_trainer trainer(engine, {.layers = 4, .dim = 128, .heads = 4, .seq = 64}, local_batch);
//     engine.initialize(seed, kfsdp::gpt2_init(4));
//     kfsdp::optim::adamw<float> adam(engine.plan().shard_numel, {.lr = 1e-3});
//     auto result = trainer.step({micro_batch}, adam, /*clip=*/1.0, kfsdp::grad_accumulation::unsharded);
//   });

#ifndef KFSDP_MODULE
#include <cmath>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <Kokkos_Core.hpp>
#endif

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/nn/gpt.hpp>
#include <kfsdp/optim/clip.hpp>

namespace kfsdp {

// How gradients of K micro-batches accumulate (SEMANTICS.md, "Gradient accumulation").
enum class grad_accumulation {
  unsharded,  // Thunder's no_sync: keep full gradients, reduce-scatter once (less traffic, more memory)
  sharded,    // reduce-scatter every micro-batch into the gradient shards (more traffic, less memory)
};

inline grad_accumulation parse_grad_accumulation(const std::string& text) {
  if (text == "unsharded" || text == "no_sync") return grad_accumulation::unsharded;
  if (text == "sharded") return grad_accumulation::sharded;
  throw std::invalid_argument("kfsdp: grad accumulation '" + text + "' is not one of unsharded, sharded");
}

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

// One micro-batch of this rank: tokens and targets, batch · seq_len each.
struct micro_batch {
  std::vector<int> tokens;
  std::vector<int> targets;
};

struct step_result {
  double loss = 0;       // mean over every target byte of the global batch
  double grad_norm = 0;  // global norm of the averaged gradient, before clipping
};

template <class Engine>
class gpt_trainer {
 public:
  using scalar_type = typename Engine::scalar_type;
  using Scalar = scalar_type;

  gpt_trainer(Engine& engine, const nn::gpt_config& config, std::size_t local_batch)
      : engine_(engine), config_(config), compute_(config, local_batch) {
    // Stage s's parameters in the engine's table: the embeddings, 12 per block, then the head.
    ranges_.push_back({0, 2});
    for (std::size_t i = 0; i < config.layers; ++i) ranges_.push_back({2 + 12 * i, 14 + 12 * i});
    ranges_.push_back({2 + 12 * config.layers, 5 + 12 * config.layers});
    if (engine.params().size() != ranges_.back().last || engine.params()[0].name.view() != "transformer.wte.weight" ||
        engine.params().back().name.view() != "lm_head.weight")
      throw std::invalid_argument("kfsdp::gpt_trainer: the engine's model is not the example GPT of " +
                                  std::to_string(config.layers) + " layers");
  }

  [[nodiscard]] const nn::gpt_config& config() const noexcept { return config_; }
  [[nodiscard]] std::size_t local_batch() const noexcept { return compute_.batch(); }
  [[nodiscard]] param_range stage_range(std::size_t stage) const { return ranges_.at(stage); }

  // Forward and backward of one micro-batch: d(loss)/d(logits) is scaled by grad_scale, and with
  // sync the gradients are reduce-scattered (else they stay unsharded, summing). Returns the
  // local mean loss.
  double forward_backward(const micro_batch& batch, Scalar grad_scale, bool sync) {
    compute_.set_batch(batch.tokens, batch.targets);
    compute_.set_grad_scale(grad_scale);
    const std::size_t stages = ranges_.size();
    for (std::size_t s = 0; s < stages; ++s) {
      engine_.before_forward(ranges_[s], s + 1 < stages ? std::optional(ranges_[s + 1]) : std::nullopt);
      const trace_recorder::scope region(engine_.trace(), "forward " + stage_name(s), "compute",
                                         trace_recorder::compute_lane, -1, 0);
      compute_.forward(s, stage_params(s));
      engine_.after_forward(ranges_[s]);
    }
    const double local_loss = double(compute_.loss());
    for (std::size_t s = stages; s-- > 0;) {
      engine_.before_backward(ranges_[s], s > 0 ? std::optional(ranges_[s - 1]) : std::nullopt);
      {
        const trace_recorder::scope region(engine_.trace(), "backward " + stage_name(s), "compute",
                                           trace_recorder::compute_lane, -1, 0);
        compute_.backward(s, stage_params(s), stage_grads(s));
      }
      engine_.after_backward(ranges_[s], sync);
    }
    engine_.finish_gradient_reductions();
    return local_loss;
  }

  // One optimizer step over K = batches.size() micro-batches (each of local_batch windows on every
  // rank): gradients averaged over the K · world_size micro-batches, clipped to max_norm (0: no
  // clipping), then optimizer.step on the local shards.
  template <class Optimizer>
  step_result step(const std::vector<micro_batch>& batches, Optimizer& optimizer, double max_norm,
                   grad_accumulation accumulation) {
    if (batches.empty()) throw std::invalid_argument("kfsdp::gpt_trainer::step: no micro-batch given");
    engine_.zero_grad();
    // Each rank's gradient is the mean over its rows (and K); the engine averages over ranks.
    const Scalar grad_scale = Scalar(1) / Scalar(compute_.rows() * batches.size());
    double loss_sum = 0;
    for (std::size_t k = 0; k < batches.size(); ++k) {
      const bool sync = accumulation == grad_accumulation::sharded || k + 1 == batches.size();
      loss_sum += forward_backward(batches[k], grad_scale, sync);
    }
    step_result result;
    result.loss = global_mean(loss_sum / double(batches.size()));
    result.grad_norm = global_grad_norm();
    if (max_norm > 0) {
      const double scale = optim::clip_scale(result.grad_norm, max_norm);
      if (scale < 1) optim::scale_in_place(engine_.grads().flat(), scale);
    }
    {
      const trace_recorder::scope region(engine_.trace(), "optimizer", "compute", trace_recorder::compute_lane, -1, 0);
      optimizer.step(engine_.shards().flat(), engine_.grads().flat());
    }
    return result;
  }

  // The global norm of the gradient shards (an all-reduce of local squared norms).
  double global_grad_norm() {
    double squared[1] = {optim::local_squared_norm(engine_.grads().flat())};
    engine_.communicator().all_reduce_sum(std::span<double>(squared));
    return std::sqrt(squared[0]);
  }

  // The mean over ranks of a per-rank mean (every rank holds the same number of rows).
  double global_mean(double local) {
    double value[1] = {local};
    engine_.communicator().all_reduce_sum(std::span<double>(value));
    return value[0] / double(engine_.world_size());
  }

  // Runs f(stage_params) with every parameter unsharded (evaluation, generation), then reshards.
  template <class F>
  decltype(auto) with_full_model(F&& f) {
    for (std::size_t b = 0; b < engine_.plan().buckets.size(); ++b) engine_.begin_unshard(b);
    for (std::size_t b = 0; b < engine_.plan().buckets.size(); ++b) engine_.finish_unshard(b);
    struct reshard_all {
      Engine& e;
      ~reshard_all() {
        for (std::size_t b = 0; b < e.plan().buckets.size(); ++b) e.reshard(b);
      }
    } guard{engine_};
    return f([this](std::size_t s) { return stage_params(s); });
  }

  // Mean loss over the windows this rank is given (forward only, full model gathered once).
  // Returns the sum of per-byte losses and the byte count, for an all-reduce by the caller.
  std::pair<double, double> eval_sum(const std::vector<micro_batch>& windows) {
    return with_full_model([&](auto&&) {
      nn::gpt<Scalar> one(config_, 1);
      double sum = 0, count = 0;
      for (const micro_batch& w : windows) {
        one.set_batch(w.tokens, w.targets);
        for (std::size_t s = 0; s < ranges_.size(); ++s) one.forward(s, stage_params(s));
        sum += double(one.loss()) * double(w.tokens.size());
        count += double(w.tokens.size());
      }
      return std::pair(sum, count);
    });
  }

  // A text sample continuing `prompt` (the same on every rank: same seed).
  std::string generate(const std::string& prompt, std::size_t new_bytes, nn::sampling how) {
    return with_full_model([&](auto&& params_of) {
      std::vector<int> ids(prompt.begin(), prompt.end());
      for (int& id : ids) id = static_cast<unsigned char>(id);
      const std::function<nn::gpt_stage_tensors<const Scalar>(std::size_t)> params = params_of;
      const std::vector<int> out = nn::generate<Scalar>(config_, params, ids, new_bytes, how);
      std::string text;
      for (int id : out) text.push_back(static_cast<char>(id));
      return text;
    });
  }

  // Stage s's parameters as the layers' views over the engine's unsharded buffers.
  [[nodiscard]] nn::gpt_stage_tensors<const Scalar> stage_params(std::size_t s) const {
    return stage_views<const Scalar>(s, [this](std::size_t p) { return engine_.full_param(p); });
  }
  [[nodiscard]] nn::gpt_stage_tensors<Scalar> stage_grads(std::size_t s) {
    return stage_views<Scalar>(s, [this](std::size_t p) { return engine_.full_grad(p); });
  }

 private:
  [[nodiscard]] std::string stage_name(std::size_t s) const {
    return s == 0 ? "embeddings" : s <= config_.layers ? "block " + std::to_string(s - 1) : "head";
  }

  template <class Element, class Lookup>
  nn::gpt_stage_tensors<Element> stage_views(std::size_t s, Lookup&& flat) const {
    std::size_t p = ranges_.at(s).first;
    auto vec = [&]() {
      const auto v = flat(p++);
      return nn::vector_of<Element>(v.data(), v.extent(0));
    };
    auto mat = [&]() {
      const param_info& info = engine_.params()[p];
      const auto v = flat(p++);
      return nn::matrix_of<Element>(v.data(), info.shape[0], info.shape[1]);
    };
    auto lin = [&]() {
      auto w = mat();
      return nn::linear_tensors<Element>(w, vec());
    };
    auto norm = [&]() {
      auto w = vec();
      return nn::layer_norm_tensors<Element>(w, vec());
    };
    if (s == 0) {
      auto wte = mat();
      return nn::gpt_embedding_tensors<Element>(wte, mat());
    }
    if (s <= config_.layers) {
      auto ln_1 = norm();
      auto c_attn = lin();
      auto attn = nn::attention_tensors<Element>(c_attn, lin());
      auto ln_2 = norm();
      auto c_fc = lin();
      auto mlp = nn::mlp_tensors<Element>(c_fc, lin());
      return nn::block_tensors<Element>(ln_1, attn, ln_2, mlp);
    }
    auto ln_f = norm();
    return nn::gpt_head_tensors<Element>(ln_f, mat());
  }

  Engine& engine_;
  nn::gpt_config config_;
  nn::gpt<Scalar> compute_;
  std::vector<param_range> ranges_;
};

}  // namespace kfsdp
