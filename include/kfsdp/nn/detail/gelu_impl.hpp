#pragma once
// Definitions of kfsdp::nn::gelu; included by kernels/nn/gelu.cpp.

#include <kfsdp/detail/kokkos_math.hpp>
#include <kfsdp/nn/gelu.hpp>

namespace kfsdp::nn {

namespace detail {

// One definition of gelu and gelu' per element, shared with nn::activation (bit-identical results).
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar gelu_value(Scalar v) {
  const Scalar inv_sqrt2 = Scalar(0.70710678118654752440);
  return Scalar(0.5) * v * (Scalar(1) + math::erf(v * inv_sqrt2));
}

// gelu'(x) = Φ(x) + x φ(x), Φ(x) = 0.5 (1 + erf(x/√2)), φ(x) = exp(−x²/2) / √(2π).
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar gelu_derivative(Scalar v) {
  const Scalar inv_sqrt2 = Scalar(0.70710678118654752440);
  const Scalar inv_sqrt_2pi = Scalar(0.39894228040143267794);
  const Scalar cdf = Scalar(0.5) * (Scalar(1) + math::erf(v * inv_sqrt2));
  const Scalar pdf = inv_sqrt_2pi * math::exp(Scalar(-0.5) * v * v);
  return cdf + v * pdf;
}

template <class Scalar>
void gelu_forward(const_matrix<Scalar> x, matrix<Scalar> y) {
  const int rows = int(x.extent(0)), cols = int(x.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::gelu_forward",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {rows, cols}),
      KOKKOS_LAMBDA(int r, int c) { y(r, c) = gelu_value(x(r, c)); });
}

template <class Scalar>
void gelu_backward(const_matrix<Scalar> x, const_matrix<Scalar> dy, matrix<Scalar> dx) {
  const int rows = int(x.extent(0)), cols = int(x.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::gelu_backward",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {rows, cols}),
      KOKKOS_LAMBDA(int r, int c) { dx(r, c) = dy(r, c) * gelu_derivative(x(r, c)); });
}

}  // namespace detail

template <class Scalar>
void gelu<Scalar>::forward(const params&, const_matrix<Scalar> x, matrix<Scalar> y,
                           cache& c) const {
  detail::check_matrix("gelu::forward", "x", x, x.extent(0), features_);
  detail::check_matrix("gelu::forward", "y", y, x.extent(0), features_);
  detail::gelu_forward<Scalar>(x, y);
  c.input = x;
}

template <class Scalar>
void gelu<Scalar>::backward(const params&, const grads&, const cache& c, const_matrix<Scalar> dy,
                            matrix<Scalar> dx) const {
  const std::size_t rows = c.input.extent(0);
  detail::check_matrix("gelu::backward", "cache.input", c.input, rows, features_);
  detail::check_matrix("gelu::backward", "dy", dy, rows, features_);
  detail::check_matrix("gelu::backward", "dx", dx, rows, features_);
  detail::gelu_backward<Scalar>(c.input, dy, dx);
}

}  // namespace kfsdp::nn
