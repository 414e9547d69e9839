// kfsdp::nn::lora: the kernel bodies and their explicit instantiations for float and double
// (the declarations are in include/kfsdp/nn/lora.hpp).

#include <kfsdp/nn/detail/gemm.hpp>
#include <kfsdp/nn/lora.hpp>

#include <cmath>
#include <stdexcept>
#include <string>

namespace kfsdp::nn {

namespace {
// Whether a gradient was asked for: an empty one (a frozen parameter's) is left out.
template <class View>
bool wanted(const View& v) {
  return v.data() != nullptr || v.size() != 0;
}
}  // namespace

template <class Scalar>
lora<Scalar>::lora(std::size_t in_features, std::size_t out_features, std::size_t rank, double alpha, bool has_bias)
    : base_(in_features, out_features, has_bias), rank_(rank), scale_(Scalar(alpha / double(rank == 0 ? 1 : rank))) {
  if (rank == 0)
    throw std::invalid_argument("kfsdp::nn::lora: rank is 0, expected at least 1");
  if (!std::isfinite(alpha) || alpha == 0)
    throw std::invalid_argument("kfsdp::nn::lora: alpha is " + std::to_string(alpha) + ", expected a finite value other than 0");
}

template <class Scalar>
void lora<Scalar>::forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y, cache& c) const {
  detail::check_matrix("lora::forward", "a", p.a, rank_, base_.in_features());
  detail::check_matrix("lora::forward", "b", p.b, base_.out_features(), rank_);
  base_.forward({p.weight, p.bias}, x, y, c.base);  // checks x and y
  const std::size_t rows = x.extent(0);
  if (c.down.extent(0) != rows || c.down.extent(1) != rank_)
    c.down = matrix<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::lora::down"), rows, rank_);
  if (rows == 0) return;
  detail::gemm<Scalar>("N", "T", Scalar(1), x, p.a, Scalar(0), c.down);  // x A^T
  detail::gemm<Scalar>("N", "T", scale_, c.down, p.b, Scalar(1), y);   // y += s (x A^T) B^T
}

template <class Scalar>
void lora<Scalar>::backward(const params& p, const grads& g, cache& c, const_matrix<Scalar> dy, matrix<Scalar> dx) const {
  const std::size_t rows = c.base.input.extent(0);
  detail::check_matrix("lora::backward", "cache.down", c.down, rows, rank_);
  if (wanted(g.a)) detail::check_matrix("lora::backward (grads)", "a", g.a, rank_, base_.in_features());
  if (wanted(g.b)) detail::check_matrix("lora::backward (grads)", "b", g.b, base_.out_features(), rank_);
  base_.backward({p.weight, p.bias}, {g.weight, g.bias}, c.base, dy, dx);  // dW, db, dx = dy W
  if (rows == 0) return;
  if (wanted(g.b)) detail::gemm<Scalar>("T", "N", scale_, dy, c.down, Scalar(1), g.b);  // dB += s dy^T (x A^T)
  const bool want_dx = dx.data() != nullptr;
  if (!wanted(g.a) && !want_dx) return;
  if (c.up_grad.extent(0) != rows || c.up_grad.extent(1) != rank_)
    c.up_grad = matrix<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::lora::up_grad"), rows, rank_);
  detail::gemm<Scalar>("N", "N", Scalar(1), dy, p.b, Scalar(0), c.up_grad);  // dy B
  if (wanted(g.a)) detail::gemm<Scalar>("T", "N", scale_, c.up_grad, c.base.input, Scalar(1), g.a);  // dA += s (dy B)^T x
  if (want_dx) detail::gemm<Scalar>("N", "N", scale_, c.up_grad, p.a, Scalar(1), dx);  // dx += s (dy B) A
}

template class lora<float>;
template class lora<double>;
}  // namespace kfsdp::nn
