#pragma once
// kfsdp::nn::layer — what a layer type must offer to be run (and trained) like the built-in ones.
//
// A type L models layer when, with S = L::scalar_type:
//   1. L::scalar_type, L::params, L::grads and L::cache are types. params holds const views of
//      the layer's parameters, grads non-const views of the same shapes (no_params when there
//      are none); cache holds what backward needs.
//   2. l.in_features() and l.out_features() give the columns of the input and output matrices.
//   3. l.make_cache(rows) returns a cache for a batch of `rows` rows (allocating what it owns).
//   4. l.forward(params, x, y, cache): x const_matrix<S> [rows, in], y matrix<S> [rows, out]
//      overwritten; fills cache.
//   5. l.backward(params, grads, cache, dy, dx): dy const_matrix<S> [rows, out], dx matrix<S>
//      [rows, in] OVERWRITTEN with the input gradient; parameter gradients ACCUMULATED (+=) into
//      grads. forward and backward may be non-const (a layer may own backward scratch).
// Built-in models: linear, layer_norm, gelu, causal_self_attention (in = 3D, out = D), mlp,
// transformer_block. embedding (ids in) and cross_entropy (loss out) are the two ends of a network
// and have their own signatures.
//
// A user-written layer, y = x · scale with one learnable scalar (test/nn/test_layer.cpp):
//
//   template <class S>
//   struct scale_layer {
//     using scalar_type = S;
//     struct params { kfsdp::nn::const_vector<S> factor; };   // [1]
//     struct grads { kfsdp::nn::vector<S> factor; };          // [1]
//     struct cache { kfsdp::nn::const_matrix<S> input; };
//     std::size_t features;
//     std::size_t in_features() const { return features; }
//     std::size_t out_features() const { return features; }
//     cache make_cache(std::size_t) const { return {}; }
//     void forward(const params& p, kfsdp::nn::const_matrix<S> x, kfsdp::nn::matrix<S> y,
//                  cache& c) const;     // Kokkos::parallel_for: y(r, j) = p.factor(0) * x(r, j)
//     void backward(const params& p, const grads& g, const cache& c,
//                   kfsdp::nn::const_matrix<S> dy, kfsdp::nn::matrix<S> dx) const;
//                                       // dx = factor · dy;  g.factor(0) += Σ dy · x (reduce)
//   };
//   static_assert(kfsdp::nn::layer<scale_layer<double>>);
//
// Kernels: launch Kokkos::parallel_for / parallel_reduce with KOKKOS_LAMBDA from a public member
// or a free function (CUDA's extended lambdas need that), capturing views by value, not `this`.

#include <kfsdp/nn/views.hpp>

#include <concepts>
#include <cstddef>
#include <utility>

namespace kfsdp::nn {

// layer<L>: requirement 1 (the nested types).
template <class L>
concept layer_types = requires {
  typename L::scalar_type;
  typename L::params;
  typename L::grads;
  typename L::cache;
};

// layer<L>: requirements 2 and 3 (features and caches).
template <class L>
concept layer_shapes = requires(const L& l, std::size_t rows) {
  { l.in_features() } -> std::convertible_to<std::size_t>;
  { l.out_features() } -> std::convertible_to<std::size_t>;
  { l.make_cache(rows) } -> std::same_as<typename L::cache>;
};

// layer<L>: requirements 4 and 5 (forward and backward).
template <class L>
concept layer_passes =
    requires(L& l, const typename L::params& p, const typename L::grads& g,
             typename L::cache& c, const_matrix<typename L::scalar_type> in,
             matrix<typename L::scalar_type> out) {
      l.forward(p, in, out, c);
      l.backward(p, g, std::as_const(c), in, out);
    };

template <class L>
concept layer = layer_types<L> && layer_shapes<L> && layer_passes<L>;

}  // namespace kfsdp::nn
