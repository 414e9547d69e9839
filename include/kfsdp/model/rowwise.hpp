#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Layers written as one expression over a row (kfsdp::expr): the forward is the expression, the
// backward is derived from it, both run as fused kernels (compute/rowwise.hpp).
//
// A descriptor derives from kfsdp::rowwise<Name> (features in, features out) or
// kfsdp::rowwise_loss<Name> (features and a target row in, the mean loss out), declares its
// parameters and writes `expression`, taking the input row (and the target row), then one argument
// per parameter in the order of params(). A parameter declared [1] is a scalar; any other 1-D
// parameter is per feature and must be as wide as the columns it is used on (checked when the
// network is built, naming both layers).
//
//   template <kfsdp::fixed_string Name, std::size_t Dim>
//   struct rms_norm : kfsdp::rowwise<Name> {
//     constexpr auto params() const { return std::array{kfsdp::param_decl{"weight", {Dim}, {kfsdp::init_rule::ones}}}; }
//     static constexpr auto expression(auto x, auto g) { return x * rsqrt(mean(x * x) + 1e-6) * g; }
//   };
//
// The primitives (found by argument-dependent lookup, no using needed): + − × ÷ and negation
// (with expressions or numbers), exp, log, sqrt, rsqrt, tanh, erf, sigmoid, abs, pow(e, c),
// max(e, c), min(e, c); the row reductions sum(e), mean(e), max(e); x.slice(offset, width) and
// x.half(k) for part of the row. A loss's expression is per element (the loss is its mean over the
// row and the batch) or per row (a reduction: its mean over the batch).
// A non-static `expression` may read the descriptor's members (a run-time eps, a slice's width).

#include <kfsdp/model/descriptor.hpp>

#include <array>
#include <cstddef>

namespace kfsdp {

KFSDP_EXPORT template <fixed_string Name>
struct rowwise {
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  using rowwise_tag = void;  // the compute is derived from `expression` (compute/rowwise.hpp)
  constexpr std::array<param_decl, 0> params() const { return {}; }
};

KFSDP_EXPORT template <fixed_string Name>
struct rowwise_loss : rowwise<Name> {
  using output = loss;
  using target = values;
};

template <class D>
concept rowwise_descriptor = layer_descriptor<D> && requires { typename D::rowwise_tag; };

// --- built-in layers written as expressions ---

// y = x / √(mean(x²) + eps) · weight (Llama's RMSNorm; eps 1e-6 by default, as transformers').
KFSDP_EXPORT template <fixed_string Name, std::size_t Dim = dyn>
struct rms_norm : rowwise<Name> {
  static_assert(Dim != 0, "kfsdp::rms_norm: Dim must be at least 1");
  std::size_t dim = Dim;
  double eps = 1e-6;

  constexpr rms_norm() requires(Dim != dyn) = default;
  constexpr explicit rms_norm(std::size_t d, double epsilon = 1e-6)
      : dim(checked_extent<Dim>("rms_norm", Name.view(), "dim", d)), eps(epsilon) {}

  constexpr auto params() const { return std::array{param_decl{"weight", {dim}, {init_rule::ones}}}; }
  constexpr auto expression(auto x, auto weight) const { return x * rsqrt(mean(x * x) + eps) * weight; }
};

// y = silu(gate) · value, [gate | value] = x: [rows, 2·H] -> [rows, H] (Llama's MLP after a fused
// gate/up projection). Final, so that std::tuple stores it as a member: GCC 12 rejects constant
// evaluation of a tuple whose empty base class derives from another empty class.
KFSDP_EXPORT template <fixed_string Name = "">
struct swiglu final : rowwise<Name> {
  static constexpr auto expression(auto x) {
    const auto gate = x.half(0);
    return gate * sigmoid(gate) * x.half(1);
  }
};

// The hand-written element-wise and row-wise built-ins written as expressions: the same functions,
// their backward derived (test/expr compares them with the hand-written kernels of the source tree's
// reference/, bench_derived times both).
namespace derived {
template <fixed_string Name = "">
struct gelu : rowwise<Name> {  // exact: 0.5·x·(1 + erf(x/√2))
  static constexpr auto expression(auto x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }
};
template <fixed_string Name = "">
struct gelu_tanh : rowwise<Name> {
  static constexpr auto expression(auto x) {
    return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
  }
};
template <fixed_string Name = "">
struct silu : rowwise<Name> {
  static constexpr auto expression(auto x) { return x * sigmoid(x); }
};
template <fixed_string Name = "">
struct relu : rowwise<Name> {
  static constexpr auto expression(auto x) { return max(x, 0.0); }
};
template <fixed_string Name = "">
struct tanh_layer : rowwise<Name> {
  static constexpr auto expression(auto x) { return tanh(x); }
};
// y = (x − mean(x)) / √(var(x) + eps) · weight + bias, var biased (nn.LayerNorm, eps 1e-5).
template <fixed_string Name, std::size_t Dim = dyn>
struct layer_norm : rowwise<Name> {
  std::size_t dim = Dim;
  double eps = 1e-5;
  constexpr layer_norm() requires(Dim != dyn) = default;
  constexpr explicit layer_norm(std::size_t d, double epsilon = 1e-5)
      : dim(checked_extent<Dim>("layer_norm", Name.view(), "dim", d)), eps(epsilon) {}
  constexpr auto params() const { return std::array{param_decl{"weight", {dim}, {init_rule::ones}}, param_decl{"bias", {dim}}}; }
  constexpr auto expression(auto x, auto weight, auto bias) const {
    const auto centred = x - mean(x);
    return centred * rsqrt(mean(centred * centred) + eps) * weight + bias;
  }
};
template <fixed_string Name = "">
struct mse : rowwise_loss<Name> {  // F.mse_loss: the mean of (x − t)² over every element
  static constexpr auto expression(auto x, auto t) { return (x - t) * (x - t); }
};
}  // namespace derived

}  // namespace kfsdp
