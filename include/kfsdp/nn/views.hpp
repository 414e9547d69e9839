#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::nn view conventions, shared by every layer.
//
// Conventions of the nn layers (all of include/kfsdp/nn/):
// - Tensors are Kokkos views in LayoutRight (row-major, PyTorch's order) in the memory space of
//   Kokkos::DefaultExecutionSpace. A batch of activations is a matrix [rows, features]; for a GPT
//   rows = B*T, row b*T + t is token t of window b.
// - Weights keep PyTorch's layout: a linear layer's weight is [out_features, in_features].
// - forward(params, x, y, cache) overwrites y and fills cache with what backward needs. The cache
//   may keep views of x and y (not copies): leave them untouched until backward has run.
// - backward(params, grads, cache, dy, dx) ACCUMULATES (+=) into the parameter gradients in grads,
//   so shared weights and gradient accumulation just add, and OVERWRITES the input gradient dx.
// - Reductions over rows (parameter gradients, embedding scatter) run in a fixed order, without
//   atomics, so results are bit-for-bit reproducible for a given build and shape.
// - Shapes are checked on every call; a bad shape throws std::invalid_argument naming the
//   parameter, the shape seen and the shape expected.
// - Sizes are checked before any buffer is made: an element or byte count past 2^64 throws
//   std::overflow_error (kfsdp::checked_mul), and an extent past INT_MAX (the kernels index
//   with int) throws std::overflow_error too, both naming the layer, the buffer and the operands.
//
//   kfsdp::nn::matrix<double> x("x", rows, 64);         // activations [rows, 64]
//   kfsdp::nn::const_matrix<double> w = weight;          // parameters are passed as const views

#include <Kokkos_Core.hpp>

#include <kfsdp/meta/checked.hpp>
#include <kfsdp/meta/shape_string.hpp>

#include <cstddef>
#include <initializer_list>
#include <span>
#include <limits>
#include <stdexcept>
#include <string>

namespace kfsdp::nn {

using execution_space = Kokkos::DefaultExecutionSpace;
using memory_space = execution_space::memory_space;

// matrix_of<double> / matrix_of<const double>: the element type carries the constness.
template <class Element>
using matrix_of = Kokkos::View<Element**, Kokkos::LayoutRight, memory_space>;
template <class Element>
using vector_of = Kokkos::View<Element*, Kokkos::LayoutRight, memory_space>;

KFSDP_EXPORT template <class Scalar>
using matrix = matrix_of<Scalar>;
KFSDP_EXPORT template <class Scalar>
using const_matrix = matrix_of<const Scalar>;
template <class Scalar>
using vector = vector_of<Scalar>;
template <class Scalar>
using const_vector = vector_of<const Scalar>;

// Token ids and class targets (bytes for the example GPT).
using index_vector = vector_of<int>;
using const_index_vector = vector_of<const int>;

// Attention probabilities [batch, heads, query, key].
template <class Scalar>
using tensor4 = Kokkos::View<Scalar****, Kokkos::LayoutRight, memory_space>;

// Parameters of a layer without any (gelu, attention core): an empty struct.
struct no_params {};

namespace detail {

[[noreturn]] inline void throw_shape(const std::string& where, const std::string& parameter,
                                     const std::string& seen, const std::string& expected) {
  throw std::invalid_argument(where + ": " + parameter + " has shape " + seen + ", expected " +
                              expected);
}

// "[2, 3]" for extents written in place.
inline std::string shape_string(std::initializer_list<std::size_t> extents) {
  return kfsdp::shape_string(std::span<const std::size_t>(extents.begin(), extents.size()));
}
inline std::string shape_string(std::size_t a) { return shape_string({a}); }
inline std::string shape_string(std::size_t a, std::size_t b) { return shape_string({a, b}); }

// The elements of a buffer of these extents, checked so that neither they nor the bytes Kokkos
// allocates for them (element_size each) wrap around 2^64:
//   checked_numel("layer_norm::make_cache", "mean", {std::size_t(1) << 62}, 8)
//     -> throws "kfsdp: layer_norm::make_cache: mean [4611686018427387904] bytes: 4611686018427387904 · 8 overflows 64 bits"
inline std::size_t checked_numel(const char* where, const char* buffer, std::initializer_list<std::size_t> extents,
                                 std::size_t element_size) {
  const auto what = [&](const char* count) { return std::string(where) + ": " + buffer + " " + shape_string(extents) + " " + count; };
  std::size_t numel = 1;
  for (std::size_t e : extents) numel = checked_mul(numel, e, [&] { return what("elements"); });
  (void)checked_mul(numel, element_size, [&] { return what("bytes"); });
  return numel;
}

// The kernels index rows and columns with int: a larger extent must stop, not truncate.
inline void check_int_extent(const char* where, const char* parameter, const char* extent_name, std::size_t value) {
  if (value > std::size_t(std::numeric_limits<int>::max()))
    throw std::overflow_error(std::string(where) + ": " + parameter + " has " + std::to_string(value) + " " + extent_name +
                              ", expected at most " + std::to_string(std::numeric_limits<int>::max()) +
                              " (the kernels index with int)");
}

// check_matrix("linear::forward", "x", x, rows, in) throws unless x is [rows, in].
template <class View>
void check_matrix(const char* where, const char* parameter, const View& view, std::size_t rows,
                  std::size_t cols) {
  if (view.extent(0) != rows || view.extent(1) != cols)
    throw_shape(where, parameter, shape_string(view.extent(0), view.extent(1)),
                shape_string(rows, cols));
  check_int_extent(where, parameter, "rows", rows);
  check_int_extent(where, parameter, "columns", cols);
}

template <class View>
void check_vector(const char* where, const char* parameter, const View& view, std::size_t size) {
  if (view.extent(0) != size)
    throw_shape(where, parameter, shape_string(view.extent(0)), shape_string(size));
  check_int_extent(where, parameter, "elements", size);
}

}  // namespace detail
}  // namespace kfsdp::nn
