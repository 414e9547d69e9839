#pragma once
// Small elementwise kernels shared by the composite layers (kernels only, not public API).

#include <kfsdp/nn/views.hpp>

namespace kfsdp::nn::detail {

// target += addend, both [rows, cols]: the residual connections.
template <class Scalar>
void add_into(matrix<Scalar> target, const_matrix<Scalar> addend) {
  const int rows = int(target.extent(0)), cols = int(target.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::add_into",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {rows, cols}),
      KOKKOS_LAMBDA(int r, int c) { target(r, c) += addend(r, c); });
}

}  // namespace kfsdp::nn::detail
