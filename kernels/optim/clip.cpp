// Gradient clipping helpers: clip_scale, scale_in_place (KokkosBlas::scal) and the explicit
// instantiations for float and double.
// Check: meson test -C <build> optim_clip
#include <kfsdp/optim/clip.hpp>

#include <KokkosBlas1_scal.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kfsdp::optim {

double clip_scale(double global_norm, double max_norm) {
  if (!(max_norm >= 0.0))
    throw std::invalid_argument(fmt::format("clip_scale: max_norm = {}, expected max_norm >= 0", max_norm));
  if (!(global_norm >= 0.0) || std::isinf(global_norm))
    throw std::invalid_argument(fmt::format(
        "clip_scale: global_norm = {}, expected a finite norm >= 0 (a gradient holds NaN or Inf?)",
        global_norm));
  // PyTorch's clip_grad_norm_: the 1e-6 keeps a zero norm from dividing by zero.
  return std::min(1.0, max_norm / (global_norm + 1e-6));
}

template <class Scalar>
void scale_in_place(const Kokkos::View<Scalar*>& values, double factor) {
  if (factor == 1.0) return;  // the common no-clip case costs nothing
  KokkosBlas::scal(values, static_cast<Scalar>(factor), values);  // values = factor · values
}

template double local_squared_norm<float>(const Kokkos::View<const float*>&);
template double local_squared_norm<double>(const Kokkos::View<const double*>&);
template void scale_in_place<float>(const Kokkos::View<float*>&, double);
template void scale_in_place<double>(const Kokkos::View<double*>&, double);

}  // namespace kfsdp::optim
