#pragma once
// Definitions of kfsdp::nn::activation; included by kernels/nn/activation.cpp.

#include <kfsdp/detail/kokkos_math.hpp>
#include <kfsdp/nn/activation.hpp>

#include <stdexcept>
#include <string>

namespace kfsdp::nn {

namespace detail {

// The exact GELU and its derivative, per element.
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

// √(2/π) and the cubic coefficient of PyTorch's tanh approximation.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar gelu_tanh_inner(Scalar v) {
  return Scalar(0.79788456080286535588) * (v + Scalar(0.044715) * v * v * v);
}

template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar sigmoid(Scalar v) {
  return Scalar(1) / (Scalar(1) + math::exp(-v));
}

template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar activation_value(activation_kind kind, Scalar v) {
  switch (kind) {
    case activation_kind::gelu: return gelu_value(v);
    case activation_kind::gelu_tanh:
      return Scalar(0.5) * v * (Scalar(1) + math::tanh(gelu_tanh_inner(v)));
    case activation_kind::relu: return v > Scalar(0) ? v : Scalar(0);
    case activation_kind::silu: return v * sigmoid(v);
    case activation_kind::tanh: return math::tanh(v);
  }
  return Scalar(0);
}

template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar activation_derivative(activation_kind kind, Scalar v) {
  switch (kind) {
    case activation_kind::gelu: return gelu_derivative(v);
    case activation_kind::gelu_tanh: {
      // d/dx 0.5 x (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 x (1 − tanh² u) u'
      const Scalar t = math::tanh(gelu_tanh_inner(v));
      const Scalar du = Scalar(0.79788456080286535588) * (Scalar(1) + Scalar(3 * 0.044715) * v * v);
      return Scalar(0.5) * (Scalar(1) + t) + Scalar(0.5) * v * (Scalar(1) - t * t) * du;
    }
    case activation_kind::relu: return v > Scalar(0) ? Scalar(1) : Scalar(0);
    case activation_kind::silu: {
      const Scalar s = sigmoid(v);
      return s * (Scalar(1) + v * (Scalar(1) - s));
    }
    case activation_kind::tanh: {
      const Scalar t = math::tanh(v);
      return Scalar(1) - t * t;
    }
  }
  return Scalar(0);
}

}  // namespace detail

template <class Scalar>
activation<Scalar>::activation(activation_kind kind, std::size_t features)
    : kind_(kind), features_(features) {
  if (int(kind) < 0 || int(kind) > int(activation_kind::tanh))
    throw std::invalid_argument("activation: kind " + std::to_string(int(kind)) + " is not a kind");
}

template <class Scalar>
void activation<Scalar>::forward(const_matrix<Scalar> x, matrix<Scalar> y) const {
  const std::size_t rows = x.extent(0);
  detail::check_matrix("activation::forward", "x", x, rows, features_);
  detail::check_matrix("activation::forward", "y", y, rows, features_);
  const activation_kind kind = kind_;
  Kokkos::parallel_for(
      "kfsdp::nn::activation_forward",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {int(rows), int(features_)}),
      KOKKOS_LAMBDA(int r, int c) { y(r, c) = detail::activation_value(kind, x(r, c)); });
}

template <class Scalar>
void activation<Scalar>::backward(const_matrix<Scalar> x, const_matrix<Scalar> dy,
                                  matrix<Scalar> dx) const {
  const std::size_t rows = x.extent(0);
  detail::check_matrix("activation::backward", "x", x, rows, features_);
  detail::check_matrix("activation::backward", "dy", dy, rows, features_);
  detail::check_matrix("activation::backward", "dx", dx, rows, features_);
  const activation_kind kind = kind_;
  // Each element reads dy(r, c) before writing dx(r, c): dx may alias dy.
  Kokkos::parallel_for(
      "kfsdp::nn::activation_backward",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {int(rows), int(features_)}),
      KOKKOS_LAMBDA(int r, int c) {
        dx(r, c) = dy(r, c) * detail::activation_derivative(kind, x(r, c));
      });
}

}  // namespace kfsdp::nn
