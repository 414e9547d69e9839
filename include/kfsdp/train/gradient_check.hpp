#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::check_gradients(layer): a layer's backward against central differences of its forward,
// in double, for every element of every parameter and of the input — for any layer: built-in,
// derived from an expression, or hand-written to the contract of compute/ops.hpp.
//
//   auto report = kfsdp::check_gradients(rms_norm<"norm", 64>{});
//   // report.max_relative_error 3.1e-12 at "weight[17]"; CHECK(report.max_relative_error < 1e-8)
//
// The layer's compute runs on random inputs (N(0, 1)) and parameters (its init rule's centre plus
// U(−½, ½)); the objective is Σ y ⊙ w for a fixed random w (a loss layer: its loss). Each element's
// derivative is the fourth-order central difference (8(f(h) − f(−h)) − (f(2h) − f(−2h))) / 12h; its
// error is |analytic − numeric| / max(|analytic|, |numeric|, 1e-3 · the largest |analytic| of that
// tensor), so that elements whose gradient is ~0 are judged against the tensor's scale. Where the
// two second-order differences (step h and 2h) disagree by more than 1 %, the function is not
// smooth within 2h of the point (a kink of relu, abs, max): the element is counted as skipped.

#include <kfsdp/compute/ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace kfsdp {

struct gradient_check_options {
  std::size_t rows = 6;         // a multiple of the window for attention
  std::size_t in_features = 0;  // 0: what the layer says (expected_in_features(), or its per-feature parameters' width)
  std::size_t classes = 0;      // ids and class targets draw from [0, classes) (0: the layer's num_embeddings / classes)
  std::uint64_t seed = 0;
  double step = 1e-3;
};

struct gradient_check_report {
  double max_relative_error = 0;
  std::string worst;  // the element with the largest error: "weight[3, 1]", "input[2, 5]"
  double analytic = 0, numeric = 0;
  std::size_t checked = 0, skipped = 0;
};

namespace detail {

template <class Layer>
auto declared_params(const Layer& d) {
  if constexpr (requires { d.all_params(); }) return d.all_params();
  else return d.params();
}

inline std::string element_name(std::string_view tensor, std::span<const std::size_t> shape, std::size_t flat) {
  std::vector<std::size_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string out = std::string(tensor) + "[";
  for (std::size_t d = 0; d < index.size(); ++d) out += (d ? ", " : "") + std::to_string(index[d]);
  return out + "]";
}

template <class Layer>
std::size_t checked_in_features(const Layer& d, const gradient_check_options& o) {
  if (o.in_features != 0) return o.in_features;
  if constexpr (requires { d.expected_in_features(); }) {
    return d.expected_in_features();
  } else {
    for (const param_decl& decl : declared_params(d))
      if (decl.rank == 1 && decl.shape[0] != 1) return decl.shape[0];
    throw std::invalid_argument("kfsdp::check_gradients: layer '" + std::string(Layer::name.view()) +
                                "' does not say how many features it takes: set options.in_features");
  }
}

template <class Layer>
int checked_classes(const Layer& d, const gradient_check_options& o) {
  if (o.classes != 0) return int(o.classes);
  if constexpr (requires { d.num_embeddings; }) return int(d.num_embeddings);
  else if constexpr (requires { d.classes; }) return int(d.classes);
  else
    throw std::invalid_argument("kfsdp::check_gradients: layer '" + std::string(Layer::name.view()) +
                                "' takes ids or class targets: set options.classes");
}

}  // namespace detail

