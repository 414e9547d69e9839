// Tests of reference/layer_norm.hpp.
#include "../nn/nn_test_helpers.hpp"

#include <layer_norm.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::reference;
using namespace kfsdp::nn::testing;


TEST_CASE("layer_norm forward, by hand") {
  // x = [1, 2, 3, 6]: mean 3, var (4 + 1 + 0 + 9) / 4 = 3.5
  matrix<double> x("x", 1, 4), y("y", 1, 4);
  for (int i = 0; i < 4; ++i) set_entry(x, i, std::vector<double>{1, 2, 3, 6}[i]);
  vector<double> w("w", 4), b("b", 4);
  Kokkos::deep_copy(w, 2.0);
  Kokkos::deep_copy(b, 0.5);
  layer_norm<double> ln(4);
  auto cache = ln.make_cache(1);
  ln.forward({w, b}, x, y, cache);
  const double rstd = 1 / std::sqrt(3.5 + 1e-5);
  CHECK(entry(cache.mean, 0) == doctest::Approx(3.0));
  CHECK(entry(cache.rstd, 0) == doctest::Approx(rstd));
  CHECK(entry(y, 0) == doctest::Approx(-2 * rstd * 2 + 0.5));
  CHECK(entry(y, 3) == doctest::Approx(3 * rstd * 2 + 0.5));
}

TEST_CASE("layer_norm backward matches central differences (double)") {
  const std::size_t rows = 5, features = 7;
  layer_norm<double> ln(features);
  auto x = random_matrix<double>(rows, features, 1);
  auto w = random_vector<double>(features, 2);
  auto b = random_vector<double>(features, 3);
  auto dy = random_matrix<double>(rows, features, 4);
  matrix<double> y("y", rows, features), dx("dx", rows, features);
  vector<double> dw("dw", features), db("db", features);
  auto cache = ln.make_cache(rows);
  auto loss = [&] {
    ln.forward({w, b}, x, y, cache);
    return weighted_sum(y, dy);
  };
  loss();
  ln.backward({w, b}, {dw, db}, cache, dy, dx);
  check_gradient("dx", x, dx, loss);
  check_gradient("dweight", w, dw, loss);
  check_gradient("dbias", b, db, loss);
}

TEST_CASE("layer_norm rejects a weight of the wrong size") {
  layer_norm<double> ln(4);
  matrix<double> x("x", 2, 4), y("y", 2, 4);
  vector<double> w("w", 3), b("b", 4);
  auto cache = ln.make_cache(2);
  CHECK_THROWS_WITH_AS(ln.forward({w, b}, x, y, cache),
                       "layer_norm::forward: weight has shape [3], expected [4]",
                       std::invalid_argument);
}
