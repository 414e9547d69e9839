#pragma once
// The PDE behind the surrogate example: steady heat −Δu = q on the unit square, u = 0 on the
// boundary, q a Gaussian source; solved on an n × n interior grid (h = 1/(n+1), node (i, j) at
// x = (i+1)h, y = (j+1)h, row-major index j·n + i) by 5-point finite differences and conjugate
// gradient, and turned into (x, y, source parameters) -> u samples for an MLP.
//
//   solve_poisson({16.0}, 1)  -> {1.0}     (one node at (0.5, 0.5), h = 1/2: 4u/h² = q, u = q/16)
//   solve_heat({0.5, 0.5, 1.0, 0.1}, 32)   -> 1024 temperatures, largest at the 4 nodes round (0.5, 0.5)
//   heat_samples(random_sources(8, 1), 32) -> 8 · 1024 samples; sample s·n² + j·n + i has
//                                             features (x, y, x0, y0, amplitude, width), target u

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/meta/host_memory.hpp>  // require_host_memory
#endif

namespace kfsdp::examples {

struct heat_source {
  double x0, y0, amplitude, width;
};

// u with −Δ_h u = q at the n × n interior nodes (q given there, row-major j·n + i), u = 0 outside.
inline std::vector<double> solve_poisson(const std::vector<double>& q, std::size_t n) {
  if (n == 0) throw std::invalid_argument("kfsdp::examples::solve_poisson: n is 0, expected at least 1");
  const std::size_t size = n * n;
  if (q.size() != size)
    throw std::invalid_argument(fmt::format("kfsdp::examples::solve_poisson: q has {} values, expected n · n = {}",
                                            q.size(), size));
  // Solve (h² A) u = h² q: the scaled stencil 4u − neighbours, with the same relative residual.
  const double h = 1.0 / static_cast<double>(n + 1);
  std::vector<double> b(size), u(size, 0.0), r(size), p(size), ap(size);
  for (std::size_t k = 0; k < size; ++k) b[k] = h * h * q[k];
  const auto apply = [n](const std::vector<double>& v, std::vector<double>& out) {
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t k = j * n + i;
        double s = 4.0 * v[k];
        if (i > 0) s -= v[k - 1];
        if (i + 1 < n) s -= v[k + 1];
        if (j > 0) s -= v[k - n];
        if (j + 1 < n) s -= v[k + n];
        out[k] = s;
      }
  };
  const auto dot = [](const std::vector<double>& a, const std::vector<double>& c) {
    double s = 0.0;
    for (std::size_t k = 0; k < a.size(); ++k) s += a[k] * c[k];
    return s;
  };
  constexpr double tolerance = 1e-10;
  const double b_norm = std::sqrt(dot(b, b));
  if (b_norm == 0.0) return u;  // q = 0: u = 0 exactly (and the relative residual is undefined)
  r = b;  // u starts at 0
  p = r;
  double rr = dot(r, r);
  const std::size_t max_iterations = size;
  std::size_t iteration = 0;
  for (; iteration < max_iterations && std::sqrt(rr) > tolerance * b_norm; ++iteration) {
    apply(p, ap);
    const double alpha = rr / dot(p, ap);
    for (std::size_t k = 0; k < size; ++k) {
      u[k] += alpha * p[k];
      r[k] -= alpha * ap[k];
    }
    const double rr_next = dot(r, r);
    const double beta = rr_next / rr;
    rr = rr_next;
    for (std::size_t k = 0; k < size; ++k) p[k] = r[k] + beta * p[k];
  }
  if (!(std::sqrt(rr) <= tolerance * b_norm))  // also catches a NaN residual (a NaN or infinite q)
    throw std::runtime_error(fmt::format(
        "kfsdp::examples::solve_poisson: conjugate gradient reached relative residual {:.3g} after {} iterations "
        "(limit n · n = {}), expected at most {:g}",
        std::sqrt(rr) / b_norm, iteration, max_iterations, tolerance));
  return u;
}

// The temperature at the n × n interior nodes for one Gaussian source.
inline std::vector<double> solve_heat(const heat_source& source, std::size_t n) {
  if (n == 0) throw std::invalid_argument("kfsdp::examples::solve_heat: n is 0, expected at least 1");
  if (!(source.width > 0.0))
    throw std::invalid_argument(
        fmt::format("kfsdp::examples::solve_heat: width is {}, expected more than 0", source.width));
  const double h = 1.0 / static_cast<double>(n + 1);
  std::vector<double> q(n * n);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      const double dx = static_cast<double>(i + 1) * h - source.x0;
      const double dy = static_cast<double>(j + 1) * h - source.y0;
      q[j * n + i] = source.amplitude * std::exp(-(dx * dx + dy * dy) / (2.0 * source.width * source.width));
    }
  return solve_poisson(q, n);
}

// `count` sources: x0, y0 in [0.2, 0.8], amplitude in [0.5, 2], width in [0.05, 0.15], uniform.
inline std::vector<heat_source> random_sources(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);  // its output is fixed by the standard; std distributions are not
  const auto uniform = [&rng](double low, double high) {
    const double unit = static_cast<double>(rng() >> 11) * 0x1p-53;  // top 53 bits -> [0, 1)
    return low + (high - low) * unit;
  };
  kfsdp::require_host_memory(double(count) * sizeof(heat_source), fmt::format("{} heat problems", count));
  std::vector<heat_source> sources(count);
  for (heat_source& s : sources) {  // one statement per field: argument order is unspecified
    s.x0 = uniform(0.2, 0.8);
    s.y0 = uniform(0.2, 0.8);
    s.amplitude = uniform(0.5, 2.0);
    s.width = uniform(0.05, 0.15);
  }
  return sources;
}

// Samples [count, 6] features and [count, 1] targets, row-major, count = sources · n².
struct surrogate_samples {
  std::vector<double> features;
  std::vector<double> targets;
  std::size_t count;
};

// One sample per grid node per source, source-major then node j·n + i.
inline surrogate_samples heat_samples(const std::vector<heat_source>& sources, std::size_t n) {
  if (n == 0) throw std::invalid_argument("kfsdp::examples::heat_samples: n is 0, expected at least 1");
  // Checked in doubles before anything is allocated: n² and the sample count cannot wrap.
  kfsdp::require_host_memory(double(sources.size()) * double(n) * double(n) * 7 * sizeof(double),
                             fmt::format("the samples of {} heat problems on a {}×{} grid", sources.size(), n, n));
  surrogate_samples samples{{}, {}, sources.size() * n * n};
  samples.features.reserve(samples.count * 6);
  samples.targets.reserve(samples.count);
  const double h = 1.0 / static_cast<double>(n + 1);
  for (const heat_source& s : sources) {
    const std::vector<double> u = solve_heat(s, n);
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        const double node[6] = {static_cast<double>(i + 1) * h, static_cast<double>(j + 1) * h, s.x0, s.y0,
                                s.amplitude, s.width};
        samples.features.insert(samples.features.end(), node, node + 6);
        samples.targets.push_back(u[j * n + i]);
      }
  }
  return samples;
}

}  // namespace kfsdp::examples
