// Row-wise expressions (include/kfsdp/expr/, compute/rowwise.hpp): every primitive and every
// row-wise layer passes the public gradient checker in f64, and the expression forms of the
// built-in element-wise and row-wise layers equal the hand-written kernels (reference/).
#include <doctest/doctest.h>

#include <kfsdp/train/gradient_check.hpp>
#include <kfsdp/compute/ops.hpp>

#include <hand_written.hpp>

#include <cmath>
#include <random>

using namespace kfsdp;

namespace {

template <class Layer>
gradient_check_report check_layer(const Layer& layer, gradient_check_options options = {}) {
  const gradient_check_report r = check_gradients(layer, options);
  INFO("worst ", r.worst, ": analytic ", r.analytic, ", numeric ", r.numeric, " (", r.checked, " checked, ", r.skipped,
       " skipped)");
  CHECK(r.checked > 0);
  CHECK(r.max_relative_error < 1e-8);
  return r;
}

// A layer of a test's expression: f(x, g, s), g per feature [W], s a scalar [1].
template <class F, std::size_t W = 6>
struct expression_layer : rowwise<"f"> {
  F f;
  constexpr explicit expression_layer(F fn) : f(fn) {}
  constexpr auto params() const {
    return std::array{param_decl{"g", {W}, {init_rule::ones}}, param_decl{"s", {1}, {init_rule::ones}}};
  }
  constexpr auto expression(auto x, auto g, auto s) const { return f(x, g, s); }
};
template <std::size_t W = 6, class F>
auto layer_of(F f) {
  return expression_layer<F, W>(f);
}

template <class F>
struct loss_layer : rowwise_loss<"loss"> {
  F f;
  constexpr explicit loss_layer(F fn) : f(fn) {}
  constexpr auto expression(auto x, auto t) const { return f(x, t); }
};

}  // namespace

TEST_CASE("every primitive passes the gradient checker in f64") {
  const auto id = [](auto x, auto g, auto s) { return x * g * s; };
  check_layer(layer_of(id));
  check_layer(layer_of([](auto x, auto g, auto s) { return x + g - s; }));
  check_layer(layer_of([](auto x, auto g, auto s) { return (x - 2.0) / (g * g + s * s + 1.0); }));
  check_layer(layer_of([](auto x, auto g, auto s) { return -x * g + 3.0 * s; }));
  check_layer(layer_of([](auto x, auto g, auto) { return exp(x) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return log(x * x + 0.5) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return sqrt(x * x + 0.5) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return rsqrt(x * x + 0.5) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return tanh(x) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return erf(x * g); }));
  check_layer(layer_of([](auto x, auto g, auto) { return sigmoid(x) + g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return pow(x * x + 0.5, 1.5) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return pow(x, 2.0) * g; }));
  // Kinks: the checker skips the elements within 2h of one, and checks the rest.
  check_layer(layer_of([](auto x, auto g, auto) { return abs(x) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return max(x, 0.0) * g; }));
  check_layer(layer_of([](auto x, auto g, auto) { return min(x, 0.25) * g; }));
}

TEST_CASE("row reductions, slices and nested reductions pass the gradient checker") {
  check_layer(layer_of([](auto x, auto g, auto) { return x * sum(x * g); }));
  check_layer(layer_of([](auto x, auto g, auto) { return (x - mean(x)) * g; }));
  // softmax and log-softmax through max: the max's adjoint goes to the first column where it is
  check_layer(layer_of([](auto x, auto g, auto) { return exp(x * g - max(x * g)) / sum(exp(x * g - max(x * g))); }));
  check_layer(layer_of([](auto x, auto, auto) { return x - max(x) - log(sum(exp(x - max(x)))); }));
  // nested: a reduction of a reduction (layer norm's variance around the mean)
  check_layer(layer_of([](auto x, auto g, auto s) {
    const auto centred = x - mean(x);
    return centred * rsqrt(mean(centred * centred) + 1e-5) * g + s;
  }));
  check_layer(layer_of([](auto x, auto, auto s) { return x * mean(x * mean(x * s)); }));
  // slices: the output narrower than the input
  check_layer(layer_of<3>([](auto x, auto g, auto) { return x.slice(1, 3) * x.slice(4, 3) * g; }),
              {.in_features = 8});
  check_layer(layer_of<4>([](auto x, auto g, auto) { return x.half(0) * sigmoid(x.half(1)) * g + sum(x.half(1)); }),
              {.in_features = 8});
  check_layer(swiglu<"mlp">{}, {.in_features = 10});
  check_layer(rms_norm<"norm", 12>{});
  check_layer(rms_norm<"norm">(5, 1e-5));
}

