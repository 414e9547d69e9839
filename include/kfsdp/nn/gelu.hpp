#pragma once
// kfsdp::nn::gelu — the exact GELU, y = 0.5 · x · (1 + erf(x / √2)), elementwise
// (PyTorch's nn.GELU() with approximate='none', as nanoGPT uses).
//
//   kfsdp::nn::gelu<double> act(/*features=*/256);
//   auto cache = act.make_cache(rows);
//   act.forward({}, x, y, cache);               // no parameters: params is no_params
//   act.backward({}, {}, cache, dy, dx);        // dx = dy · gelu'(x)
//
// Conventions: see views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>

namespace kfsdp::nn {

template <class Scalar>
class gelu {
 public:
  using scalar_type = Scalar;
  using params = no_params;
  using grads = no_params;
  struct cache {
    const_matrix<Scalar> input;  // x, kept as a view
  };

  explicit gelu(std::size_t features) : features_(features) {}

  [[nodiscard]] std::size_t in_features() const noexcept { return features_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return features_; }
  [[nodiscard]] cache make_cache(std::size_t /*rows*/) const { return {}; }

  void forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y, cache& c) const;
  void backward(const params& p, const grads& g, const cache& c, const_matrix<Scalar> dy,
                matrix<Scalar> dx) const;

 private:
  std::size_t features_;
};

extern template class gelu<float>;
extern template class gelu<double>;

}  // namespace kfsdp::nn
