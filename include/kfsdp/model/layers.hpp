#pragma once
// Leaf layer descriptors with PyTorch's parameter layout.
//   linear<"c_attn", 64, 192>      -> weight [192, 64], bias [192]
//   layer_norm<"ln_1", 64>         -> weight [64], bias [64]
//   embedding<"wte", 256, 64>      -> weight [256, 64]
// A size may be kfsdp::dyn and given to the constructor: linear<"fc", dyn, dyn>(in, out).

#ifndef KFSDP_MODULE
#include <array>
#include <cstddef>
#endif

#include <kfsdp/meta/export.hpp>
#include <kfsdp/model/descriptor.hpp>

KFSDP_EXPORT namespace kfsdp {

template <fixed_string Name, std::size_t In = dyn, std::size_t Out = dyn, bool Bias = true>
struct linear {
  static_assert(In != 0, "kfsdp::linear: In (input features) must be at least 1");
  static_assert(Out != 0, "kfsdp::linear: Out (output features) must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;
  static constexpr bool has_bias = Bias;

  std::size_t in_features = In;
  std::size_t out_features = Out;

  constexpr linear() requires(In != dyn && Out != dyn) = default;
  constexpr linear(std::size_t in, std::size_t out)
      : in_features(checked_extent<In>("linear", Name.view(), "in_features", in)),
        out_features(checked_extent<Out>("linear", Name.view(), "out_features", out)) {}

  constexpr auto params() const {
    if constexpr (Bias)
      return std::array{param_decl{"weight", {out_features, in_features}},
                        param_decl{"bias", {out_features}}};
    else
      return std::array{param_decl{"weight", {out_features, in_features}}};
  }
};

template <fixed_string Name, std::size_t Dim = dyn>
struct layer_norm {
  static_assert(Dim != 0, "kfsdp::layer_norm: Dim must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;

  std::size_t dim = Dim;

  constexpr layer_norm() requires(Dim != dyn) = default;
  constexpr explicit layer_norm(std::size_t d) : dim(checked_extent<Dim>("layer_norm", Name.view(), "dim", d)) {}

  constexpr auto params() const {
    return std::array{param_decl{"weight", {dim}}, param_decl{"bias", {dim}}};
  }
};

template <fixed_string Name, std::size_t Num = dyn, std::size_t Dim = dyn>
struct embedding {
  static_assert(Num != 0, "kfsdp::embedding: Num (number of embeddings) must be at least 1");
  static_assert(Dim != 0, "kfsdp::embedding: Dim must be at least 1");
  static constexpr auto name = Name;
  static constexpr layer_kind kind = layer_kind::layer;

  std::size_t num_embeddings = Num;
  std::size_t dim = Dim;

  constexpr embedding() requires(Num != dyn && Dim != dyn) = default;
  constexpr embedding(std::size_t num, std::size_t d)
      : num_embeddings(checked_extent<Num>("embedding", Name.view(), "num_embeddings", num)),
        dim(checked_extent<Dim>("embedding", Name.view(), "dim", d)) {}

  constexpr auto params() const { return std::array{param_decl{"weight", {num_embeddings, dim}}}; }
};

}  // namespace kfsdp
