// Tests of include/kfsdp/nn/gelu.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/gelu.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;


TEST_CASE("gelu forward: the exact erf form") {
  matrix<double> x("x", 1, 3), y("y", 1, 3);
  set_entry(x, 0, 0.0), set_entry(x, 1, 1.0), set_entry(x, 2, -2.0);
  gelu<double> act(3);
  auto cache = act.make_cache(1);
  act.forward({}, x, y, cache);
  CHECK(entry(y, 0) == 0.0);
  CHECK(entry(y, 1) == doctest::Approx(0.8413447460685429));   // 0.5 (1 + erf(1/√2))
  CHECK(entry(y, 2) == doctest::Approx(-0.04550026389635842)); // -2 Φ(-2)
}

TEST_CASE("gelu backward matches central differences (double)") {
  gelu<double> act(6);
  auto x = random_matrix<double>(4, 6, 1);
  auto dy = random_matrix<double>(4, 6, 2);
  matrix<double> y("y", 4, 6), dx("dx", 4, 6);
  auto cache = act.make_cache(4);
  auto loss = [&] {
    act.forward({}, x, y, cache);
    return weighted_sum(y, dy);
  };
  loss();
  act.backward({}, {}, cache, dy, dx);
  check_gradient("dx", x, dx, loss);
}
