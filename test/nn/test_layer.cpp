// Tests of include/kfsdp/nn/layer.hpp: a user-written layer models the concept and trains.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/layer.hpp>
#include <kfsdp/nn/linear.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

namespace {

// y = factor · x, one learnable scalar: the example of layer.hpp.
template <class S>
struct scale_layer {
  using scalar_type = S;
  struct params {
    const_vector<S> factor;  // [1]
  };
  struct grads {
    vector<S> factor;  // [1]
  };
  struct cache {
    const_matrix<S> input;
  };
  std::size_t features;

  std::size_t in_features() const { return features; }
  std::size_t out_features() const { return features; }
  cache make_cache(std::size_t) const { return {}; }

  void forward(const params& p, const_matrix<S> x, matrix<S> y, cache& c) const {
    const auto factor = p.factor;
    Kokkos::parallel_for(
        "scale_layer::forward",
        Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>(
            {0, 0}, {int(x.extent(0)), int(x.extent(1))}),
        KOKKOS_LAMBDA(int r, int j) { y(r, j) = factor(0) * x(r, j); });
    c.input = x;
  }

  void backward(const params& p, const grads& g, const cache& c, const_matrix<S> dy,
                matrix<S> dx) const {
    const auto factor = p.factor;
    const auto x = c.input;
    const int cols = int(x.extent(1));
    Kokkos::parallel_for(
        "scale_layer::backward_input",
        Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {int(x.extent(0)), cols}),
        KOKKOS_LAMBDA(int r, int j) { dx(r, j) = factor(0) * dy(r, j); });
    S sum = 0;
    Kokkos::parallel_reduce(
        "scale_layer::backward_factor",
        Kokkos::RangePolicy<execution_space>(0, int(x.extent(0)) * cols),
        KOKKOS_LAMBDA(int i, S& acc) { acc += dy(i / cols, i % cols) * x(i / cols, i % cols); },
        sum);
    auto factor_grad = Kokkos::subview(g.factor, 0);
    Kokkos::deep_copy(factor_grad, S(entry(g.factor, 0) + sum));  // += : accumulate
  }
};

static_assert(layer<scale_layer<double>>);
static_assert(!layer<int>);

// Runs any two layers one after the other: what a user's sequential network does.
template <layer First, layer Second>
double two_layer_loss(First& first, const typename First::params& p1, Second& second,
                      const typename Second::params& p2, const_matrix<double> x,
                      const_matrix<double> weights, typename First::cache& c1,
                      typename Second::cache& c2, matrix<double> hidden, matrix<double> y) {
  first.forward(p1, x, hidden, c1);
  second.forward(p2, hidden, y, c2);
  return weighted_sum(y, weights);
}

}  // namespace

TEST_CASE("a user-written layer composes with linear and its gradients check out") {
  const std::size_t rows = 3, in = 4, out = 2;
  scale_layer<double> scale{in};
  linear<double> fc(in, out);
  vector<double> factor("factor", 1), dfactor("dfactor", 1);
  set_entry(factor, 0, 1.7);
  auto w = random_matrix<double>(out, in, 1);
  auto b = random_vector<double>(out, 2);
  matrix<double> dw("dw", out, in);
  vector<double> db("db", out);
  auto x = random_matrix<double>(rows, in, 3);
  auto weights = random_matrix<double>(rows, out, 4);
  matrix<double> hidden("hidden", rows, in), y("y", rows, out), dhidden("dh", rows, in),
      dx("dx", rows, in);
  auto c1 = scale.make_cache(rows);
  auto c2 = fc.make_cache(rows);
  auto loss = [&] {
    return two_layer_loss(scale, {factor}, fc, {w, b}, x, weights, c1, c2, hidden, y);
  };
  CHECK(entry(y, 0) == 0.0);
  loss();
  fc.backward({w, b}, {dw, db}, c2, weights, dhidden);
  scale.backward({factor}, {dfactor}, c1, dhidden, dx);
  check_gradient("factor", factor, dfactor, loss);
  check_gradient("dx", x, dx, loss);
  check_gradient("linear.weight", w, dw, loss);
}