TEST_CASE("loss expressions pass the gradient checker: per element and per row, against a target row") {
  check_layer(derived::mse<>{}, {.in_features = 5});
  check_layer(loss_layer([](auto x, auto t) { return log(sum(exp(x))) - sum(x * t); }), {.in_features = 5});
  check_layer(loss_layer([](auto x, auto t) { return abs(x - t); }), {.in_features = 5});
}

TEST_CASE("the checker checks the hand-written built-ins and their expression forms") {
  check_layer(derived::layer_norm<"ln", 7>{});
  check_layer(derived::gelu<>{}, {.in_features = 9});
  check_layer(derived::gelu_tanh<>{}, {.in_features = 9});
  check_layer(derived::silu<>{}, {.in_features = 9});
  check_layer(derived::relu<>{}, {.in_features = 9});
  check_layer(derived::tanh_layer<>{}, {.in_features = 9});
  check_layer(linear<"fc", 5, 3>{});
  check_layer(layer_norm<"ln", 7>{});
  check_layer(gelu<>{}, {.in_features = 9});
  check_layer(gelu_tanh<>{}, {.in_features = 9});
  check_layer(silu<>{}, {.in_features = 9});
  check_layer(relu<>{}, {.in_features = 9});
  check_layer(tanh_layer<>{}, {.in_features = 9});
  check_layer(embedding<"wte", 11, 4>{});
  check_layer(positional_embedding<"wpe", 3, 4>{});
  check_layer(causal_self_attention<"attn", 8, 2, 3>{}, {.rows = 6});
  check_layer(cross_entropy<"", 7>{});
  check_layer(mse<>{}, {.in_features = 4});
}

namespace {
// y = x² · g with a backward that forgets the 2 in dx.
struct wrong_op {
  template <class Layer> explicit wrong_op(const Layer&) {}
  nn::const_matrix<double> input;
  void forward(const layer_params<const double>& p, nn::const_matrix<double> x, nn::matrix<double> y) {
    input = x;
    auto g = p.vector(0);
    Kokkos::parallel_for(Kokkos::RangePolicy<nn::execution_space>(0, int(x.extent(0))), KOKKOS_LAMBDA(int r) {
      for (int c = 0; c < int(x.extent(1)); ++c) y(r, c) = x(r, c) * x(r, c) * g(c);
    });
  }
  void backward(const layer_params<const double>& p, const layer_params<double>& g, nn::const_matrix<double> dy,
                nn::matrix<double> dx) {
    auto w = p.vector(0);
    auto dw = g.vector(0);
    const auto x = input;
    for (int r = 0; r < int(x.extent(0)); ++r)
      for (int c = 0; c < int(x.extent(1)); ++c) {
        dx(r, c) = dy(r, c) * x(r, c) * w(c);  // wrong: the factor 2 is missing
        dw(c) += dy(r, c) * x(r, c) * x(r, c);
      }
  }
};
struct wrong {
  static constexpr auto name = fixed_string("wrong");
  static constexpr layer_kind kind = layer_kind::layer;
  constexpr auto params() const { return std::array{param_decl{"g", {4}, {init_rule::ones}}}; }
  [[nodiscard]] constexpr std::size_t expected_in_features() const { return 4; }
  template <class S> using compute = wrong_op;
};
}  // namespace

TEST_CASE("the checker finds a wrong backward and names the worst element") {
  const gradient_check_report r = check_gradients(wrong{});
  CHECK(r.max_relative_error == doctest::Approx(0.5).epsilon(1e-6));
  CHECK(r.worst.rfind("input[", 0) == 0);
}

