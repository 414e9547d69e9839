#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Leaf layer descriptors with PyTorch's parameter layout and default initialisation.
//   linear<"c_attn", 64, 192>      -> weight [192, 64], bias [192]   U(±1/√64) both (nn.Linear)
//   lora_linear<"q_proj", 64, 64, false>(8, 16.0) (rank 8, alpha 16) -> weight [64, 64] U(±1/√64),
//                                     lora_A.weight [8, 64] U(±1/√64), lora_B.weight [64, 8] zeros (peft)
//   layer_norm<"ln_1", 64>         -> weight [64] ones, bias [64] zeros
//   embedding<"wte", 256, 64>      -> weight [256, 64] N(0, 1)       ids in, features out
//   positional_embedding<"wpe", 32, 64> -> weight [32, 64] N(0, 1)   x + weight[row % 32]
//   gelu<>, gelu_tanh<>, relu<>, silu<>, tanh_layer<>                    no parameters
//   causal_self_attention<"", 64, 4, 32>                             [rows, 192] -> [rows, 64]
//   causal_self_attention<"", 64, 4, 32, 2> (grouped-query: 2 kv heads) [rows, 128] -> [rows, 64]
//   rotary_embedding<"", 4, 2, 16, 32>   (RoPE on q and k)           [rows, 128] -> [rows, 128]
//   cross_entropy<"", 256>, mse<>                                    loss layers (targets)
// A size may be kfsdp::dyn and given to the constructor: linear<"fc", dyn, dyn>(in, out).
// Each layer's compute (forward, backward) is kfsdp::compute_t<Layer, Scalar> (compute/ops.hpp), chosen by
// Layer::anonymous, the layer with its name "": nvcc deduces no fixed_string in a partial specialization.

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <kfsdp/model/descriptor.hpp>
#include <kfsdp/model/rope_scaling.hpp>
#include <kfsdp/model/rowwise.hpp>

