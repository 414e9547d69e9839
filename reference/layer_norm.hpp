#pragma once
// kfsdp::reference::layer_norm, one of the hand-written kernels that the derived ones replaced: the
// reference test/expr compares them with and bench_derived times them against. It normalises each
// row over its last dimension, then scales and shifts: y = (x − mean) · rstd · weight + bias,
// rstd = 1 / sqrt(var + eps), var biased (PyTorch's).
//
//   kfsdp::reference::layer_norm<double> ln(/*features=*/64);   // eps = 1e-5
//   auto cache = ln.make_cache(rows);                            // mean and rstd per row
//   ln.forward({weight, bias}, x, y, cache);
//   ln.backward({weight, bias}, {dweight, dbias}, cache, dy, dx);
//
// Conventions (layouts, += into parameter gradients, = into dx): see kfsdp/nn/views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>
#include <type_traits>

namespace kfsdp::reference {

// layer_norm_tensors<const S> are the parameters, layer_norm_tensors<S> the gradients.
template <class Element>
struct layer_norm_tensors {
  nn::vector_of<Element> weight;  // [features]
  nn::vector_of<Element> bias;    // [features]

  layer_norm_tensors() = default;
  layer_norm_tensors(nn::vector_of<Element> weight_, nn::vector_of<Element> bias_)
      : weight(weight_), bias(bias_) {}
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  layer_norm_tensors(const layer_norm_tensors<Other>& other)
      : weight(other.weight), bias(other.bias) {}
};

template <class Scalar>
class layer_norm {
 public:
  using scalar_type = Scalar;
  using params = layer_norm_tensors<const Scalar>;
  using grads = layer_norm_tensors<Scalar>;
  struct cache {
    nn::const_matrix<Scalar> input;  // x, kept as a view
    nn::vector<Scalar> mean;         // [rows]
    nn::vector<Scalar> rstd;         // [rows], 1 / sqrt(var + eps)
  };

  // Throws std::overflow_error when the weight [features] has more than 2^64 bytes.
  explicit layer_norm(std::size_t features, Scalar eps = Scalar(1e-5))
      : features_(features), eps_(eps) {
    (void)nn::detail::checked_numel("layer_norm", "weight", {features}, sizeof(Scalar));
  }

  [[nodiscard]] std::size_t in_features() const noexcept { return features_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return features_; }
  [[nodiscard]] Scalar eps() const noexcept { return eps_; }
  [[nodiscard]] cache make_cache(std::size_t rows) const;

  void forward(const params& p, nn::const_matrix<Scalar> x, nn::matrix<Scalar> y, cache& c) const;
  void backward(const params& p, const grads& g, const cache& c, nn::const_matrix<Scalar> dy,
                nn::matrix<Scalar> dx) const;

  template <class Element>
  void check_tensors(const char* where, const layer_norm_tensors<Element>& t) const {
    nn::detail::check_vector(where, "weight", t.weight, features_);
    nn::detail::check_vector(where, "bias", t.bias, features_);
  }

 private:
  std::size_t features_;
  Scalar eps_;
};

extern template class layer_norm<float>;
extern template class layer_norm<double>;

}  // namespace kfsdp::reference
