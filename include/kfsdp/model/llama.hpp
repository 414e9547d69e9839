#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Llama-family models (LlamaForCausalLM) under transformers' parameter names: token embedding,
// decoder layers of RMSNorm → grouped-query attention with RoPE → RMSNorm → SwiGLU MLP (linears
// without bias), a final RMSNorm and an lm_head, tied to the embedding or not. Each decoder layer
// is a block: one FSDP unit. For dim 64, hidden 176, heads 4, kv_heads 2 (head_dim 16), vocab 256:
//   model.embed_tokens.weight [256, 64]
//   model.layers.N.input_layernorm.weight [64]
//   model.layers.N.self_attn.{q_proj [64, 64], k_proj [32, 64], v_proj [32, 64], o_proj [64, 64]}.weight
//   model.layers.N.post_attention_layernorm.weight [64]
//   model.layers.N.mlp.{gate_proj [176, 64], up_proj [176, 64], down_proj [64, 176]}.weight
//   model.norm.weight [64], lm_head.weight [256, 64] (absent when tied) — 2 + 9·L + 1 parameters.
// The q/k/v and gate/up projections are one concat each (one input, outputs side by side), so the
// attention sees [q | k | v] and swiglu [gate | up] as the fused forms do, under the separate names.
//
//   kfsdp::llama<2, 64, 176, 4, 2, 32> small;                        // fully static (theta, eps: defaults)
//   auto m = kfsdp::make_llama({.layers = 2, .dim = 64, .hidden = 176, .heads = 4, .kv_heads = 2});

#include <cstddef>
#include <stdexcept>
#include <string>

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/llama_config.hpp>
#include <kfsdp/model/rowwise.hpp>

namespace kfsdp {

namespace detail {
// The key (or value) projection's width, kv_heads · dim / heads; dyn when a size is.
constexpr std::size_t kv_width(std::size_t dim, std::size_t heads, std::size_t kv_heads) {
  return dim == dyn || heads == dyn || kv_heads == dyn ? dyn : kv_heads * (dim / heads);
}
constexpr std::size_t head_width(std::size_t dim, std::size_t heads) { return dim == dyn || heads == dyn ? dyn : dim / heads; }
}  // namespace detail

// self_attn: [q | k | v] = concat(q_proj, k_proj, v_proj)(x), RoPE on q and k, causal attention, o_proj.
template <std::size_t Dim = dyn, std::size_t Heads = dyn, std::size_t KVHeads = dyn, std::size_t Seq = dyn>
using llama_attention =
    sequential<"self_attn",
               concat<"", linear<"q_proj", Dim, Dim, false>, linear<"k_proj", Dim, detail::kv_width(Dim, Heads, KVHeads), false>,
                      linear<"v_proj", Dim, detail::kv_width(Dim, Heads, KVHeads), false>>,
               rotary_embedding<"", Heads, KVHeads, detail::head_width(Dim, Heads), Seq>,
               causal_self_attention<"", Dim, Heads, Seq, KVHeads>, linear<"o_proj", Dim, Dim, false>>;

// mlp: down_proj(silu(gate_proj(x)) · up_proj(x)).
template <std::size_t Dim = dyn, std::size_t Hidden = dyn>
using llama_mlp = sequential<"mlp", concat<"", linear<"gate_proj", Dim, Hidden, false>, linear<"up_proj", Dim, Hidden, false>>,
                             swiglu<"">, linear<"down_proj", Hidden, Dim, false>>;

// LlamaDecoderLayer: x = x + self_attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)).
template <std::size_t Dim = dyn, std::size_t Hidden = dyn, std::size_t Heads = dyn, std::size_t KVHeads = dyn,
          std::size_t Seq = dyn>
using llama_block = block<"", residual<"", rms_norm<"input_layernorm", Dim>, llama_attention<Dim, Heads, KVHeads, Seq>>,
                          residual<"", rms_norm<"post_attention_layernorm", Dim>, llama_mlp<Dim, Hidden>>>;

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
// 0 takes c.seq (max_position_embeddings); more than c.seq throws.
KFSDP_EXPORT inline llama_descriptor make_llama(const llama_config& c, std::size_t window = 0) {
  c.validate();
  const std::size_t seq = window == 0 ? c.seq : window;
  if (seq > c.seq)
    throw std::invalid_argument("kfsdp::make_llama: window is " + std::to_string(seq) +
                                ", expected at most seq (max_position_embeddings) = " + std::to_string(c.seq));
  const std::size_t d = c.dim, hd = c.head_dim(), kv = c.kv_heads * hd;
  using attention_t = llama_attention<>;
  using mlp_t = llama_mlp<>;
  using qkv_t = concat<"", linear<"q_proj", dyn, dyn, false>, linear<"k_proj", dyn, dyn, false>, linear<"v_proj", dyn, dyn, false>>;
  using gate_up_t = concat<"", linear<"gate_proj", dyn, dyn, false>, linear<"up_proj", dyn, dyn, false>>;
  using norm_1_t = rms_norm<"input_layernorm">;
  using norm_2_t = rms_norm<"post_attention_layernorm">;
  const attention_t attention(
      qkv_t(linear<"q_proj", dyn, dyn, false>(d, d), linear<"k_proj", dyn, dyn, false>(d, kv),
            linear<"v_proj", dyn, dyn, false>(d, kv)),
      rotary_embedding<"">(c.heads, c.kv_heads, hd, seq, c.rope_theta),
      causal_self_attention<"", dyn, dyn, dyn, dyn>(d, c.heads, seq, c.kv_heads), linear<"o_proj", dyn, dyn, false>(d, d));
  const mlp_t mlp(gate_up_t(linear<"gate_proj", dyn, dyn, false>(d, c.hidden), linear<"up_proj", dyn, dyn, false>(d, c.hidden)),
                  swiglu<"">{}, linear<"down_proj", dyn, dyn, false>(c.hidden, d));
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