KFSDP_EXPORT template <layer_descriptor Layer>
gradient_check_report check_gradients(const Layer& layer, const gradient_check_options& options = {}) {
  using S = double;
  using In = input_t<Layer>;
  using Out = output_t<Layer>;
  std::mt19937_64 random(options.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> offset(-0.5, 0.5);
  const std::size_t rows = options.rows;

  // Parameters: infos, values and gradients, on the device; host copies to perturb.
  const auto decls = detail::declared_params(layer);
  std::vector<param_info> infos;
  for (const param_decl& decl : decls) {
    param_info info;
    info.name = inline_string<max_param_name>(decl.name);
    info.rank = decl.rank;
    info.numel = 1;
    for (std::size_t d = 0; d < decl.rank; ++d) {
      info.shape[d] = decl.shape[d];
      info.numel *= decl.shape[d];
    }
    info.init = decl.init;
    infos.push_back(info);
  }
  std::vector<Kokkos::View<S*>> values, grads;
  std::vector<Kokkos::View<S*, Kokkos::HostSpace>> host_values;
  for (const param_info& info : infos) {
    values.emplace_back("kfsdp::check_gradients::param", info.numel);
    grads.emplace_back("kfsdp::check_gradients::grad", info.numel);
    auto host = Kokkos::create_mirror_view(values.back());
    const double centre = info.init.kind == init_rule::ones ? 1.0 : 0.0;
    for (std::size_t i = 0; i < info.numel; ++i) host(i) = centre + offset(random);
    Kokkos::deep_copy(values.back(), host);
    host_values.push_back(host);
  }
  auto params_view = [&] {
    layer_params<const S> p;
    for (std::size_t i = 0; i < infos.size(); ++i) p.push(values[i], infos[i]);
    return p;
  };
  layer_params<S> grad_views;
  for (std::size_t i = 0; i < infos.size(); ++i) grad_views.push(grads[i], infos[i]);

  // The input and what the objective weighs the output by.
  compute_t<Layer, S> op(layer);
  std::size_t in = 0, out = 0;
  nn::matrix<S> x;
  nn::index_vector ids;
  if constexpr (std::is_same_v<In, features>) {
    in = detail::checked_in_features(layer, options);
    x = nn::matrix<S>("kfsdp::check_gradients::x", rows, in);
    auto host = Kokkos::create_mirror_view(x);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < in; ++c) host(r, c) = normal(random);
    Kokkos::deep_copy(x, host);
  } else {
    ids = nn::index_vector("kfsdp::check_gradients::ids", rows);
    auto host = Kokkos::create_mirror_view(ids);
    std::uniform_int_distribution<int> pick(0, detail::checked_classes(layer, options) - 1);
    for (std::size_t r = 0; r < rows; ++r) host(r) = pick(random);
    Kokkos::deep_copy(ids, host);
  }
  if constexpr (requires { op.bind_width(in); }) out = op.bind_width(in);
  else if constexpr (requires { layer.out_features_for(in); }) out = layer.out_features_for(in);
  else out = in;

  nn::matrix<S> y, weights, target_values;
  nn::index_vector target_ids;
  if constexpr (std::is_same_v<Out, loss>) {
    if constexpr (std::is_same_v<typename Layer::target, class_ids>) {
      target_ids = nn::index_vector("kfsdp::check_gradients::targets", rows);
      auto host = Kokkos::create_mirror_view(target_ids);
      std::uniform_int_distribution<int> pick(0, detail::checked_classes(layer, options) - 1);
      for (std::size_t r = 0; r < rows; ++r) host(r) = pick(random);
      Kokkos::deep_copy(target_ids, host);
    } else {
      target_values = nn::matrix<S>("kfsdp::check_gradients::targets", rows, in);
      auto host = Kokkos::create_mirror_view(target_values);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < in; ++c) host(r, c) = normal(random);
      Kokkos::deep_copy(target_values, host);
    }
  } else {
    y = nn::matrix<S>("kfsdp::check_gradients::y", rows, out);
    weights = nn::matrix<S>("kfsdp::check_gradients::w", rows, out);
    auto host = Kokkos::create_mirror_view(weights);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < out; ++c) host(r, c) = normal(random);
    Kokkos::deep_copy(weights, host);
  }

  // The objective at the current values.
  auto objective = [&]() -> double {
    if constexpr (std::is_same_v<Out, loss>) {
      if constexpr (std::is_same_v<typename Layer::target, class_ids>) return op.forward(x, target_ids);
      else return op.forward(x, target_values);
    } else {
      if constexpr (std::is_same_v<In, features>) op.forward(params_view(), x, y);
      else op.forward(params_view(), ids, y);
      const auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
      const auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), weights);
      double sum = 0;
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < out; ++c) sum += hy(r, c) * hw(r, c);
      return sum;
    }
  };

  // Analytic gradients: one forward, one backward.
  (void)objective();
  nn::matrix<S> dx;
  if constexpr (std::is_same_v<In, features>) dx = nn::matrix<S>("kfsdp::check_gradients::dx", rows, in);
  if constexpr (std::is_same_v<Out, loss>) op.backward(S(1) / S(rows), dx);
  else if constexpr (std::is_same_v<In, features>) op.backward(params_view(), grad_views, weights, dx);
  else op.backward(params_view(), grad_views, weights);

  gradient_check_report report;
  const double h = options.step;
  // One tensor: its host values (perturbed one element at a time, copied to `device`) against `analytic`.
  auto check_tensor = [&](std::string_view name, std::span<const std::size_t> shape, auto host, auto device, auto analytic) {
    const std::size_t n = host.size();
    double scale = 0;
    for (std::size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(analytic.data()[i]));
    for (std::size_t i = 0; i < n; ++i) {
      const double original = host.data()[i];
      auto at = [&](double delta) {
        host.data()[i] = original + delta;
        Kokkos::deep_copy(device, host);
        return objective();
      };
      const double f1 = at(h), f_1 = at(-h), f2 = at(2 * h), f_2 = at(-2 * h);
      host.data()[i] = original;
      Kokkos::deep_copy(device, host);
      const double d1 = (f1 - f_1) / (2 * h), d2 = (f2 - f_2) / (4 * h);
      const double numeric = (4 * d1 - d2) / 3;  // = (8(f(h) − f(−h)) − (f(2h) − f(−2h))) / 12h
      if (std::abs(d1 - d2) > 1e-2 * std::max({std::abs(d1), std::abs(d2), 1e-3 * scale, 1e-300})) {
        ++report.skipped;  // not smooth within 2h
        continue;
      }
      const double a = analytic.data()[i];
      const double error = std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), 1e-3 * scale, 1e-300});
      ++report.checked;
      if (error > report.max_relative_error || (std::isnan(error) && !std::isnan(report.max_relative_error))) {
        report.max_relative_error = error;
        report.worst = detail::element_name(name, shape, i);
        report.analytic = a;
        report.numeric = numeric;
      }
    }
  };
  for (std::size_t p = 0; p < infos.size(); ++p) {
    const auto analytic = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grads[p]);
    check_tensor(infos[p].name.view(), std::span<const std::size_t>(infos[p].shape.data(), infos[p].rank), host_values[p],
                 values[p], analytic);
  }
  if constexpr (std::is_same_v<In, features>) {
    const auto analytic = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dx);
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    const std::array<std::size_t, 2> shape{rows, in};
    check_tensor("input", shape, host, x, analytic);
  }
  return report;
}

}  // namespace kfsdp
