#pragma once
// The one place that calls KokkosBlas::gemm, so that only the kernels include KokkosKernels.

#include <kfsdp/detail/between_kernels.hpp>
#include <kfsdp/nn/views.hpp>

#include <KokkosBlas3_gemm.hpp>

namespace kfsdp::nn::detail {

// C = alpha · op(A) · op(B) + beta · C, with op = "N" (as is) or "T" (transposed).
template <class Scalar>
void gemm(const char* trans_a, const char* trans_b, Scalar alpha, const_matrix<Scalar> a,
          const_matrix<Scalar> b, Scalar beta, matrix<Scalar> c) {
  kfsdp::detail::between_kernels();
  KokkosBlas::gemm(trans_a, trans_b, alpha, a, b, beta, c);
}

}  // namespace kfsdp::nn::detail
