#pragma once
// Small kernels shared by the composite layers and by several kernels/nn/*.cpp (not public API).

#include <kfsdp/detail/vector_for.hpp>
#include <kfsdp/nn/views.hpp>

namespace kfsdp::nn::detail {

// target += addend, both [rows, cols]: the residual connections.
template <class Scalar>
void add_into(matrix<Scalar> target, const_matrix<Scalar> addend) {
  const int rows = int(target.extent(0)), cols = int(target.extent(1));
  kfsdp::detail::vector_for<execution_space>("kfsdp::nn::add_into", rows, KOKKOS_LAMBDA(std::int64_t r) {
    for (int c = 0; c < cols; ++c) target(r, c) += addend(r, c);
  });
}

}  // namespace kfsdp::nn::detail

namespace kfsdp::nn::detail {

// out = a + b, all [rows, cols] (a residual connection into its own buffer).
template <class Scalar>
void add(matrix<Scalar> out, const_matrix<Scalar> a, const_matrix<Scalar> b) {
  const int rows = int(out.extent(0)), cols = int(out.extent(1));
  kfsdp::detail::vector_for<execution_space>("kfsdp::nn::add", rows, KOKKOS_LAMBDA(std::int64_t r) {
    for (int c = 0; c < cols; ++c) out(r, c) = a(r, c) + b(r, c);
  });
}

// How many ids lie outside [0, num_embeddings): embedding's and cross_entropy's id checks.
inline int count_ids_out_of_range(const_index_vector ids, int num_embeddings) {
  int bad = 0;
  Kokkos::parallel_reduce(
      "kfsdp::nn::count_ids_out_of_range",
      Kokkos::RangePolicy<execution_space>(0, int(ids.extent(0))),
      KOKKOS_LAMBDA(int n, int& count) {
        if (ids(n) < 0 || ids(n) >= num_embeddings) ++count;
      },
      bad);
  return bad;
}

}  // namespace kfsdp::nn::detail
