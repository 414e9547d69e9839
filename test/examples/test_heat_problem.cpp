// Tests of examples/heat_problem.hpp: the worked example, a manufactured solution, symmetry,
// positivity, the seeded sources and the sample layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <stdexcept>
#include <vector>

#include <heat_problem.hpp>

using namespace kfsdp::examples;

namespace {
// Largest |u_h − sin(πx) sin(πy)| over the nodes, for q = 2π² sin(πx) sin(πy) (so −Δu = q exactly).
double manufactured_error(std::size_t n) {
  const double pi = std::numbers::pi;
  const double h = 1.0 / static_cast<double>(n + 1);
  std::vector<double> q(n * n), exact(n * n);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      const double s = std::sin(pi * static_cast<double>(i + 1) * h) * std::sin(pi * static_cast<double>(j + 1) * h);
      exact[j * n + i] = s;
      q[j * n + i] = 2.0 * pi * pi * s;
    }
  const std::vector<double> u = solve_poisson(q, n);
  double error = 0.0;
  for (std::size_t k = 0; k < u.size(); ++k) error = std::max(error, std::abs(u[k] - exact[k]));
  return error;
}
}  // namespace

TEST_CASE("the worked example: one node, 4u/h² = q") {
  const std::vector<double> u = solve_poisson({16.0}, 1);
  REQUIRE(u.size() == 1);
  CHECK(u[0] == doctest::Approx(1.0).epsilon(1e-14));
  CHECK(solve_poisson(std::vector<double>(9, 0.0), 3) == std::vector<double>(9, 0.0));
}

TEST_CASE("a manufactured solution: the error falls as h² from n = 16 to n = 32") {
  const double e16 = manufactured_error(16), e32 = manufactured_error(32);
  CHECK(e16 < 1e-2);
  const double order = std::log(e16 / e32) / std::log(33.0 / 17.0);  // h = 1/17 -> 1/33
  CHECK(order == doctest::Approx(2.0).epsilon(0.05));
}

TEST_CASE("a source at the centre gives a field symmetric under both mirrors and the transpose") {
  const std::size_t n = 21;
  const std::vector<double> u = solve_heat({0.5, 0.5, 1.5, 0.1}, n);
  const double peak = *std::max_element(u.begin(), u.end());
  CHECK(peak == u[(n / 2) * n + n / 2]);  // the centre node
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      const double v = u[j * n + i];
      CHECK(std::abs(v - u[j * n + (n - 1 - i)]) <= 1e-9 * peak);
      CHECK(std::abs(v - u[(n - 1 - j) * n + i]) <= 1e-9 * peak);
      CHECK(std::abs(v - u[i * n + j]) <= 1e-9 * peak);
    }
}

TEST_CASE("a positive source gives a positive temperature everywhere") {
  for (const heat_source& s : {heat_source{0.2, 0.2, 0.5, 0.05}, heat_source{0.8, 0.3, 2.0, 0.15}}) {
    const std::vector<double> u = solve_heat(s, 24);
    CHECK(*std::min_element(u.begin(), u.end()) > 0.0);
  }
}

TEST_CASE("random_sources is reproducible for a seed, differs for another, and stays in range") {
  const std::vector<heat_source> a = random_sources(16, 7), b = random_sources(16, 7), c = random_sources(16, 8);
  const auto same = [](const std::vector<heat_source>& x, const std::vector<heat_source>& y) {
    for (std::size_t k = 0; k < x.size(); ++k)
      if (x[k].x0 != y[k].x0 || x[k].y0 != y[k].y0 || x[k].amplitude != y[k].amplitude || x[k].width != y[k].width)
        return false;
    return x.size() == y.size();
  };
  CHECK(same(a, b));
  CHECK(!same(a, c));
  for (const heat_source& s : a) {
    CHECK((s.x0 >= 0.2 && s.x0 < 0.8));
    CHECK((s.y0 >= 0.2 && s.y0 < 0.8));
    CHECK((s.amplitude >= 0.5 && s.amplitude < 2.0));
    CHECK((s.width >= 0.05 && s.width < 0.15));
  }
  // Pinned: mt19937_64 is specified by the standard and the [0, 1) map is ours, so every library agrees.
  const heat_source first = random_sources(1, 1)[0];
  CHECK(first.x0 == 0.2803259864075196);
  CHECK(first.width == 0.052102422841672706);
}

TEST_CASE("heat_samples: one sample per node per source, features (x, y, x0, y0, amplitude, width)") {
  const std::size_t n = 4;
  const std::vector<heat_source> sources = random_sources(2, 3);
  const surrogate_samples samples = heat_samples(sources, n);
  REQUIRE(samples.count == 2 * n * n);
  REQUIRE(samples.features.size() == samples.count * 6);
  REQUIRE(samples.targets.size() == samples.count);
  const std::vector<double> u1 = solve_heat(sources[1], n);
  const std::size_t i = 3, j = 1, k = n * n + j * n + i;  // source 1, node (3, 1)
  const double* f = samples.features.data() + 6 * k;
  CHECK(f[0] == doctest::Approx(0.8));  // x = 4h, h = 1/5
  CHECK(f[1] == doctest::Approx(0.4));  // y = 2h
  CHECK(f[2] == sources[1].x0);
  CHECK(f[3] == sources[1].y0);
  CHECK(f[4] == sources[1].amplitude);
  CHECK(f[5] == sources[1].width);
  CHECK(samples.targets[k] == u1[j * n + i]);
}

TEST_CASE("bad arguments are clear errors") {
  CHECK_THROWS_WITH_AS(solve_poisson({}, 0), "kfsdp::examples::solve_poisson: n is 0, expected at least 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(solve_poisson({1.0, 2.0}, 2), "kfsdp::examples::solve_poisson: q has 2 values, expected n · n = 4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(solve_heat({0.5, 0.5, 1.0, 0.1}, 0), "kfsdp::examples::solve_heat: n is 0, expected at least 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(solve_heat({0.5, 0.5, 1.0, 0.0}, 4), "kfsdp::examples::solve_heat: width is 0, expected more than 0",
                       std::invalid_argument);
  CHECK_THROWS_AS(solve_poisson({1.0, std::nan(""), 1.0, 1.0}, 2), std::runtime_error);
}