namespace kfsdp {

KFSDP_EXPORT template <fixed_string Name, std::size_t In = dyn, std::size_t Out = dyn, bool Bias = true>
struct linear {
  static_assert(In != 0, "kfsdp::linear: In (input features) must be at least 1");
  static_assert(Out != 0, "kfsdp::linear: Out (output features) must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = linear<"", In, Out, Bias>;  // the same layer unnamed: what its compute is chosen by
  static constexpr bool has_bias = Bias;

  std::size_t in_features = In;
  std::size_t out_features = Out;

  constexpr linear() requires(In != dyn && Out != dyn) = default;
  constexpr linear(std::size_t in, std::size_t out)
      : in_features(checked_extent<In>("linear", Name.view(), "in_features", in)),
        out_features(checked_extent<Out>("linear", Name.view(), "out_features", out)) {}

  [[nodiscard]] constexpr std::size_t out_features_for(std::size_t) const { return out_features; }
  [[nodiscard]] constexpr std::size_t expected_in_features() const { return in_features; }

  constexpr auto params() const {
    const init_rule bound{init_rule::uniform, 0.0, in_features};
    if constexpr (Bias)
      return std::array{param_decl{"weight", {out_features, in_features}, bound},
                        param_decl{"bias", {out_features}, bound}};
    else
      return std::array{param_decl{"weight", {out_features, in_features}, bound}};
  }
};

namespace detail {
// A LoRA adapter's A [rank, in] and B [out, rank], as peft starts them: A ~ kaiming_uniform(a=√5) =
// U(±1/√in), B zeros (so a fresh adapter leaves the layer's output unchanged).
constexpr std::array<param_decl, 2> lora_adapter(std::size_t in, std::size_t out, std::size_t rank) {
  return {param_decl{"lora_A.weight", {rank, in}, init_rule{init_rule::uniform, 0.0, in}},
          param_decl{"lora_B.weight", {out, rank}}};
}
}  // namespace detail

// A linear layer with a LoRA adapter: y = x W^T + b + (alpha / rank) · (x A^T) B^T (nn/lora.hpp),
// under peft's names, so that its adapter saves as peft's. B starts at zero: a fresh adapter leaves
// the base's output unchanged. Freeze the base (optim::param_group{.frozen = true}) to train the
// adapter alone: no gradient is then computed, stored or reduced for it.
KFSDP_EXPORT template <fixed_string Name, std::size_t In = dyn, std::size_t Out = dyn, bool Bias = true>
struct lora_linear {
  static_assert(In != 0 && Out != 0, "kfsdp::lora_linear: In and Out must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = lora_linear<"", In, Out, Bias>;
  static constexpr bool has_bias = Bias;

  std::size_t in_features = In;
  std::size_t out_features = Out;
  std::size_t rank = 8;  // peft's defaults: r = 8, lora_alpha = 8
  double alpha = 8;

  constexpr lora_linear() requires(In != dyn && Out != dyn) = default;
  constexpr lora_linear(std::size_t rank_, double alpha_) requires(In != dyn && Out != dyn)
      : rank(checked_rank(rank_)), alpha(alpha_) {}
  constexpr lora_linear(std::size_t in, std::size_t out, std::size_t rank_, double alpha_)
      : in_features(checked_extent<In>("lora_linear", Name.view(), "in_features", in)),
        out_features(checked_extent<Out>("lora_linear", Name.view(), "out_features", out)),
        rank(checked_rank(rank_)),
        alpha(alpha_) {}

  [[nodiscard]] constexpr std::size_t out_features_for(std::size_t) const { return out_features; }
  [[nodiscard]] constexpr std::size_t expected_in_features() const { return in_features; }

  constexpr auto params() const {
    const init_rule bound{init_rule::uniform, 0.0, in_features};
    const auto [a, b] = detail::lora_adapter(in_features, out_features, rank);
    if constexpr (Bias)
      return std::array{param_decl{"weight", {out_features, in_features}, bound}, param_decl{"bias", {out_features}, bound}, a, b};
    else
      return std::array{param_decl{"weight", {out_features, in_features}, bound}, a, b};
  }

 private:
  static constexpr std::size_t checked_rank(std::size_t r) {
    if (r == 0) throw std::invalid_argument("kfsdp::lora_linear '" + std::string(Name.view()) + "': rank is 0, expected at least 1");
    return r;
  }
};

KFSDP_EXPORT template <fixed_string Name, std::size_t Dim = dyn>
struct layer_norm {
  static_assert(Dim != 0, "kfsdp::layer_norm: Dim must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = layer_norm<"", Dim>;  // the same layer unnamed: what its compute is chosen by

  std::size_t dim = Dim;

  constexpr layer_norm() requires(Dim != dyn) = default;
  constexpr explicit layer_norm(std::size_t d) : dim(checked_extent<Dim>("layer_norm", Name.view(), "dim", d)) {}

  [[nodiscard]] constexpr std::size_t expected_in_features() const { return dim; }

  constexpr auto params() const {
    return std::array{param_decl{"weight", {dim}, {init_rule::ones}}, param_decl{"bias", {dim}}};
  }
};

KFSDP_EXPORT template <fixed_string Name, std::size_t Num = dyn, std::size_t Dim = dyn>
struct embedding {
  static_assert(Num != 0, "kfsdp::embedding: Num (number of embeddings) must be at least 1");
  static_assert(Dim != 0, "kfsdp::embedding: Dim must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = embedding<"", Num, Dim>;  // the same layer unnamed: what its compute is chosen by

  std::size_t num_embeddings = Num;
  std::size_t dim = Dim;

  constexpr embedding() requires(Num != dyn && Dim != dyn) = default;
  constexpr embedding(std::size_t num, std::size_t d)
      : num_embeddings(checked_extent<Num>("embedding", Name.view(), "num_embeddings", num)),
        dim(checked_extent<Dim>("embedding", Name.view(), "dim", d)) {}

  using input = ids;
  [[nodiscard]] constexpr std::size_t out_features_for(std::size_t) const { return dim; }

  constexpr auto params() const {
    return std::array{param_decl{"weight", {num_embeddings, dim}, {init_rule::normal, 1.0}}};
  }
};

// y = x + weight[row % seq]: a learned position embedding added to the features (GPT's wpe),
// rows being windows of seq tokens one after another.
KFSDP_EXPORT template <fixed_string Name, std::size_t Seq = dyn, std::size_t Dim = dyn>
struct positional_embedding {
  static_assert(Seq != 0, "kfsdp::positional_embedding: Seq must be at least 1");
  static_assert(Dim != 0, "kfsdp::positional_embedding: Dim must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = positional_embedding<"", Seq, Dim>;  // the same layer unnamed: what its compute is chosen by

  std::size_t seq = Seq;
  std::size_t dim = Dim;

  constexpr positional_embedding() requires(Seq != dyn && Dim != dyn) = default;
  constexpr positional_embedding(std::size_t s, std::size_t d)
      : seq(checked_extent<Seq>("positional_embedding", Name.view(), "seq", s)),
        dim(checked_extent<Dim>("positional_embedding", Name.view(), "dim", d)) {}

  [[nodiscard]] constexpr std::size_t expected_in_features() const { return dim; }
  constexpr auto params() const {
    return std::array{param_decl{"weight", {seq, dim}, {init_rule::normal, 1.0}}};
  }
};

// Layer whose parameter `Param` is another layer's, named Owner (a dotted name in the model):
// one shard, one optimizer state, and the gradients of both uses summed before the reduce-scatter.
// nanoGPT ties lm_head.weight to transformer.wte.weight:
//   tied<"transformer.wte.weight", "weight", linear<"lm_head", 64, 256, false>>
// With `enabled` false (a run-time choice; Enabled is its default) the layer keeps its own parameter.
KFSDP_EXPORT template <fixed_string Owner, fixed_string Param, class Layer, bool Enabled = true>
struct tied : Layer {
  static constexpr auto owner = Owner;
  static constexpr auto tied_param = Param;
  bool enabled = Enabled;

