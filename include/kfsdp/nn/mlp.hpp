#pragma once
// kfsdp::nn::mlp — nanoGPT's MLP: c_fc (D → 4D), gelu, c_proj (4D → D), both linears with bias.
//
//   kfsdp::nn::mlp<double> block_mlp(/*dim=*/64);             // hidden = 4 * 64
//   auto cache = block_mlp.make_cache(rows);                   // owns the [rows, 256] activations
//   block_mlp.forward({{fc_w, fc_b}, {proj_w, proj_b}}, x, y, cache);
//   block_mlp.backward(params, grads, cache, dy, dx);
//
// Conventions: see views.hpp.

#include <kfsdp/nn/gelu.hpp>
#include <kfsdp/nn/linear.hpp>

#include <cstddef>
#include <type_traits>

namespace kfsdp::nn {

// mlp_tensors<const S> are the parameters, mlp_tensors<S> the gradients (PyTorch names).
template <class Element>
struct mlp_tensors {
  linear_tensors<Element> c_fc;    // weight [4D, D], bias [4D]
  linear_tensors<Element> c_proj;  // weight [D, 4D], bias [D]

  mlp_tensors() = default;
  mlp_tensors(linear_tensors<Element> c_fc_, linear_tensors<Element> c_proj_)
      : c_fc(c_fc_), c_proj(c_proj_) {}
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  mlp_tensors(const mlp_tensors<Other>& other) : c_fc(other.c_fc), c_proj(other.c_proj) {}
};

template <class Scalar>
class mlp {
 public:
  using scalar_type = Scalar;
  using params = mlp_tensors<const Scalar>;
  using grads = mlp_tensors<Scalar>;
  struct cache {
    typename linear<Scalar>::cache c_fc;
    matrix<Scalar> hidden;  // c_fc output [rows, 4D]
    typename gelu<Scalar>::cache activation;
    matrix<Scalar> activated;  // gelu output [rows, 4D]
    typename linear<Scalar>::cache c_proj;
  };

  explicit mlp(std::size_t dim) : mlp(dim, 4 * dim) {}
  mlp(std::size_t dim, std::size_t hidden)
      : c_fc_(dim, hidden), activation_(hidden), c_proj_(hidden, dim) {}

  [[nodiscard]] std::size_t in_features() const noexcept { return c_fc_.in_features(); }
  [[nodiscard]] std::size_t out_features() const noexcept { return c_proj_.out_features(); }
  [[nodiscard]] std::size_t hidden_features() const noexcept { return c_fc_.out_features(); }
  [[nodiscard]] cache make_cache(std::size_t rows) const;

  void forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y, cache& c) const;
  // Uses a scratch [rows, 4D] owned by this object (so not const).
  void backward(const params& p, const grads& g, const cache& c, const_matrix<Scalar> dy,
                matrix<Scalar> dx);

 private:
  linear<Scalar> c_fc_;
  gelu<Scalar> activation_;
  linear<Scalar> c_proj_;
  matrix<Scalar> d_hidden_;  // backward scratch, gelu runs in place on it
};

extern template class mlp<float>;
extern template class mlp<double>;

}  // namespace kfsdp::nn
