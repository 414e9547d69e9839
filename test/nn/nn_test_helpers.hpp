#pragma once
// Helpers of the nn tests: random views, single-entry access, central-difference gradient checks.

#include <doctest/doctest.h>
#include <kfsdp/nn/views.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace kfsdp::nn::testing {

// Uniform in [low, high) from a seeded generator, filled on the host and copied.
template <class View>
void fill_uniform(const View& view, std::uint64_t seed, double low = -1.0, double high = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(low, high);
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < host.span(); ++i) host.data()[i] = typename View::value_type(dist(rng));
  Kokkos::deep_copy(view, host);
}

template <class Scalar>
matrix<Scalar> random_matrix(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  matrix<Scalar> m("random", rows, cols);
  fill_uniform(m, seed);
  return m;
}

template <class Scalar>
vector<Scalar> random_vector(std::size_t size, std::uint64_t seed) {
  vector<Scalar> v("random", size);
  fill_uniform(v, seed);
  return v;
}

inline index_vector ids_from(const std::vector<int>& ids) {
  index_vector view("ids", ids.size());
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < ids.size(); ++i) host(i) = ids[i];
  Kokkos::deep_copy(view, host);
  return view;
}

// Flat 1-D view over any contiguous view: entry i of its span.
template <class View>
auto flat(const View& view) {
  using element = typename View::value_type;
  return Kokkos::View<element*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      view.data(), view.span());
}

template <class View>
double entry(const View& view, std::size_t i) {
  typename View::non_const_value_type value{};
  Kokkos::deep_copy(value, Kokkos::subview(flat(view), i));
  return double(value);
}

template <class View>
void set_entry(const View& view, std::size_t i, double value) {
  Kokkos::deep_copy(Kokkos::subview(flat(view), i), typename View::value_type(value));
}

template <class View>
std::vector<double> to_vector(const View& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<double>(host.data(), host.data() + host.span());
}

// Σ y ⊙ weights: the scalar whose gradient with respect to y is `weights`.
inline double weighted_sum(const_matrix<double> y, const_matrix<double> weights) {
  const auto a = to_vector(y), b = to_vector(weights);
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// Central-difference check of d(loss)/d(value[i]) against analytic[i] for up to max_entries
// entries spread over the view; loss() recomputes the forward pass from the current values.
template <class View, class Gradient>
void check_gradient(const std::string& name, const View& value, const Gradient& analytic,
                    const std::function<double()>& loss, std::size_t max_entries = 40,
                    double step = 1e-5, double tolerance = 1e-6) {
  const std::size_t size = value.span();
  REQUIRE(analytic.span() == size);
  const std::size_t stride = std::max<std::size_t>(1, size / max_entries);
  double worst = 0;
  for (std::size_t i = 0; i < size; i += stride) {
    const double original = entry(value, i);
    set_entry(value, i, original + step);
    const double plus = loss();
    set_entry(value, i, original - step);
    const double minus = loss();
    set_entry(value, i, original);
    const double numeric = (plus - minus) / (2 * step);
    const double exact = entry(analytic, i);
    const double error = std::abs(numeric - exact) / std::max(std::abs(numeric) + std::abs(exact), 1e-3);
    worst = std::max(worst, error);
    if (error >= tolerance)
      FAIL_CHECK(name << "[" << i << "]: finite difference " << numeric << ", backward " << exact
                      << ", relative error " << error);
  }
  MESSAGE(name << ": worst relative error " << worst);
}

}  // namespace kfsdp::nn::testing