  constexpr tied() requires std::is_default_constructible_v<Layer> = default;
  constexpr explicit tied(Layer layer, bool tie = Enabled) : Layer(std::move(layer)), enabled(tie) {}

  // What the layer owns (for the parameter table): every parameter but the tied one.
  constexpr auto params() const {
    param_list<detail::param_capacity<decltype(std::declval<const Layer&>().params())>::value> own;
    for (const param_decl& d : Layer::params())
      if (!enabled || d.name != Param.view()) own.push_back(d);
    return own;
  }
  // What the layer's compute uses: all of them, the tied one included.
  constexpr auto all_params() const { return Layer::params(); }
};

// A layer whose bias is a run-time choice (transformers' attention_bias; Qwen2's q/k/v): Layer's
// parameters, its "bias" left out unless `bias` is true.
//   optional_bias<linear<"q_proj", 64, 64>>({}, true)   -> weight [64, 64], bias [64]
//   optional_bias<linear<"q_proj", 64, 64>>({}, false)  -> weight [64, 64]
KFSDP_EXPORT template <class Layer>
struct optional_bias : Layer {
  bool bias = false;

  constexpr optional_bias() requires std::is_default_constructible_v<Layer> = default;
  constexpr optional_bias(Layer layer, bool with_bias) : Layer(std::move(layer)), bias(with_bias) {}

  constexpr auto params() const {
    param_list<detail::param_capacity<decltype(std::declval<const Layer&>().params())>::value> own;
    for (const param_decl& d : Layer::params())
      if (bias || d.name != "bias") own.push_back(d);
    return own;
  }
};

// A linear layer whose LoRA adapter is a run-time choice (peft's target_modules, lora_config):
// rank 0 leaves Layer as it was, parameters and results bit for bit; rank r adds lora_A.weight and
// lora_B.weight after Layer's own, and computes as lora_linear does (scale alpha / r).
//   optional_lora<linear<"q_proj", 64, 64, false>>({}, 8, 16.0) -> weight [64, 64], lora_A.weight [8, 64], lora_B.weight [64, 8]
//   optional_lora<optional_bias<linear<"q_proj">>>(q, 0, 8.0)     -> q's parameters alone
KFSDP_EXPORT template <class Layer>
struct optional_lora : Layer {
  using anonymous = optional_lora<typename Layer::anonymous>;  // its compute: linear's, or lora's
  std::size_t rank = 0;
  double alpha = 8;

  constexpr optional_lora() requires std::is_default_constructible_v<Layer> = default;
  constexpr optional_lora(Layer layer, std::size_t rank_, double alpha_) : Layer(std::move(layer)), rank(rank_), alpha(alpha_) {}

