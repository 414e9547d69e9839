// kfsdp::nn::linear: the kernel bodies and their explicit instantiations for float and double
// (the declarations are in include/kfsdp/nn/linear.hpp).

#include <kfsdp/detail/vector_for.hpp>
#include <kfsdp/nn/detail/gemm.hpp>
#include <kfsdp/nn/linear.hpp>

namespace kfsdp::nn {

namespace detail {

// y[r, o] = bias[o] for every row: the gemm then adds x W^T with beta = 1.
template <class Scalar>
void broadcast_rows(const_vector<Scalar> bias, matrix<Scalar> y) {
  const int rows = int(y.extent(0)), cols = int(y.extent(1));
  kfsdp::detail::vector_for<execution_space>("kfsdp::nn::broadcast_rows", rows, KOKKOS_LAMBDA(std::int64_t r) {
    for (int o = 0; o < cols; ++o) y(r, o) = bias(o);
  });
}

// sums[c] += Σ_r m[r, c], rows summed in order (deterministic, no atomics). Each work item owns a
// block of columns and walks the rows, so it reads contiguous row segments (one pass over m, as a
// GEMV m^T·1 would), not one strided column at a time:
//   cols 10, block 4: items {0..3}, {4..7}, {8, 9}; item 1 adds m(r, 4..7) for r = 0, 1, ...
template <class Scalar>
void add_column_sums(const_matrix<Scalar> m, vector<Scalar> sums) {
  constexpr int block = 32;
  const int rows = int(m.extent(0)), cols = int(m.extent(1));
  kfsdp::detail::vector_for<execution_space>(
      "kfsdp::nn::add_column_sums", (cols + block - 1) / block, KOKKOS_LAMBDA(std::int64_t item) {
        const int first = int(item) * block, count = cols - first < block ? cols - first : block;
        Scalar partial[block] = {};
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < count; ++j) partial[j] += m(r, first + j);
        for (int j = 0; j < count; ++j) sums(first + j) += partial[j];
      });
}

}  // namespace detail

template <class Scalar>
void linear<Scalar>::forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y,
                             cache& c) const {
  check_tensors("linear::forward", p);
  detail::check_matrix("linear::forward", "x", x, x.extent(0), in_features_);
  detail::check_matrix("linear::forward", "y", y, x.extent(0), out_features_);
  Scalar beta = 0;
  if (has_bias_) {
    detail::broadcast_rows<Scalar>(p.bias, y);
    beta = 1;
  }
  if (x.extent(0) > 0) detail::gemm<Scalar>("N", "T", Scalar(1), x, p.weight, beta, y);
  c.input = x;
  detail::linear_forward_calls.fetch_add(1, std::memory_order_relaxed);
  detail::linear_forward_rows.fetch_add(x.extent(0), std::memory_order_relaxed);
}

template <class Scalar>
void linear<Scalar>::backward(const params& p, const grads& g, const cache& c,
                              const_matrix<Scalar> dy, matrix<Scalar> dx) const {
  check_tensors("linear::backward (params)", p);
  // A frozen weight or bias has no gradient: an empty one is left out, not checked.
  const bool want_dw = g.weight.data() != nullptr || g.weight.size() != 0;
  const bool want_db = has_bias_ && (g.bias.data() != nullptr || g.bias.size() != 0);
  if (want_dw) detail::check_matrix("linear::backward (grads)", "weight", g.weight, out_features_, in_features_);
  if (want_db) detail::check_vector("linear::backward (grads)", "bias", g.bias, out_features_);
  const std::size_t rows = c.input.extent(0);
  detail::check_matrix("linear::backward", "cache.input", c.input, rows, in_features_);
  detail::check_matrix("linear::backward", "dy", dy, rows, out_features_);
  const bool want_dx = dx.data() != nullptr;  // the first layer's input needs no gradient
  if (want_dx) detail::check_matrix("linear::backward", "dx", dx, rows, in_features_);
  if (rows == 0) return;
  if (want_dw) {
    detail::gemm<Scalar>("T", "N", Scalar(1), dy, c.input, Scalar(1), g.weight);  // dW += dy^T x
    detail::weight_gradient_products.fetch_add(1, std::memory_order_relaxed);
  }
  if (want_db) detail::add_column_sums<Scalar>(dy, g.bias);
  if (want_dx) detail::gemm<Scalar>("N", "N", Scalar(1), dy, p.weight, Scalar(0), dx);  // dx = dy W
}

template class linear<float>;
template class linear<double>;
}  // namespace kfsdp::nn
