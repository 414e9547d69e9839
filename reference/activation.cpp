// kfsdp::reference::activation: the kernel bodies, their explicit instantiations for float and double
// and the kind names (the declarations are in activation.hpp beside it).

#include "activation.hpp"

#include <kfsdp/detail/erf.hpp>
#include <kfsdp/detail/kokkos_math.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kfsdp::reference {

using nn::const_matrix;
using nn::execution_space;
using nn::matrix;

namespace detail {

// The exact GELU and its derivative, per element; fast_erf and fast_exp_nonpositive instead of
// libm's scalar erf and exp let the loops vectorise (erf was 14% of a training step). Forced
// inline, as are activation_value and activation_derivative: in activation.cpp (five kinds, two
// types) GCC's inliner otherwise left a call in the float gelu backward loop, and so no vector loop.
template <class Scalar>
KOKKOS_FORCEINLINE_FUNCTION Scalar gelu_value(Scalar v) {
  const Scalar inv_sqrt2 = Scalar(0.70710678118654752440);
  return Scalar(0.5) * v * (Scalar(1) + math::fast_erf(v * inv_sqrt2));
}

// gelu'(x) = Φ(x) + x φ(x), Φ(x) = 0.5 (1 + erf(x/√2)), φ(x) = exp(−x²/2) / √(2π).
template <class Scalar>
KOKKOS_FORCEINLINE_FUNCTION Scalar gelu_derivative(Scalar v) {
  const Scalar inv_sqrt2 = Scalar(0.70710678118654752440);
  const Scalar inv_sqrt_2pi = Scalar(0.39894228040143267794);
  const Scalar cdf = Scalar(0.5) * (Scalar(1) + math::fast_erf(v * inv_sqrt2));
  const Scalar pdf = inv_sqrt_2pi * math::fast_exp_nonpositive(Scalar(-0.5) * v * v);
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
KOKKOS_FORCEINLINE_FUNCTION Scalar activation_value(activation_kind kind, Scalar v) {
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
KOKKOS_FORCEINLINE_FUNCTION Scalar activation_derivative(activation_kind kind, Scalar v) {
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

// The kernels, one per kind so that the per-element switch folds away; contiguous views (all of
// them but column slices) run one flat loop, which vectorises where a Rank<2> MDRange does not.
template <activation_kind Kind, class Scalar>
void forward_elements(const_matrix<Scalar> x, matrix<Scalar> y) {
  if (x.span_is_contiguous() && y.span_is_contiguous()) {
    const Scalar* in = x.data();
    Scalar* out = y.data();
    Kokkos::parallel_for(
        "kfsdp::reference::activation_forward",
        Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, std::int64_t(x.size())),
        KOKKOS_LAMBDA(std::int64_t i) { out[i] = activation_value(Kind, in[i]); });
    return;
  }
  Kokkos::parallel_for(
      "kfsdp::reference::activation_forward",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {int(x.extent(0)), int(x.extent(1))}),
      KOKKOS_LAMBDA(int r, int c) { y(r, c) = activation_value(Kind, x(r, c)); });
}

// Each element reads dy before writing dx: dx may alias dy.
template <activation_kind Kind, class Scalar>
void backward_elements(const_matrix<Scalar> x, const_matrix<Scalar> dy, matrix<Scalar> dx) {
  if (x.span_is_contiguous() && dy.span_is_contiguous() && dx.span_is_contiguous()) {
    const Scalar* in = x.data();
    const Scalar* upstream = dy.data();
    Scalar* out = dx.data();
    Kokkos::parallel_for(
        "kfsdp::reference::activation_backward",
        Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, std::int64_t(x.size())),
        KOKKOS_LAMBDA(std::int64_t i) { out[i] = upstream[i] * activation_derivative(Kind, in[i]); });
    return;
  }
  Kokkos::parallel_for(
      "kfsdp::reference::activation_backward",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {int(x.extent(0)), int(x.extent(1))}),
      KOKKOS_LAMBDA(int r, int c) { dx(r, c) = dy(r, c) * activation_derivative(Kind, x(r, c)); });
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
  nn::detail::check_matrix("activation::forward", "x", x, rows, features_);
  nn::detail::check_matrix("activation::forward", "y", y, rows, features_);
  switch (kind_) {
    case activation_kind::gelu: return detail::forward_elements<activation_kind::gelu>(x, y);
    case activation_kind::gelu_tanh: return detail::forward_elements<activation_kind::gelu_tanh>(x, y);
    case activation_kind::relu: return detail::forward_elements<activation_kind::relu>(x, y);
    case activation_kind::silu: return detail::forward_elements<activation_kind::silu>(x, y);
    case activation_kind::tanh: return detail::forward_elements<activation_kind::tanh>(x, y);
  }
}

template <class Scalar>
void activation<Scalar>::backward(const_matrix<Scalar> x, const_matrix<Scalar> dy,
                                  matrix<Scalar> dx) const {
  const std::size_t rows = x.extent(0);
  nn::detail::check_matrix("activation::backward", "x", x, rows, features_);
  nn::detail::check_matrix("activation::backward", "dy", dy, rows, features_);
  nn::detail::check_matrix("activation::backward", "dx", dx, rows, features_);
  switch (kind_) {
    case activation_kind::gelu: return detail::backward_elements<activation_kind::gelu>(x, dy, dx);
    case activation_kind::gelu_tanh: return detail::backward_elements<activation_kind::gelu_tanh>(x, dy, dx);
    case activation_kind::relu: return detail::backward_elements<activation_kind::relu>(x, dy, dx);
    case activation_kind::silu: return detail::backward_elements<activation_kind::silu>(x, dy, dx);
    case activation_kind::tanh: return detail::backward_elements<activation_kind::tanh>(x, dy, dx);
  }
}

namespace {
constexpr activation_kind all_kinds[] = {activation_kind::gelu, activation_kind::gelu_tanh,
                                         activation_kind::relu, activation_kind::silu,
                                         activation_kind::tanh};
}  // namespace

const char* name(activation_kind kind) {
  switch (kind) {
    case activation_kind::gelu: return "gelu";
    case activation_kind::gelu_tanh: return "gelu_tanh";
    case activation_kind::relu: return "relu";
    case activation_kind::silu: return "silu";
    case activation_kind::tanh: return "tanh";
  }
  return "unknown";
}

activation_kind parse_activation(std::string_view text) {
  for (activation_kind kind : all_kinds)
    if (text == name(kind)) return kind;
  throw std::invalid_argument("kfsdp: activation '" + std::string(text) +
                              "' is not one of gelu, gelu_tanh, relu, silu, tanh");
}

template class activation<float>;
template class activation<double>;

}  // namespace kfsdp::reference