  constexpr auto params() const {
    const auto own = Layer::params();
    param_list<detail::param_capacity<std::remove_const_t<decltype(own)>>::value + 2> all;
    for (const param_decl& d : own) all.push_back(d);
    if (rank != 0)
      for (const param_decl& d : detail::lora_adapter(this->in_features, this->out_features, rank)) all.push_back(d);
    return all;
  }
};

// Elementwise activations (no parameters; the width is the input's).
enum class activation_fn { gelu, gelu_tanh, relu, silu, tanh };

template <fixed_string Name, activation_fn Fn>
struct activation {
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = activation<"", Fn>;  // the same layer unnamed: what its compute is chosen by
  static constexpr activation_fn function = Fn;
  constexpr std::array<param_decl, 0> params() const { return {}; }
};

// Named activations are classes, not alias templates: nvcc loses a fixed_string that an alias template
// passes on (its host code names it __T0). Final, so that std::tuple stores them as members: GCC 12 rejects
// constant evaluation of a tuple whose empty base class derives from another empty class.
KFSDP_EXPORT template <fixed_string Name = "">
struct gelu final : activation<Name, activation_fn::gelu> {};  // exact: 0.5·x·(1 + erf(x/√2))
KFSDP_EXPORT template <fixed_string Name = "">
struct gelu_tanh final : activation<Name, activation_fn::gelu_tanh> {};
KFSDP_EXPORT template <fixed_string Name = "">
struct relu final : activation<Name, activation_fn::relu> {};
KFSDP_EXPORT template <fixed_string Name = "">
struct silu final : activation<Name, activation_fn::silu> {};
KFSDP_EXPORT template <fixed_string Name = "">
struct tanh_layer final : activation<Name, activation_fn::tanh> {};  // not `tanh`: that would hide std::tanh in kfsdp

// Causal multi-head self-attention over windows of Seq rows: q, k, v = split(x [rows, 3·Dim]),
// y [rows, Dim] (no parameters: the projections around it are linears). With KVHeads key/value
// heads (grouped-query attention; KVHeads divides Heads) x is [q (Dim) | k (KVHeads·hd) | v (KVHeads·hd)],
// hd = Dim / Heads, and query head h reads key/value head h / (Heads / KVHeads):
//   causal_self_attention<"", 64, 4, 32, 2>                          [rows, 128] -> [rows, 64]
KFSDP_EXPORT template <fixed_string Name, std::size_t Dim = dyn, std::size_t Heads = dyn, std::size_t Seq = dyn, std::size_t KVHeads = Heads>
struct causal_self_attention {
  static_assert(Heads == dyn || KVHeads == dyn || Heads % KVHeads == 0,
                "kfsdp::causal_self_attention: KVHeads must divide Heads");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = causal_self_attention<"", Dim, Heads, Seq, KVHeads>;  // the same layer unnamed: what its compute is chosen by

  std::size_t dim = Dim;
  std::size_t heads = Heads;
  std::size_t seq = Seq;
  std::size_t kv_heads = KVHeads;

  constexpr causal_self_attention() requires(Dim != dyn && Heads != dyn && Seq != dyn && KVHeads != dyn) = default;
  constexpr causal_self_attention(std::size_t d, std::size_t h, std::size_t s)
    requires(KVHeads == Heads)
      : causal_self_attention(d, h, s, h) {}
  constexpr causal_self_attention(std::size_t d, std::size_t h, std::size_t s, std::size_t kv)
      : dim(checked_extent<Dim>("causal_self_attention", Name.view(), "dim", d)),
        heads(checked_extent<Heads>("causal_self_attention", Name.view(), "heads", h)),
        seq(checked_extent<Seq>("causal_self_attention", Name.view(), "seq", s)),
        kv_heads(checked_extent<KVHeads>("causal_self_attention", Name.view(), "kv_heads", kv)) {
    if (dim % heads != 0)
      throw std::invalid_argument("kfsdp: causal_self_attention '" + std::string(Name.view()) + "': heads is " +
                                  std::to_string(heads) + ", expected a divisor of dim = " + std::to_string(dim));
    if (heads % kv_heads != 0)
      throw std::invalid_argument("kfsdp: causal_self_attention '" + std::string(Name.view()) + "': kv_heads is " +
                                  std::to_string(kv_heads) + ", expected a divisor of heads = " + std::to_string(heads));
  }

