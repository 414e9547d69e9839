#pragma once
// kfsdp::reference::mse_loss, one of the hand-written kernels that the derived ones replaced: the
// reference test/expr compares them with and bench_derived times them against. The mean squared
// error of pred [rows, features] against target, PyTorch's F.mse_loss(reduction='mean'):
// loss = (1 / (rows · features)) Σ (pred − target)².
//
//   kfsdp::reference::mse_loss<double> mse(/*features=*/4);
//   double loss = mse.forward(pred, target);                      // mean over all elements
//   mse.backward(pred, target, /*grad_scale=*/1.0 / rows, dpred);
//
// backward writes dpred = 2 (pred − target) / features · grad_scale: with grad_scale = 1 / rows it is
// the gradient of the mean; a rank holding part of a global batch passes 1 / global_rows.
// forward sums each row in parallel, then the rows in index order: no atomics, reproducible.
// Conventions: see kfsdp/nn/views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>

namespace kfsdp::reference {

template <class Scalar>
class mse_loss {
 public:
  using scalar_type = Scalar;

  explicit mse_loss(std::size_t features);

  [[nodiscard]] std::size_t features() const noexcept { return features_; }

  // Mean of (pred − target)² over all elements of pred, target [rows, features]; 0 when rows = 0.
  Scalar forward(nn::const_matrix<Scalar> pred, nn::const_matrix<Scalar> target) const;
  // dpred [rows, features] = 2 (pred − target) / features · grad_scale; dpred may alias pred.
  void backward(nn::const_matrix<Scalar> pred, nn::const_matrix<Scalar> target, Scalar grad_scale,
                nn::matrix<Scalar> dpred) const;

 private:
  std::size_t features_;
};

extern template class mse_loss<float>;
extern template class mse_loss<double>;

}  // namespace kfsdp::reference
