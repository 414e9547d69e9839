// Tests of include/kfsdp/nn/lora.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/lora.hpp>

#include <cmath>
#include <stdexcept>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

namespace {
constexpr std::size_t rows = 5, in = 6, out = 4, rank = 3;
constexpr double alpha = 12;  // s = alpha / rank = 4

struct layer_values {
  matrix<double> x = random_matrix<double>(rows, in, 1), w = random_matrix<double>(out, in, 2);
  vector<double> bias = random_vector<double>(out, 3);
  matrix<double> a = random_matrix<double>(rank, in, 4), b = random_matrix<double>(out, rank, 5);  // B ≠ 0: a trained adapter
};
}  // namespace

TEST_CASE("lora forward: y = x W^T + b + (alpha / r) (x A^T) B^T, against the plain loops") {
  layer_values v;
  lora<double> layer(in, out, rank, alpha);
  CHECK(layer.scale() == 4.0);
  matrix<double> y("y", rows, out);
  auto cache = layer.make_cache(rows);
  layer.forward({v.w, v.bias, v.a, v.b}, v.x, y, cache);
  const auto x = to_vector(v.x), w = to_vector(v.w), bias = to_vector(v.bias), a = to_vector(v.a), b = to_vector(v.b);
  const auto got = to_vector(y);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double want = bias[o];
      for (std::size_t i = 0; i < in; ++i) want += x[r * in + i] * w[o * in + i];
      for (std::size_t k = 0; k < rank; ++k) {
        double down = 0;
        for (std::size_t i = 0; i < in; ++i) down += x[r * in + i] * a[k * in + i];
        want += 4.0 * down * b[o * rank + k];
      }
      CHECK(got[r * out + o] == doctest::Approx(want).epsilon(1e-14));
    }
}

TEST_CASE("lora backward matches central differences: W, b, A, B and x") {
  for (const bool has_bias : {true, false}) {
    CAPTURE(has_bias);
    layer_values v;
    const vector<double> bias = has_bias ? v.bias : vector<double>();
    lora<double> layer(in, out, rank, alpha, has_bias);
    auto weights = random_matrix<double>(rows, out, 6);  // dy
    matrix<double> y("y", rows, out), dx("dx", rows, in), dw("dw", out, in), da("da", rank, in), db("db", out, rank);
    vector<double> dbias("dbias", has_bias ? out : 0);
    auto cache = layer.make_cache(rows);
    auto loss = [&] {
      layer.forward({v.w, bias, v.a, v.b}, v.x, y, cache);
      return weighted_sum(y, weights);
    };
    loss();
    layer.backward({v.w, bias, v.a, v.b}, {dw, dbias, da, db}, cache, weights, dx);
    check_gradient("dx", v.x, dx, loss);
    check_gradient("dweight", v.w, dw, loss);
    check_gradient("dA", v.a, da, loss);
    check_gradient("dB", v.b, db, loss);
    if (has_bias) check_gradient("dbias", bias, dbias, loss);
  }
}

TEST_CASE("lora with its base frozen: no weight-gradient product, the same dA, dB and dx") {
  layer_values v;
  lora<double> layer(in, out, rank, alpha);
  auto dy = random_matrix<double>(rows, out, 7);
  matrix<double> y("y", rows, out), dx("dx", rows, in), dw("dw", out, in), da("da", rank, in), db("db", out, rank);
  matrix<double> dx_frozen("dx_frozen", rows, in), da_frozen("da_frozen", rank, in), db_frozen("db_frozen", out, rank);
  vector<double> dbias("dbias", out);
  auto cache = layer.make_cache(rows);
  layer.forward({v.w, v.bias, v.a, v.b}, v.x, y, cache);
  layer.backward({v.w, v.bias, v.a, v.b}, {dw, dbias, da, db}, cache, dy, dx);
  const std::size_t products = detail::weight_gradient_products;
  layer.backward({v.w, v.bias, v.a, v.b}, {{}, {}, da_frozen, db_frozen}, cache, dy, dx_frozen);
  CHECK(detail::weight_gradient_products == products);  // the base's dW = dy^T x did not run
  CHECK(to_vector(da_frozen) == to_vector(da));
  CHECK(to_vector(db_frozen) == to_vector(db));
  CHECK(to_vector(dx_frozen) == to_vector(dx));
}

TEST_CASE("a fresh adapter (B = 0) leaves the base's output, bit for bit") {
  layer_values v;
  matrix<double> zero_b("b", out, rank);
  lora<double> layer(in, out, rank, alpha);
  linear<double> base(in, out);
  matrix<double> y("y", rows, out), y_base("y_base", rows, out);
  auto cache = layer.make_cache(rows);
  auto base_cache = base.make_cache(rows);
  layer.forward({v.w, v.bias, v.a, zero_b}, v.x, y, cache);
  base.forward({v.w, v.bias}, v.x, y_base, base_cache);
  CHECK(to_vector(y) == to_vector(y_base));
}

TEST_CASE("lora refuses a rank of 0, an alpha of 0 or NaN, and an adapter of the wrong shape, naming it") {
  CHECK_THROWS_WITH_AS(lora<double>(4, 4, 0, 8), "kfsdp::nn::lora: rank is 0, expected at least 1", std::invalid_argument);
  CHECK_THROWS_WITH_AS(lora<double>(4, 4, 2, 0), doctest::Contains("alpha is 0"), std::invalid_argument);
  CHECK_THROWS_AS(lora<double>(4, 4, 2, std::nan("")), std::invalid_argument);
  layer_values v;
  lora<double> layer(in, out, rank + 1, alpha);
  matrix<double> y("y", rows, out);
  auto cache = layer.make_cache(rows);
  CHECK_THROWS_WITH_AS(layer.forward({v.w, v.bias, v.a, v.b}, v.x, y, cache),
                       "lora::forward: a has shape [3, 6], expected [4, 6]", std::invalid_argument);
}
