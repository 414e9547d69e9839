#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Llama's training helpers: transformers' initialisation of LlamaForCausalLM, and the run-time
// Llama's compute compiled once (kernels/compute/llama.cpp).
//
//   auto model = kfsdp::make_llama({.layers = 2, .dim = 64, .hidden = 176, .heads = 4, .kv_heads = 2});
//   kfsdp::trainer<decltype(model), float> t(model, world,
//                                            {.sharding_strategy = kfsdp::sharding_strategy::zero3});
//   t.initialize(1337, kfsdp::llama_init());

#include <kfsdp/model/llama.hpp>
#include <kfsdp/train/trainer.hpp>

#include <functional>
#include <string_view>

namespace kfsdp {

extern template class network<llama_descriptor, float>;
extern template class network<llama_descriptor, double>;

// LlamaPreTrainedModel._init_weights: N(0, initializer_range²) for every linear's weight and the
// embedding, biases zero, RMSNorm weights one (initializer_range is 0.02 in transformers' LlamaConfig).
KFSDP_EXPORT inline std::function<param_init(const param_info&)> llama_init(double initializer_range = 0.02) {
  return [initializer_range](const param_info& p) -> param_init {
    if (p.name.view().ends_with("norm.weight")) return {param_init::ones, 0.0};
    if (p.name.view().ends_with(".bias")) return {param_init::zeros, 0.0};
    return {param_init::normal, initializer_range};
  };
}

}  // namespace kfsdp
