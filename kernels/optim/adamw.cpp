// AdamW: option checks and the explicit instantiations for float and double.
// Check: meson test -C <build> optim_adamw
#include <kfsdp/optim/adamw.hpp>

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace kfsdp::optim {

namespace detail {

void check_step(std::string_view who, std::int64_t step) {
  if (step < 1)
    throw std::invalid_argument(fmt::format("{}: step = {}, expected step >= 1 (steps count from 1)", who,
                                            step));
}

}  // namespace detail

namespace {

void check_beta(std::string_view who, std::string_view name, double beta) {
  if (!(beta >= 0.0 && beta < 1.0))
    throw std::invalid_argument(fmt::format("{}: {} = {}, expected 0 <= {} < 1", who, name, beta, name));
}

}  // namespace

void validate(const adamw_options& options, std::string_view who) {
  // Negated comparisons so that NaN is rejected too.
  if (!(options.lr >= 0.0) || std::isinf(options.lr))
    throw std::invalid_argument(fmt::format("{}: lr = {}, expected a finite lr >= 0", who, options.lr));
  check_beta(who, "beta1", options.beta1);
  check_beta(who, "beta2", options.beta2);
  if (!(options.eps >= 0.0) || std::isinf(options.eps))
    throw std::invalid_argument(fmt::format("{}: eps = {}, expected a finite eps >= 0", who, options.eps));
  if (!(options.weight_decay >= 0.0) || std::isinf(options.weight_decay))
    throw std::invalid_argument(fmt::format("{}: weight_decay = {}, expected a finite weight_decay >= 0",
                                            who, options.weight_decay));
}

template void adamw_step<float>(const Kokkos::View<float*>&, const Kokkos::View<const float*>&,
                                const Kokkos::View<float*>&, const Kokkos::View<float*>&,
                                const adamw_options&, std::int64_t, double);
template void adamw_step<double>(const Kokkos::View<double*>&, const Kokkos::View<const double*>&,
                                 const Kokkos::View<double*>&, const Kokkos::View<double*>&,
                                 const adamw_options&, std::int64_t, double);
template void adamw_step<float>(const Kokkos::View<float*>&, const Kokkos::View<const float*>&,
                                const Kokkos::View<float*>&, const Kokkos::View<float*>&,
                                const adamw_options&, std::int64_t, const param_group_layout&, double);
template void adamw_step<double>(const Kokkos::View<double*>&, const Kokkos::View<const double*>&,
                                 const Kokkos::View<double*>&, const Kokkos::View<double*>&,
                                 const adamw_options&, std::int64_t, const param_group_layout&, double);
template class adamw<float>;
template class adamw<double>;

}  // namespace kfsdp::optim
