// kfsdp::reference::mse_loss: the kernel bodies and their explicit instantiations for float and
// double (the declarations are in mse.hpp beside it).

#include "mse.hpp"

#include <stdexcept>

namespace kfsdp::reference {

using nn::const_matrix;
using nn::execution_space;
using nn::matrix;
using nn::vector;

template <class Scalar>
mse_loss<Scalar>::mse_loss(std::size_t features) : features_(features) {
  if (features == 0) throw std::invalid_argument("mse_loss: features must be > 0");
}

template <class Scalar>
Scalar mse_loss<Scalar>::forward(const_matrix<Scalar> pred, const_matrix<Scalar> target) const {
  const std::size_t rows = pred.extent(0);
  nn::detail::check_matrix("mse_loss::forward", "pred", pred, rows, features_);
  nn::detail::check_matrix("mse_loss::forward", "target", target, rows, features_);
  if (rows == 0) return Scalar(0);
  (void)nn::detail::checked_numel("mse_loss::forward", "row sums", {rows}, sizeof(Scalar));
  vector<Scalar> row_sums(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::reference::mse_loss::rows"),
                          rows);
  const int cols = int(features_);
  Kokkos::parallel_for(
      "kfsdp::reference::mse_rows", Kokkos::RangePolicy<execution_space>(0, int(rows)),
      KOKKOS_LAMBDA(int r) {
        Scalar sum = 0;
        for (int c = 0; c < cols; ++c) {
          const Scalar d = pred(r, c) - target(r, c);
          sum += d * d;
        }
        row_sums(r) = sum;
      });
  // The rows in index order on the host: the same sum on every backend.
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), row_sums);
  Scalar sum = 0;
  for (std::size_t r = 0; r < rows; ++r) sum += host(r);
  return sum / (Scalar(rows) * Scalar(features_));
}

template <class Scalar>
void mse_loss<Scalar>::backward(const_matrix<Scalar> pred, const_matrix<Scalar> target,
                                Scalar grad_scale, matrix<Scalar> dpred) const {
  const std::size_t rows = pred.extent(0);
  nn::detail::check_matrix("mse_loss::backward", "pred", pred, rows, features_);
  nn::detail::check_matrix("mse_loss::backward", "target", target, rows, features_);
  nn::detail::check_matrix("mse_loss::backward", "dpred", dpred, rows, features_);
  const Scalar factor = Scalar(2) * grad_scale / Scalar(features_);
  Kokkos::parallel_for(
      "kfsdp::reference::mse_gradient",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {int(rows), int(features_)}),
      KOKKOS_LAMBDA(int r, int c) { dpred(r, c) = (pred(r, c) - target(r, c)) * factor; });
}

template class mse_loss<float>;
template class mse_loss<double>;
}  // namespace kfsdp::reference
