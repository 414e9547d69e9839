// SGD: option checks and the explicit instantiations for float and double.
// Check: meson test -C <build> optim_sgd
#include <kfsdp/optim/sgd.hpp>

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace kfsdp::optim {

namespace detail {

void check_length(std::string_view who, std::string_view view_name, std::size_t seen,
                  std::string_view expected_name, std::size_t expected) {
  if (seen != expected)
    throw std::invalid_argument(fmt::format("{}: {} has {} elements, expected {} (the length of {})",
                                            who, view_name, seen, expected, expected_name));
}

}  // namespace detail

void validate(const sgd_options& options, std::string_view who) {
  // Negated comparisons so that NaN is rejected too.
  if (!(options.lr >= 0.0) || std::isinf(options.lr))
    throw std::invalid_argument(fmt::format("{}: lr = {}, expected a finite lr >= 0", who, options.lr));
  if (!(options.momentum >= 0.0) || std::isinf(options.momentum))
    throw std::invalid_argument(
        fmt::format("{}: momentum = {}, expected a finite momentum >= 0", who, options.momentum));
  if (!(options.weight_decay >= 0.0) || std::isinf(options.weight_decay))
    throw std::invalid_argument(fmt::format("{}: weight_decay = {}, expected a finite weight_decay >= 0",
                                            who, options.weight_decay));
  if (options.nesterov && options.momentum == 0.0)
    throw std::invalid_argument(
        fmt::format("{}: nesterov = true with momentum = 0, expected momentum > 0 (Nesterov momentum "
                    "needs a momentum)",
                    who));
}

template void sgd_step<float>(const Kokkos::View<float*>&, const Kokkos::View<const float*>&,
                              const Kokkos::View<float*>&, const sgd_options&, double);
template void sgd_step<double>(const Kokkos::View<double*>&, const Kokkos::View<const double*>&,
                               const Kokkos::View<double*>&, const sgd_options&, double);
template class sgd<float>;
template class sgd<double>;

}  // namespace kfsdp::optim
