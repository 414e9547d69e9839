#pragma once
// kfsdp::nn::linear — y[N, Out] = x[N, In] · W[Out, In]^T + b[Out], PyTorch's nn.Linear.
//
//   kfsdp::nn::linear<double> fc(/*in_features=*/16, /*out_features=*/64);
//   auto cache = fc.make_cache(rows);
//   fc.forward({weight, bias}, x, y, cache);          // y = x W^T + b
//   fc.backward({weight, bias}, {dweight, dbias}, cache, dy, dx);  // dW += dy^T x, db += Σ dy, dx = dy W
//
// The products go through KokkosBlas::gemm (BLAS on the host, cuBLAS on CUDA builds).
// Conventions (layouts, += into parameter gradients, = into dx): see views.hpp.

#include <kfsdp/nn/views.hpp>

#include <atomic>
#include <cstddef>
#include <type_traits>

namespace kfsdp::nn {

namespace detail {
// dW = dy^T x products run, counted for the test that a frozen weight costs none.
inline std::atomic<std::size_t> weight_gradient_products{0};
// linear::forward calls and the rows they took, counted for the test that a generation step runs
// each linear on one row (the new token's), not on the whole sequence.
inline std::atomic<std::size_t> linear_forward_calls{0};
inline std::atomic<std::size_t> linear_forward_rows{0};
}  // namespace detail

// The tensors of a linear layer: linear_tensors<const S> are its parameters, linear_tensors<S>
// its gradients (or its owned storage, which converts to parameters).
template <class Element>
struct linear_tensors {
  matrix_of<Element> weight;  // [out_features, in_features]
  vector_of<Element> bias;    // [out_features], empty when the layer has no bias

  linear_tensors() = default;
  linear_tensors(matrix_of<Element> weight_, vector_of<Element> bias_ = {})
      : weight(weight_), bias(bias_) {}
  // linear_tensors<double> -> linear_tensors<const double>
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  linear_tensors(const linear_tensors<Other>& other) : weight(other.weight), bias(other.bias) {}
};

template <class Scalar>
class linear {
 public:
  using scalar_type = Scalar;
  using params = linear_tensors<const Scalar>;
  using grads = linear_tensors<Scalar>;
  // The input, kept (as a view) for dW = dy^T x.
  struct cache {
    const_matrix<Scalar> input;
  };

  // Throws std::overflow_error when the weight [out_features, in_features] has more than 2^64 bytes.
  linear(std::size_t in_features, std::size_t out_features, bool has_bias = true)
      : in_features_(in_features), out_features_(out_features), has_bias_(has_bias) {
    (void)detail::checked_numel("linear", "weight", {out_features, in_features}, sizeof(Scalar));
  }

  [[nodiscard]] std::size_t in_features() const noexcept { return in_features_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_features_; }
  [[nodiscard]] bool has_bias() const noexcept { return has_bias_; }
  [[nodiscard]] cache make_cache(std::size_t /*rows*/) const { return {}; }

  // y [rows, out] = x [rows, in] · W^T + b.
  void forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y, cache& c) const;
  // dW += dy^T x, db += column sums of dy, dx [rows, in] = dy · W. Each is skipped where its
  // output is empty: dx for the first layer, dW and db for a frozen weight and bias.
  void backward(const params& p, const grads& g, const cache& c, const_matrix<Scalar> dy,
                matrix<Scalar> dx) const;

  // Throws unless p (or grads) fit this layer: weight [out, in], bias [out] or empty.
  template <class Element>
  void check_tensors(const char* where, const linear_tensors<Element>& t) const;

 private:
  std::size_t in_features_;
  std::size_t out_features_;
  bool has_bias_;
};

template <class Scalar>
template <class Element>
void linear<Scalar>::check_tensors(const char* where, const linear_tensors<Element>& t) const {
  detail::check_matrix(where, "weight", t.weight, out_features_, in_features_);
  if (has_bias_)
    detail::check_vector(where, "bias", t.bias, out_features_);
  else
    detail::check_vector(where, "bias (layer without bias)", t.bias, 0);
}

extern template class linear<float>;
extern template class linear<double>;

}  // namespace kfsdp::nn
