#pragma once
// kfsdp::nn::cross_entropy — softmax cross-entropy of logits [N, V] against class ids [N]:
// loss = (1/N) Σ_n (logsumexp(logits[n]) − logits[n, target[n]]), PyTorch's F.cross_entropy.
//
//   kfsdp::nn::cross_entropy<double> ce(/*classes=*/256);
//   auto cache = ce.make_cache(rows);
//   double loss = ce.forward(logits, targets, cache);        // mean over the rows given
//   ce.backward(cache, /*grad_scale=*/1.0 / global_rows, dlogits);
//
// backward writes dlogits = (softmax(logits) − onehot(target)) · grad_scale. With grad_scale =
// 1 / rows it is the gradient of the mean loss; a rank holding part of a global batch passes
// 1 / global_rows so that the gradients summed over ranks are those of the global mean.
// Targets outside [0, classes) throw std::out_of_range. Conventions: see views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>

namespace kfsdp::nn {

template <class Scalar>
class cross_entropy {
 public:
  using scalar_type = Scalar;
  struct cache {
    const_matrix<Scalar> logits;  // kept as views
    const_index_vector targets;
    vector<Scalar> logsumexp;  // [rows]
    vector<Scalar> losses;     // [rows], loss of each row
  };

  explicit cross_entropy(std::size_t classes) : classes_(classes) {}

  [[nodiscard]] std::size_t classes() const noexcept { return classes_; }
  [[nodiscard]] cache make_cache(std::size_t rows) const;

  // Mean loss over the rows of logits [rows, classes]; targets [rows].
  Scalar forward(const_matrix<Scalar> logits, const_index_vector targets, cache& c) const;
  // dlogits [rows, classes] = (softmax − onehot) · grad_scale.
  void backward(const cache& c, Scalar grad_scale, matrix<Scalar> dlogits) const;

 private:
  std::size_t classes_;
};

extern template class cross_entropy<float>;
extern template class cross_entropy<double>;

}  // namespace kfsdp::nn
