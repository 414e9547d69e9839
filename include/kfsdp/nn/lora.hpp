#pragma once
// kfsdp::nn::lora — a linear layer with a low-rank adapter (LoRA), as peft's lora.Linear computes it:
//   y [N, Out] = x W^T + b + s · (x A^T) B^T,   W [Out, In], A [r, In], B [Out, r], s = alpha / r
// B starts at zero, so a fresh adapter leaves the layer's output as it was.
//
//   kfsdp::nn::lora<double> q(/*in=*/64, /*out=*/64, /*rank=*/8, /*alpha=*/16.0, /*has_bias=*/false);
//   auto cache = q.make_cache(rows);
//   q.forward({w, {}, a, b}, x, y, cache);
//   q.backward({w, {}, a, b}, {{}, {}, da, db}, cache, dy, dx);  // the base frozen: dW, db left out
//
// Products through the one gemm (kernels/nn/lora.cpp); conventions (+= into parameter gradients,
// = into dx, an empty gradient or dx skipped) as nn::linear's.

#include <kfsdp/nn/linear.hpp>
#include <kfsdp/nn/views.hpp>

#include <cstddef>
#include <type_traits>

namespace kfsdp::nn {

// The tensors of a LoRA layer: the base's weight and bias and the adapter's A and B.
template <class Element>
struct lora_tensors {
  matrix_of<Element> weight;  // [out_features, in_features]
  vector_of<Element> bias;    // [out_features], empty when the layer has no bias
  matrix_of<Element> a;       // [rank, in_features]
  matrix_of<Element> b;       // [out_features, rank]
};

template <class Scalar>
class lora {
 public:
  using scalar_type = Scalar;
  using params = lora_tensors<const Scalar>;
  using grads = lora_tensors<Scalar>;
  struct cache {
    typename linear<Scalar>::cache base;  // the input, as a view
    matrix<Scalar> down;                  // x A^T [rows, rank], kept for dB
    matrix<Scalar> up_grad;               // dy B [rows, rank], backward's scratch
  };

  // Throws std::invalid_argument for a rank of 0 or an alpha that is 0 or not finite.
  lora(std::size_t in_features, std::size_t out_features, std::size_t rank, double alpha, bool has_bias = true);

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] Scalar scale() const noexcept { return scale_; }  // alpha / rank
  [[nodiscard]] cache make_cache(std::size_t /*rows*/) const { return {}; }

  void forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y, cache& c) const;
  // dW += dy^T x, db += Σ dy, dA += s (dy B)^T x, dB += s dy^T (x A^T), dx = dy W + s (dy B) A;
  // each skipped where its output is empty.
  void backward(const params& p, const grads& g, cache& c, const_matrix<Scalar> dy, matrix<Scalar> dx) const;

 private:
  linear<Scalar> base_;
  std::size_t rank_;
  Scalar scale_;
};

extern template class lora<float>;
extern template class lora<double>;

}  // namespace kfsdp::nn
