// kfsdp::reference::layer_norm: the kernel bodies and their explicit instantiations for float and
// double (the declarations are in layer_norm.hpp beside it).

#include "layer_norm.hpp"

#include <kfsdp/detail/kokkos_math.hpp>

namespace kfsdp::reference {

using nn::const_matrix;
using nn::const_vector;
using nn::execution_space;
using nn::matrix;
using nn::vector;

namespace detail {

template <class Scalar>
void layer_norm_forward(const_vector<Scalar> weight, const_vector<Scalar> bias,
                        const_matrix<Scalar> x, matrix<Scalar> y, vector<Scalar> mean,
                        vector<Scalar> rstd, Scalar eps) {
  const int rows = int(x.extent(0)), cols = int(x.extent(1));
  Kokkos::parallel_for(
      "kfsdp::reference::layer_norm_forward", Kokkos::RangePolicy<execution_space>(0, rows),
      KOKKOS_LAMBDA(int r) {
        Scalar sum = 0;
        for (int c = 0; c < cols; ++c) sum += x(r, c);
        const Scalar m = sum / Scalar(cols);
        Scalar square_sum = 0;  // two passes: no cancellation in var
        for (int c = 0; c < cols; ++c) square_sum += (x(r, c) - m) * (x(r, c) - m);
        const Scalar s = Scalar(1) / math::sqrt(square_sum / Scalar(cols) + eps);
        for (int c = 0; c < cols; ++c) y(r, c) = (x(r, c) - m) * s * weight(c) + bias(c);
        mean(r) = m;
        rstd(r) = s;
      });
}

template <class Scalar>
void layer_norm_backward_input(const_vector<Scalar> weight, const_matrix<Scalar> x,
                               const_vector<Scalar> mean, const_vector<Scalar> rstd,
                               const_matrix<Scalar> dy, matrix<Scalar> dx) {
  const int rows = int(x.extent(0)), cols = int(x.extent(1));
  Kokkos::parallel_for(
      "kfsdp::reference::layer_norm_backward_input", Kokkos::RangePolicy<execution_space>(0, rows),
      KOKKOS_LAMBDA(int r) {
        const Scalar m = mean(r), s = rstd(r);
        // dx = rstd · (dxhat − mean(dxhat) − xhat · mean(dxhat · xhat)), dxhat = dy · weight
        Scalar dxhat_sum = 0, dxhat_xhat_sum = 0;
        for (int c = 0; c < cols; ++c) {
          const Scalar dxhat = dy(r, c) * weight(c);
          dxhat_sum += dxhat;
          dxhat_xhat_sum += dxhat * (x(r, c) - m) * s;
        }
        const Scalar dxhat_mean = dxhat_sum / Scalar(cols);
        const Scalar dxhat_xhat_mean = dxhat_xhat_sum / Scalar(cols);
        for (int c = 0; c < cols; ++c) {
          const Scalar xhat = (x(r, c) - m) * s;
          dx(r, c) = s * (dy(r, c) * weight(c) - dxhat_mean - xhat * dxhat_xhat_mean);
        }
      });
}

// dweight[c] += Σ_r dy · xhat, dbias[c] += Σ_r dy; rows in order per column (deterministic).
template <class Scalar>
void layer_norm_backward_params(const_matrix<Scalar> x, const_vector<Scalar> mean,
                                const_vector<Scalar> rstd, const_matrix<Scalar> dy,
                                vector<Scalar> dweight, vector<Scalar> dbias) {
  const int rows = int(x.extent(0)), cols = int(x.extent(1));
  Kokkos::parallel_for(
      "kfsdp::reference::layer_norm_backward_params", Kokkos::RangePolicy<execution_space>(0, cols),
      KOKKOS_LAMBDA(int c) {
        Scalar weight_sum = 0, bias_sum = 0;
        for (int r = 0; r < rows; ++r) {
          weight_sum += dy(r, c) * (x(r, c) - mean(r)) * rstd(r);
          bias_sum += dy(r, c);
        }
        dweight(c) += weight_sum;
        dbias(c) += bias_sum;
      });
}

}  // namespace detail

template <class Scalar>
typename layer_norm<Scalar>::cache layer_norm<Scalar>::make_cache(std::size_t rows) const {
  (void)nn::detail::checked_numel("layer_norm::make_cache", "mean", {rows}, sizeof(Scalar));
  cache c;
  c.mean = vector<Scalar>(Kokkos::view_alloc("kfsdp::reference::layer_norm::mean"), rows);
  c.rstd = vector<Scalar>(Kokkos::view_alloc("kfsdp::reference::layer_norm::rstd"), rows);
  return c;
}

template <class Scalar>
void layer_norm<Scalar>::forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y,
                                 cache& c) const {
  check_tensors("layer_norm::forward", p);
  const std::size_t rows = x.extent(0);
  nn::detail::check_matrix("layer_norm::forward", "x", x, rows, features_);
  nn::detail::check_matrix("layer_norm::forward", "y", y, rows, features_);
  if (c.mean.extent(0) != rows) c = make_cache(rows);
  detail::layer_norm_forward<Scalar>(p.weight, p.bias, x, y, c.mean, c.rstd, eps_);
  c.input = x;
}

template <class Scalar>
void layer_norm<Scalar>::backward(const params& p, const grads& g, const cache& c,
                                  const_matrix<Scalar> dy, matrix<Scalar> dx) const {
  check_tensors("layer_norm::backward (params)", p);
  check_tensors("layer_norm::backward (grads)", g);
  const std::size_t rows = c.input.extent(0);
  nn::detail::check_matrix("layer_norm::backward", "cache.input", c.input, rows, features_);
  nn::detail::check_vector("layer_norm::backward", "cache.rstd", c.rstd, rows);
  nn::detail::check_matrix("layer_norm::backward", "dy", dy, rows, features_);
  nn::detail::check_matrix("layer_norm::backward", "dx", dx, rows, features_);
  detail::layer_norm_backward_params<Scalar>(c.input, c.mean, c.rstd, dy, g.weight, g.bias);
  detail::layer_norm_backward_input<Scalar>(p.weight, c.input, c.mean, c.rstd, dy, dx);
}

template class layer_norm<float>;
template class layer_norm<double>;
}  // namespace kfsdp::reference
