#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Llama-family models (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM) under transformers'
// parameter names: token embedding, decoder layers of RMSNorm → grouped-query attention with RoPE
// → RMSNorm → SwiGLU MLP (linears without bias; the attention's q/k/v and o biases as the config
// asks), a final RMSNorm and an lm_head, tied to the embedding or not. Each decoder layer
// is a block: one FSDP unit. For dim 64, hidden 176, heads 4, kv_heads 2 (head_dim 16), vocab 256:
//   model.embed_tokens.weight [256, 64]
//   model.layers.N.input_layernorm.weight [64]
//   model.layers.N.self_attn.{q_proj [64, 64], k_proj [32, 64], v_proj [32, 64], o_proj [64, 64]}.weight
//   model.layers.N.post_attention_layernorm.weight [64]
//   model.layers.N.mlp.{gate_proj [176, 64], up_proj [176, 64], down_proj [64, 176]}.weight
//   model.norm.weight [64], lm_head.weight [256, 64] (absent when tied) — 2 + 9·L + 1 parameters.
// With qkv_bias, model.layers.N.self_attn.{q_proj [64], k_proj [32], v_proj [32]}.bias; with o_bias,
// o_proj.bias [64]. With head_width 32: q_proj [128, 64], k_proj, v_proj [64, 64], o_proj [64, 128].
// With a LoRA adapter of rank 8 on q_proj (lora_config's targets), after its weight (and bias):
//   model.layers.N.self_attn.q_proj.lora_A.weight [8, 64], model.layers.N.self_attn.q_proj.lora_B.weight [64, 8]
// The q/k/v and gate/up projections are one concat each (one input, outputs side by side), so the
// attention sees [q | k | v] and swiglu [gate | up] as the fused forms do, under the separate names.
//
//   kfsdp::llama<2, 64, 176, 4, 2, 32> small;                        // fully static (theta, eps: defaults)
//   auto m = kfsdp::make_llama({.layers = 2, .dim = 64, .hidden = 176, .heads = 4, .kv_heads = 2});

#include <cstddef>
#include <stdexcept>
#include <array>
#include <string>
#include <string_view>

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/llama_config.hpp>
#include <kfsdp/model/lora_config.hpp>
#include <kfsdp/model/rowwise.hpp>

