#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The example GPT: nanoGPT's architecture and parameter names, byte vocabulary, untied lm_head
// without bias, trained with cross-entropy — its parameters and its compute in one descriptor.
// For gpt<2, 64, 32>: transformer.wte.weight [256,64], transformer.wpe.weight [32,64],
// transformer.h.{0,1}.{ln_1, attn.c_attn [192,64], attn.c_proj [64,64], ln_2, mlp.c_fc [256,64],
// mlp.c_proj [64,256]}, transformer.ln_f, lm_head.weight [256,64] — 4 + 12·L + 1 parameters.
//
//   kfsdp::gpt<96, 768, 1024> big;                       // fully static
//   auto m = kfsdp::make_gpt({.layers = 4, .dim = 128, .seq = 64});  // sizes from the command line

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>

namespace kfsdp {

namespace detail {
// GPT-2's head width of 64 where the width allows it.
constexpr std::size_t default_heads(std::size_t dim) { return dim == dyn ? dyn : dim % 64 == 0 ? dim / 64 : 1; }
}  // namespace detail

template <std::size_t Dim = dyn, std::size_t Heads = dyn, std::size_t Seq = dyn>
using gpt_attention = sequential<"attn", linear<"c_attn", Dim, scaled_extent<3, Dim>>,
                                 causal_self_attention<"", Dim, Heads, Seq>, linear<"c_proj", Dim, Dim>>;

template <std::size_t Dim = dyn>
using gpt_mlp = sequential<"mlp", linear<"c_fc", Dim, scaled_extent<4, Dim>>, gelu<>,
                           linear<"c_proj", scaled_extent<4, Dim>, Dim>>;

// nanoGPT's Block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
template <std::size_t Dim = dyn, std::size_t Heads = dyn, std::size_t Seq = dyn>
using gpt_block = block<"", residual<"", layer_norm<"ln_1", Dim>, gpt_attention<Dim, Heads, Seq>>,
                        residual<"", layer_norm<"ln_2", Dim>, gpt_mlp<Dim>>>;

// The head; with tie_weights its weight is transformer.wte.weight (nanoGPT's weight tying).
template <std::size_t Dim = dyn, std::size_t Vocab = dyn>
using gpt_head = tied<"transformer.wte.weight", "weight", linear<"lm_head", Dim, Vocab, false>, false>;

KFSDP_EXPORT template <std::size_t Layers = dyn, std::size_t Dim = dyn, std::size_t Seq = dyn, std::size_t Vocab = 256,
          std::size_t Heads = detail::default_heads(Dim)>
using gpt = sequential<"",
                       sequential<"transformer", embedding<"wte", Vocab, Dim>,
                                  positional_embedding<"wpe", Seq, Dim>, repeat<"h", Layers, gpt_block<Dim, Heads, Seq>>,
                                  layer_norm<"ln_f", Dim>>,
                       gpt_head<Dim, Vocab>, cross_entropy<"", Vocab>>;

// Sizes of the example GPT, for the descriptor (make_gpt) and the layers (nn::gpt) alike; heads
// does not shape a parameter, the attention uses it.
KFSDP_EXPORT struct gpt_config {
  std::size_t layers = 4;
  std::size_t dim = 128;
  std::size_t heads = 4;
  std::size_t seq = 64;
  std::size_t vocab = 256;
  bool tie_weights = false;  // lm_head.weight is transformer.wte.weight

  // Throws std::invalid_argument naming the size that is zero, or heads not dividing dim.
  constexpr void validate() const {
    for (auto [value, name] : {std::pair{layers, "layers"}, std::pair{dim, "dim"}, std::pair{heads, "heads"},
                               std::pair{seq, "seq"}, std::pair{vocab, "vocab"}})
      if (value == 0) throw std::invalid_argument(std::string("kfsdp::gpt_config: ") + name + " is 0, expected at least 1");
    (void)checked_mul(4, dim, [] { return "gpt_config: dim (the MLP is 4·dim wide)"; });
    if (dim % heads != 0)
      throw std::invalid_argument("kfsdp::gpt_config: heads is " + std::to_string(heads) +
                                  ", expected a divisor of dim = " + std::to_string(dim));
  }
};

// The configuration as a checkpoint's metadata records it (field, value): a file holds weights for
// one configuration only (heads, say, change no shape, but every attention's meaning).
//   gpt_metadata({.layers = 2}) -> {layers 2}, {dim 128}, {heads 4}, {seq 64}, {vocab 256}, {tie_weights off}
KFSDP_EXPORT inline std::vector<std::pair<std::string, std::string>> gpt_metadata(const gpt_config& c) {
  return {{"layers", std::to_string(c.layers)}, {"dim", std::to_string(c.dim)},
          {"heads", std::to_string(c.heads)},   {"seq", std::to_string(c.seq)},
          {"vocab", std::to_string(c.vocab)},   {"tie_weights", c.tie_weights ? "on" : "off"}};
}

// The type of every GPT whose sizes come at run time (make_gpt's).
KFSDP_EXPORT using gpt_descriptor = gpt<dyn, dyn, dyn, dyn, dyn>;

// The GPT descriptor for sizes known only at run time (vocab too); a zero size throws naming it.
KFSDP_EXPORT constexpr gpt<dyn, dyn, dyn, dyn, dyn> make_gpt(const gpt_config& c) {
  c.validate();
  const std::size_t d = c.dim;
  using block_t = gpt_block<>;
  using attention_t = gpt_attention<>;
  using mlp_t = gpt_mlp<>;
  using ln_1_t = layer_norm<"ln_1">;
  using ln_2_t = layer_norm<"ln_2">;
  const block_t one_block(
      residual<"", ln_1_t, attention_t>(ln_1_t(d), attention_t(linear<"c_attn">(d, 3 * d), causal_self_attention<"">(d, c.heads, c.seq),
                                                               linear<"c_proj">(d, d))),
      residual<"", ln_2_t, mlp_t>(ln_2_t(d), mlp_t(linear<"c_fc">(d, 4 * d), gelu<>{}, linear<"c_proj">(4 * d, d))));
  using transformer_t = sequential<"transformer", embedding<"wte">, positional_embedding<"wpe">,
                                   repeat<"h", dyn, block_t>, layer_norm<"ln_f">>;
  return gpt<dyn, dyn, dyn, dyn, dyn>(
      transformer_t(embedding<"wte">(c.vocab, d), positional_embedding<"wpe">(c.seq, d),
                    repeat<"h", dyn, block_t>(c.layers, one_block), layer_norm<"ln_f">(d)),
      gpt_head<>(linear<"lm_head", dyn, dyn, false>(d, c.vocab), c.tie_weights), cross_entropy<"">(c.vocab));
}

}  // namespace kfsdp
