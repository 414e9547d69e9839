#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Sizes of a Llama-family model, named as kfsdp names them, each beside the key of transformers'
// LlamaConfig (config.json) that holds it. make_llama builds the descriptor from it; the Hugging
// Face checkpoint reader and writer translate it to and from config.json.
//
//   kfsdp::llama_config c{.layers = 2, .dim = 64, .hidden = 176, .heads = 4, .kv_heads = 2};
//   c.validate();   // throws std::invalid_argument naming the size at fault

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include <kfsdp/model/rope_scaling.hpp>

namespace kfsdp {

// config.json's model_type: the families that compute as LlamaForCausalLM does, with what each adds.
KFSDP_EXPORT enum class llama_family {
  llama,    // LlamaForCausalLM (attention_bias: q, k, v and o_proj biases)
  qwen2,    // Qwen2ForCausalLM: q, k and v biases always, none on o_proj
  mistral,  // MistralForCausalLM: a sliding_window, never narrower than the window trained on
};

KFSDP_EXPORT struct llama_config {
  std::size_t vocab = 256;      // vocab_size
  std::size_t dim = 128;        // hidden_size
  std::size_t hidden = 352;     // intermediate_size (the SwiGLU MLP's width)
  std::size_t layers = 4;       // num_hidden_layers
  std::size_t heads = 4;        // num_attention_heads
  std::size_t kv_heads = 2;     // num_key_value_heads (grouped-query attention; = heads for MHA)
  std::size_t seq = 64;         // max_position_embeddings
  double rope_theta = 10000.0;  // rope_theta
  double rms_norm_eps = 1e-6;   // rms_norm_eps
  bool tie_weights = false;     // tie_word_embeddings: lm_head.weight is model.embed_tokens.weight
  std::size_t head_width = 0;   // head_dim where the config sets it (Mistral); 0: dim / heads
  bool qkv_bias = false;        // q_proj, k_proj, v_proj biases (attention_bias; Qwen2 always)
  bool o_bias = false;          // o_proj's bias (attention_bias in Llama; Qwen2 never)
  rope_scaling rope{};          // rope_scaling, or transformers 5's rope_parameters, beyond rope_theta
  llama_family family = llama_family::llama;  // model_type
  std::size_t sliding_window = 0;  // sliding_window (Mistral); 0 for null: every position sees the whole window

  // Each query head's width (head_dim).
  constexpr std::size_t head_dim() const { return head_width != 0 ? head_width : dim / heads; }

  // make_llama's parameters, counted before anything is built, in doubles (absurd sizes give huge
  // counts, never wrapped ones): the embeddings; a layer's q and o (dim·heads·head_dim), k and v
  // (dim·kv_heads·head_dim), their biases, SwiGLU MLP (3·dim·hidden) and two norms; the final norm;
  // lm_head unless tied.
  //   {.vocab = 128256, .dim = 4096, .hidden = 14336, .layers = 32, .heads = 32, .kv_heads = 8}  ->  8.03e9
  constexpr double parameters() const {
    const double d = double(dim), q = double(heads) * double(head_dim()), kv = double(kv_heads) * double(head_dim());
    const double biases = (qkv_bias ? q + 2 * kv : 0) + (o_bias ? d : 0);
    const double layer = 2 * d * q + 2 * d * kv + biases + 3 * d * double(hidden) + 2 * d;
    return double(vocab) * d * (tie_weights ? 1 : 2) + double(layers) * layer + d;
  }

  // Throws std::invalid_argument naming the size that is zero, heads not dividing dim, kv_heads not
  // dividing heads, or an odd head width (RoPE rotates pairs).
  constexpr void validate() const {
    for (auto [value, name] : {std::pair{vocab, "vocab"}, std::pair{dim, "dim"}, std::pair{hidden, "hidden"},
                               std::pair{layers, "layers"}, std::pair{heads, "heads"},
                               std::pair{kv_heads, "kv_heads"}, std::pair{seq, "seq"}})
      if (value == 0) throw std::invalid_argument(std::string("kfsdp::llama_config: ") + name + " is 0, expected at least 1");
    if (head_width == 0 && dim % heads != 0)
      throw std::invalid_argument("kfsdp::llama_config: heads is " + std::to_string(heads) +
                                  ", expected a divisor of dim = " + std::to_string(dim) + " (or a head_width)");
    if (heads % kv_heads != 0)
      throw std::invalid_argument("kfsdp::llama_config: kv_heads is " + std::to_string(kv_heads) +
                                  ", expected a divisor of heads = " + std::to_string(heads));
    if (head_dim() % 2 != 0)
      throw std::invalid_argument("kfsdp::llama_config: the head width (head_width, or dim / heads) is " +
                                  std::to_string(head_dim()) + ", expected an even number (RoPE rotates pairs)");
    if (!(rope_theta > 0.0))
      throw std::invalid_argument("kfsdp::llama_config: rope_theta is " + std::to_string(rope_theta) +
                                  ", expected a positive number");
    rope.validate();
    if (!(rms_norm_eps >= 0.0))
      throw std::invalid_argument("kfsdp::llama_config: rms_norm_eps is " + std::to_string(rms_norm_eps) +
                                  ", expected zero or more");
  }
};

}  // namespace kfsdp