  [[nodiscard]] constexpr std::size_t expected_in_features() const { return dim + 2 * kv_heads * (dim / heads); }
  [[nodiscard]] constexpr std::size_t out_features_for(std::size_t) const { return dim; }
  constexpr std::array<param_decl, 0> params() const { return {}; }
};

// Rotary position embedding (RoPE) on the queries and keys of a row [q (Heads·hd) | k (KVHeads·hd) | v (KVHeads·hd)],
// the values passed through; position t = the row's index within its window of Seq rows. In each
// rotated head, pair (i, i + hd/2) turns by the angle t · theta^(−2i/hd) (transformers' rotate_half):
//   y_i = x_i cos − x_{i+hd/2} sin,   y_{i+hd/2} = x_{i+hd/2} cos + x_i sin.
//   rotary_embedding<"", 4, 2, 16, 32>  (heads 4, kv_heads 2, hd 16, seq 32)   [rows, 128] -> [rows, 128]
KFSDP_EXPORT template <fixed_string Name, std::size_t Heads = dyn, std::size_t KVHeads = dyn, std::size_t HeadDim = dyn, std::size_t Seq = dyn>
struct rotary_embedding {
  static_assert(HeadDim == dyn || HeadDim % 2 == 0, "kfsdp::rotary_embedding: HeadDim must be even (RoPE turns pairs)");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = rotary_embedding<"", Heads, KVHeads, HeadDim, Seq>;  // the same layer unnamed: what its compute is chosen by

  std::size_t heads = Heads;
  std::size_t kv_heads = KVHeads;
  std::size_t head_dim = HeadDim;
  std::size_t seq = Seq;
  double theta = 10000.0;  // transformers' rope_theta
  rope_scaling scaling{};  // transformers' rope_type and its factors (model/rope_scaling.hpp)

  constexpr rotary_embedding() requires(Heads != dyn && KVHeads != dyn && HeadDim != dyn && Seq != dyn) = default;
  constexpr rotary_embedding(std::size_t h, std::size_t kv, std::size_t hd, std::size_t s, double base = 10000.0,
                             rope_scaling scaled = {})
      : heads(checked_extent<Heads>("rotary_embedding", Name.view(), "heads", h)),
        kv_heads(checked_extent<KVHeads>("rotary_embedding", Name.view(), "kv_heads", kv)),
        head_dim(checked_extent<HeadDim>("rotary_embedding", Name.view(), "head_dim", hd)),
        seq(checked_extent<Seq>("rotary_embedding", Name.view(), "seq", s)),
        theta(base),
        scaling(scaled) {
    if (head_dim % 2 != 0)
      throw std::invalid_argument("kfsdp: rotary_embedding '" + std::string(Name.view()) + "': head_dim is " +
                                  std::to_string(head_dim) + ", expected an even number (RoPE turns pairs)");
    if (!(theta > 0.0))
      throw std::invalid_argument("kfsdp: rotary_embedding '" + std::string(Name.view()) + "': theta is " +
                                  std::to_string(theta) + ", expected a positive number");
  }

  [[nodiscard]] constexpr std::size_t expected_in_features() const { return (heads + 2 * kv_heads) * head_dim; }
  constexpr std::array<param_decl, 0> params() const { return {}; }
};

// Softmax cross-entropy of logits [rows, Classes] against one class id per row, averaged.
KFSDP_EXPORT template <fixed_string Name = "", std::size_t Classes = dyn>
struct cross_entropy {
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = cross_entropy<"", Classes>;  // the same layer unnamed: what its compute is chosen by
  using output = loss;
  using target = class_ids;

  std::size_t classes = Classes;

  constexpr cross_entropy() requires(Classes != dyn) = default;
  constexpr explicit cross_entropy(std::size_t c)
      : classes(checked_extent<Classes>("cross_entropy", Name.view(), "classes", c)) {}

  [[nodiscard]] constexpr std::size_t expected_in_features() const { return classes; }
  constexpr std::array<param_decl, 0> params() const { return {}; }
};

// Mean-squared error against targets shaped like the input, averaged over every element.
KFSDP_EXPORT template <fixed_string Name = "">
struct mse {
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using anonymous = mse<"">;  // the same layer unnamed: what its compute is chosen by
  using output = loss;
  using target = values;
  constexpr std::array<param_decl, 0> params() const { return {}; }
};

}  // namespace kfsdp
