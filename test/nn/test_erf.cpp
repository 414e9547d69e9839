// Tests of include/kfsdp/detail/erf.hpp (kfsdp::math::fast_erf) and of reference/activation.hpp's gelu on it.
#include "nn_test_helpers.hpp"

#include <activation.hpp>

#include <kfsdp/detail/erf.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

namespace {

// The correctly rounded float erf, up to the double erf's own error.
float reference_erf(float x) { return float(std::erf(double(x))); }

// Distance in representable floats between a and b, counting +0 and -0 as one value.
std::int64_t ulp_distance(float a, float b) {
  auto ordered = [](float v) {
    const auto bits = std::int64_t(std::bit_cast<std::uint32_t>(v));
    return bits & 0x80000000 ? -(bits & 0x7fffffff) : bits;
  };
  return std::abs(ordered(a) - ordered(b));
}

struct float_sweep {
  std::int64_t worst_ulp = 0;
  float worst_x = 0;
  std::size_t tested = 0;

  void check(float x) {
    const float fast = kfsdp::math::fast_erf(x), reference = reference_erf(x);
    ++tested;
    if (std::isnan(reference)) {
      CHECK(std::isnan(fast));
      return;
    }
    const std::int64_t ulp = ulp_distance(fast, reference);
    if (ulp > worst_ulp) worst_ulp = ulp, worst_x = x;
  }
};

double reference_gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

TEST_CASE("fast_erf(float) is within 1 ulp of the correctly rounded erf") {
  float_sweep sweep;
  // Every 67th bit pattern from +0 to 6 (16 million floats), both signs: the range where erf is not ±1.
  const std::uint32_t six = std::bit_cast<std::uint32_t>(6.0F);
  for (std::uint32_t bits = 0; bits <= six; bits += 67) {
    const float x = std::bit_cast<float>(bits);
    sweep.check(x);
    sweep.check(-x);
  }
  // Beyond 6 up to the largest finite float, every 4099th pattern.
  for (std::uint32_t bits = six; bits <= 0x7f7fffffU; bits += 4099) {
    sweep.check(std::bit_cast<float>(bits));
    sweep.check(-std::bit_cast<float>(bits));
  }
  // Every float in [0.5, 4.5], where the two fits meet (1) and where erf starts rounding to 1 (3.83).
  for (std::uint32_t bits = std::bit_cast<std::uint32_t>(0.99F); bits <= std::bit_cast<std::uint32_t>(1.01F); ++bits)
    sweep.check(std::bit_cast<float>(bits));
  for (std::uint32_t bits = std::bit_cast<std::uint32_t>(3.8F); bits <= std::bit_cast<std::uint32_t>(4.1F); ++bits)
    sweep.check(std::bit_cast<float>(bits));
  constexpr float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> edges = {0.0F, -0.0F, std::numeric_limits<float>::denorm_min(),
                                    -std::numeric_limits<float>::denorm_min(), 1e-40F, -1e-40F,
                                    std::numeric_limits<float>::min(), std::nextafter(1.0F, 0.0F), 1.0F,
                                    3.8325F, 3.92F, 4.0F, 6.0F, 10.0F, std::numeric_limits<float>::max(),
                                    -std::numeric_limits<float>::max(), inf, -inf};
  for (float x : edges) sweep.check(x);
  MESSAGE("float: " << sweep.tested << " values, max " << sweep.worst_ulp << " ulp at x = " << sweep.worst_x);
  CHECK(sweep.worst_ulp <= 1);

  CHECK(std::bit_cast<std::uint32_t>(kfsdp::math::fast_erf(0.0F)) == 0U);
  CHECK(std::bit_cast<std::uint32_t>(kfsdp::math::fast_erf(-0.0F)) == 0x80000000U);  // erf keeps the sign of zero
  CHECK(kfsdp::math::fast_erf(inf) == 1.0F);
  CHECK(kfsdp::math::fast_erf(-inf) == -1.0F);
  CHECK(kfsdp::math::fast_erf(std::numeric_limits<float>::max()) == 1.0F);
  CHECK(std::isnan(kfsdp::math::fast_erf(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(kfsdp::math::fast_erf(-std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("fast_exp_nonpositive(float) is within 2 ulp of exp, flushes below -87.3, keeps NaN") {
  std::int64_t worst = 0;
  float worst_y = 0;
  // Every 61st float from -0 down to -87.3, where the result is normal.
  const std::uint32_t limit = std::bit_cast<std::uint32_t>(-87.3F);
  for (std::uint32_t bits = 0x80000000U; bits <= limit; bits += 61) {
    const float y = std::bit_cast<float>(bits);
    const std::int64_t ulp = ulp_distance(kfsdp::math::fast_exp_nonpositive(y), float(std::exp(double(y))));
    if (ulp > worst) worst = ulp, worst_y = y;
  }
  MESSAGE("exp: max " << worst << " ulp at y = " << worst_y);
  CHECK(worst <= 2);
  CHECK(kfsdp::math::fast_exp_nonpositive(0.0F) == 1.0F);
  CHECK(kfsdp::math::fast_exp_nonpositive(-0.0F) == 1.0F);
  CHECK(kfsdp::math::fast_exp_nonpositive(-87.4F) == 0.0F);
  CHECK(kfsdp::math::fast_exp_nonpositive(-1e30F) == 0.0F);
  CHECK(kfsdp::math::fast_exp_nonpositive(-std::numeric_limits<float>::infinity()) == 0.0F);
  CHECK(std::isnan(kfsdp::math::fast_exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(kfsdp::math::fast_exp_nonpositive(-std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("fast_erf(double) is within 1e-15 of std::erf") {
  double worst = 0, worst_x = 0;
  std::size_t tested = 0;
  auto check = [&](double x) {
    const double fast = kfsdp::math::fast_erf(x), reference = std::erf(x);
    ++tested;
    const double error = std::abs(fast - reference) / std::max(1.0, std::abs(reference));
    if (error > worst) worst = error, worst_x = x;
  };
  // 6 million evenly spaced points on [-7, 7] (erf is ±1 in double beyond 5.93), then every
  // 2^40th bit pattern from the smallest subnormal to the largest double (3 million values).
  constexpr int steps = 6'000'000;
  for (int i = 0; i <= steps; ++i) check(-7.0 + 14.0 * i / steps);
  for (std::uint64_t bits = 1; bits < 0x7ff0000000000000ULL; bits += std::uint64_t(1) << 40) {
    check(std::bit_cast<double>(bits));
    check(-std::bit_cast<double>(bits));
  }
  MESSAGE("double: " << tested << " values, max |fast - std| / max(1, |std|) = " << worst << " at x = " << worst_x);
  CHECK(worst <= 1e-15);

  constexpr double inf = std::numeric_limits<double>::infinity();
  CHECK(std::bit_cast<std::uint64_t>(kfsdp::math::fast_erf(-0.0)) == std::bit_cast<std::uint64_t>(-0.0));
  CHECK(kfsdp::math::fast_erf(std::numeric_limits<double>::denorm_min()) ==
        std::erf(std::numeric_limits<double>::denorm_min()));
  CHECK(kfsdp::math::fast_erf(inf) == 1.0);
  CHECK(kfsdp::math::fast_erf(-inf) == -1.0);
  CHECK(kfsdp::math::fast_erf(std::numeric_limits<double>::max()) == 1.0);
  CHECK(kfsdp::math::fast_erf(-std::numeric_limits<double>::max()) == -1.0);
  CHECK(std::isnan(kfsdp::math::fast_erf(std::numeric_limits<double>::quiet_NaN())));
}

TEST_CASE("gelu (double) matches 0.5 x (1 + std::erf(x / sqrt 2))") {
  // Relative to max(|gelu|, |x|): for x < -3 the old formula's 1 + erf cancels (at x = -6 it keeps
  // only 7 digits), so no erf short of std::erf itself reproduces it to 1e-15 relative there.
  constexpr std::size_t rows = 1000, cols = 100;
  matrix<double> x("x", rows, cols), y("y", rows, cols), ones("ones", rows, cols), dx("dx", rows, cols);
  fill_uniform(x, 7, -10.0, 10.0);
  Kokkos::deep_copy(ones, 1.0);
  const kfsdp::reference::activation<double> gelu(kfsdp::reference::activation_kind::gelu, cols);
  gelu.forward(x, y);
  gelu.backward(x, ones, dx);
  auto host_x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  auto host_y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  auto host_dx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dx);
  double worst_value = 0, worst_relative_well_conditioned = 0, worst_derivative = 0;
  for (std::size_t i = 0; i < rows * cols; ++i) {
    const double v = host_x.data()[i], reference = reference_gelu(v);
    worst_value = std::max(worst_value, std::abs(host_y.data()[i] - reference) / std::max(std::abs(reference), std::abs(v)));
    if (v > -1) worst_relative_well_conditioned =
        std::max(worst_relative_well_conditioned, std::abs(host_y.data()[i] - reference) / std::abs(reference));
    const double cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
    const double derivative = cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2 * std::numbers::pi);
    worst_derivative = std::max(worst_derivative, std::abs(host_dx.data()[i] - derivative) / std::max(1.0, std::abs(v)));
  }
  MESSAGE("gelu: max |Δ| / max(|gelu|, |x|) = " << worst_value << ", relative for x > -1 = "
                                                << worst_relative_well_conditioned << ", derivative "
                                                << worst_derivative);
  CHECK(worst_value <= 1e-15);
  CHECK(worst_relative_well_conditioned <= 1e-15);
  CHECK(worst_derivative <= 1e-15);
}