namespace kfsdp {

namespace detail {
// The key (or value) projection's width, kv_heads · dim / heads; dyn when a size is.
constexpr std::size_t kv_width(std::size_t dim, std::size_t heads, std::size_t kv_heads) {
  return dim == dyn || heads == dyn || kv_heads == dyn ? dyn : kv_heads * (dim / heads);
}
constexpr std::size_t head_width(std::size_t dim, std::size_t heads) { return dim == dyn || heads == dyn ? dyn : dim / heads; }
}  // namespace detail

// Each projection may carry a LoRA adapter (lora_config's targets, by these names): optional_lora,
// absent unless asked for.
template <fixed_string Name, std::size_t In = dyn, std::size_t Out = dyn>
using llama_projection = optional_lora<optional_bias<linear<Name, In, Out>>>;
template <fixed_string Name, std::size_t In = dyn, std::size_t Out = dyn>
using llama_mlp_projection = optional_lora<linear<Name, In, Out, false>>;

// self_attn: [q | k | v] = concat(q_proj, k_proj, v_proj)(x), RoPE on q and k, causal attention, o_proj.
// Each projection's bias is a run-time choice (attention_bias, Qwen2): optional_bias, absent unless asked for.
template <std::size_t Dim = dyn, std::size_t Heads = dyn, std::size_t KVHeads = dyn, std::size_t Seq = dyn>
using llama_attention =
    sequential<"self_attn",
               concat<"", llama_projection<"q_proj", Dim, Dim>, llama_projection<"k_proj", Dim, detail::kv_width(Dim, Heads, KVHeads)>,
                      llama_projection<"v_proj", Dim, detail::kv_width(Dim, Heads, KVHeads)>>,
               rotary_embedding<"", Heads, KVHeads, detail::head_width(Dim, Heads), Seq>,
               causal_self_attention<"", Dim, Heads, Seq, KVHeads>, llama_projection<"o_proj", Dim, Dim>>;

// mlp: down_proj(silu(gate_proj(x)) · up_proj(x)).
template <std::size_t Dim = dyn, std::size_t Hidden = dyn>
using llama_mlp = sequential<"mlp", concat<"", llama_mlp_projection<"gate_proj", Dim, Hidden>, llama_mlp_projection<"up_proj", Dim, Hidden>>,
                             swiglu<"">, llama_mlp_projection<"down_proj", Hidden, Dim>>;

// The modules a lora_config may target in a Llama (peft's target_modules names; "all-linear" is all of them).
KFSDP_EXPORT inline constexpr std::array<std::string_view, 7> llama_lora_modules = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// LlamaDecoderLayer: x = x + self_attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)).
template <std::size_t Dim = dyn, std::size_t Hidden = dyn, std::size_t Heads = dyn, std::size_t KVHeads = dyn,
          std::size_t Seq = dyn>
using llama_block = block<"", residual<"", rms_norm<"input_layernorm", Dim>, llama_attention<Dim, Heads, KVHeads, Seq>>,
                          residual<"", rms_norm<"post_attention_layernorm", Dim>, llama_mlp<Dim, Hidden>>>;

namespace detail {
// A projection named Name: its bias as asked, its adapter as `lora` targets it.
template <fixed_string Name>
llama_projection<Name> llama_projection_for(std::size_t in, std::size_t out, bool bias, const lora_config& lora) {
  return {optional_bias<linear<Name>>(linear<Name>(in, out), bias), lora.adapts(Name.view()) ? lora.rank : 0, lora.alpha};
}
template <fixed_string Name>
llama_mlp_projection<Name> llama_mlp_projection_for(std::size_t in, std::size_t out, const lora_config& lora) {
  return {linear<Name, dyn, dyn, false>(in, out), lora.adapts(Name.view()) ? lora.rank : 0, lora.alpha};
}
}  // namespace detail

// The head; with tie_weights its weight is model.embed_tokens.weight (tie_word_embeddings).
template <std::size_t Dim = dyn, std::size_t Vocab = dyn>
using llama_head = tied<"model.embed_tokens.weight", "weight", linear<"lm_head", Dim, Vocab, false>, false>;

// Seq is the window: positions (RoPE) and the causal mask count within windows of Seq tokens.
KFSDP_EXPORT template <std::size_t Layers = dyn, std::size_t Dim = dyn, std::size_t Hidden = dyn, std::size_t Heads = dyn,
          std::size_t KVHeads = dyn, std::size_t Seq = dyn, std::size_t Vocab = 256>
using llama = sequential<"",
                         sequential<"model", embedding<"embed_tokens", Vocab, Dim>,
                                    repeat<"layers", Layers, llama_block<Dim, Hidden, Heads, KVHeads, Seq>>,
                                    rms_norm<"norm", Dim>>,
                         llama_head<Dim, Vocab>, cross_entropy<"", Vocab>>;

// The type of every Llama whose sizes come at run time (make_llama's).
KFSDP_EXPORT using llama_descriptor = llama<dyn, dyn, dyn, dyn, dyn, dyn, dyn>;

// The Llama descriptor for a configuration (validated: a bad size throws naming it). `window` is the
// number of tokens per training window (RoPE's positions and the causal mask count within it);
// 0 takes c.seq (max_position_embeddings); more than c.seq, or than a sliding_window, throws.
// The attention is heads · head_dim wide (dim unless head_width says otherwise; o_proj maps it back).
// `lora` puts an adapter on each targeted projection of every layer (validated as well).
KFSDP_EXPORT inline llama_descriptor make_llama(const llama_config& c, std::size_t window = 0, const lora_config& lora = {}) {
  c.validate();
  lora.validate(llama_lora_modules);
  const std::size_t seq = window == 0 ? c.seq : window;
  if (seq > c.seq)
    throw std::invalid_argument("kfsdp::make_llama: window is " + std::to_string(seq) +
                                ", expected at most seq (max_position_embeddings) = " + std::to_string(c.seq));
  // A window no wider than sliding_window is one the sliding mask never narrows.
  if (c.sliding_window != 0 && c.sliding_window < seq)
    throw std::invalid_argument("kfsdp::make_llama: sliding_window is " + std::to_string(c.sliding_window) +
                                ", expected null or at least the window " + std::to_string(seq) +
                                " (kfsdp's attention sees the whole window)");
  const std::size_t d = c.dim, hd = c.head_dim(), q = c.heads * hd, kv = c.kv_heads * hd;
  using attention_t = llama_attention<>;
  using mlp_t = llama_mlp<>;
  using qkv_t = concat<"", llama_projection<"q_proj">, llama_projection<"k_proj">, llama_projection<"v_proj">>;
  using gate_up_t = concat<"", llama_mlp_projection<"gate_proj">, llama_mlp_projection<"up_proj">>;
  using norm_1_t = rms_norm<"input_layernorm">;
  using norm_2_t = rms_norm<"post_attention_layernorm">;
  const attention_t attention(
      qkv_t(detail::llama_projection_for<"q_proj">(d, q, c.qkv_bias, lora), detail::llama_projection_for<"k_proj">(d, kv, c.qkv_bias, lora),
            detail::llama_projection_for<"v_proj">(d, kv, c.qkv_bias, lora)),
      rotary_embedding<"">(c.heads, c.kv_heads, hd, seq, c.rope_theta, c.rope),
      causal_self_attention<"", dyn, dyn, dyn, dyn>(q, c.heads, seq, c.kv_heads),
      detail::llama_projection_for<"o_proj">(q, d, c.o_bias, lora));
  const mlp_t mlp(gate_up_t(detail::llama_mlp_projection_for<"gate_proj">(d, c.hidden, lora),
                            detail::llama_mlp_projection_for<"up_proj">(d, c.hidden, lora)),
                  swiglu<"">{}, detail::llama_mlp_projection_for<"down_proj">(c.hidden, d, lora));
  using block_t = llama_block<>;
  const block_t one_block(residual<"", norm_1_t, attention_t>(norm_1_t(d, c.rms_norm_eps), attention),
                          residual<"", norm_2_t, mlp_t>(norm_2_t(d, c.rms_norm_eps), mlp));
  using model_t = sequential<"model", embedding<"embed_tokens">, repeat<"layers", dyn, block_t>, rms_norm<"norm">>;
  return llama_descriptor(model_t(embedding<"embed_tokens">(c.vocab, d), repeat<"layers", dyn, block_t>(c.layers, one_block),
                                  rms_norm<"norm">(d, c.rms_norm_eps)),
                          llama_head<>(linear<"lm_head", dyn, dyn, false>(d, c.vocab), c.tie_weights),
                          cross_entropy<"">(c.vocab));
}

}  // namespace kfsdp