namespace {

// The derived layer A and the hand-written layer B on the same input, parameters and dy: y, dx and
// the parameters' gradients (accumulated onto the same nonzero start) agree within tolerance.
template <class S, class A, class B>
void compare(const A& derived, const B& written, std::size_t rows, std::size_t in, double tolerance) {
  std::mt19937_64 random(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](auto view) {
    auto host = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < host.size(); ++i) host.data()[i] = S(normal(random));
    Kokkos::deep_copy(view, host);
    return view;
  };
  const auto decls = derived.params();
  std::vector<param_info> infos(decls.size());
  std::vector<Kokkos::View<S*>> values, grads_a, grads_b;
  layer_params<const S> p;
  layer_params<S> ga, gb;
  for (std::size_t i = 0; i < decls.size(); ++i) {
    infos[i].name = inline_string<max_param_name>(decls[i].name);
    infos[i].rank = 1;
    infos[i].shape[0] = infos[i].numel = decls[i].shape[0];
    values.push_back(fill(Kokkos::View<S*>("p", infos[i].numel)));
    grads_a.push_back(fill(Kokkos::View<S*>("ga", infos[i].numel)));
    grads_b.push_back(Kokkos::View<S*>("gb", infos[i].numel));
    Kokkos::deep_copy(grads_b.back(), grads_a.back());
  }
  for (std::size_t i = 0; i < decls.size(); ++i) {
    p.push(values[i], infos[i]);
    ga.push(grads_a[i], infos[i]);
    gb.push(grads_b[i], infos[i]);
  }
  const nn::matrix<S> x = fill(nn::matrix<S>("x", rows, in)), dy = fill(nn::matrix<S>("dy", rows, in));
  nn::matrix<S> ya("ya", rows, in), yb("yb", rows, in), dxa("dxa", rows, in), dxb("dxb", rows, in);
  compute_t<A, S> a(derived);
  reference::hand_written_t<B, S> b(written);
  a.forward(p, x, ya);
  b.forward(p, x, yb);
  a.backward(p, ga, dy, dxa);
  b.backward(p, gb, dy, dxb);
  auto max_relative = [](auto u, auto v) {
    const auto hu = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), u);
    const auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < hu.size(); ++i) {
      scale = std::max(scale, std::abs(double(hv.data()[i])));
      diff = std::max(diff, std::abs(double(hu.data()[i]) - double(hv.data()[i])));
    }
    return diff / std::max(scale, 1e-300);
  };
  CHECK(max_relative(ya, yb) <= tolerance);
  CHECK(max_relative(dxa, dxb) <= tolerance);
  for (std::size_t i = 0; i < decls.size(); ++i) {
    CAPTURE(i);
    CHECK(max_relative(grads_a[i], grads_b[i]) <= tolerance);
  }
}

template <class S>
void compare_losses(std::size_t rows, std::size_t in, double tolerance) {
  std::mt19937_64 random(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  nn::matrix<S> x("x", rows, in), t("t", rows, in), dxa("dxa", rows, in), dxb("dxb", rows, in);
  for (auto v : {x, t}) {
    auto host = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < host.size(); ++i) host.data()[i] = S(normal(random));
    Kokkos::deep_copy(v, host);
  }
  compute_t<derived::mse<>, S> a(derived::mse<>{});
  reference::hand_written_t<mse<>, S> b(mse<>{});
  const S la = a.forward(x, t), lb = b.forward(x, t);
  CHECK(std::abs(double(la - lb)) <= tolerance * std::abs(double(lb)));
  a.backward(S(1) / S(rows), dxa);
  b.backward(S(1) / S(rows), dxb);
  const auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dxa);
  const auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dxb);
  double scale = 0, diff = 0;
  for (std::size_t i = 0; i < ha.size(); ++i) {
    scale = std::max(scale, std::abs(double(hb.data()[i])));
    diff = std::max(diff, std::abs(double(ha.data()[i] - hb.data()[i])));
  }
  CHECK(diff <= tolerance * scale);
}

// The GPT's shapes (rows 8·64, dim 128, the MLP 512 wide) and the surrogate's (256 rows, 64 wide).
template <class S>
void compare_all(double tolerance) {
  for (auto [rows, dim] : {std::pair<std::size_t, std::size_t>{512, 128}, {256, 64}}) {
    CAPTURE(rows);
    CAPTURE(dim);
    if (dim == 128) compare<S>(derived::layer_norm<"ln", 128>{}, layer_norm<"ln", 128>{}, rows, dim, tolerance);
    else compare<S>(derived::layer_norm<"ln", 64>{}, layer_norm<"ln", 64>{}, rows, dim, tolerance);
    const std::size_t wide = dim == 128 ? 512 : 64;
    compare<S>(derived::gelu<>{}, gelu<>{}, rows, wide, tolerance);
    compare<S>(derived::gelu_tanh<>{}, gelu_tanh<>{}, rows, wide, tolerance);
    compare<S>(derived::silu<>{}, silu<>{}, rows, wide, tolerance);
    compare<S>(derived::relu<>{}, relu<>{}, rows, wide, tolerance);
    compare<S>(derived::tanh_layer<>{}, tanh_layer<>{}, rows, wide, tolerance);
    compare_losses<S>(rows, dim, tolerance);
  }
}

}  // namespace

TEST_CASE("the expression forms equal the hand-written kernels: 1e-12 in f64, 1e-5 in f32") {
  compare_all<double>(1e-12);
  compare_all<float>(1e-5);
}
