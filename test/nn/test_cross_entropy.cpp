// Tests of include/kfsdp/nn/cross_entropy.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/cross_entropy.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

TEST_CASE("cross_entropy forward, by hand") {
  // logits [0, ln 2, ln 3] → softmax [1/6, 2/6, 3/6]; target 1 → loss ln 3
  matrix<double> logits("logits", 2, 3);
  set_entry(logits, 1, std::log(2.0)), set_entry(logits, 2, std::log(3.0));
  // second row all zero, target 0 → ln 3 as well
  cross_entropy<double> ce(3);
  auto cache = ce.make_cache(2);
  const double loss = ce.forward(logits, ids_from({1, 0}), cache);
  CHECK(loss == doctest::Approx(std::log(3.0)));
  matrix<double> dlogits("dlogits", 2, 3);
  ce.backward(cache, 0.5, dlogits);
  CHECK(entry(dlogits, 0) == doctest::Approx(0.5 / 6));
  CHECK(entry(dlogits, 1) == doctest::Approx(0.5 * (2.0 / 6 - 1)));
}

TEST_CASE("cross_entropy backward with grad_scale 1/N matches central differences") {
  const std::size_t rows = 5, classes = 7;
  cross_entropy<double> ce(classes);
  auto logits = random_matrix<double>(rows, classes, 1);
  auto targets = ids_from({0, 6, 3, 3, 2});
  auto cache = ce.make_cache(rows);
  auto loss = [&] { return ce.forward(logits, targets, cache); };
  loss();
  matrix<double> dlogits("dlogits", rows, classes);
  ce.backward(cache, 1.0 / rows, dlogits);
  check_gradient("dlogits", logits, dlogits, loss);
}

TEST_CASE("cross_entropy rejects a target out of range") {
  cross_entropy<double> ce(3);
  matrix<double> logits("logits", 1, 3);
  auto cache = ce.make_cache(1);
  CHECK_THROWS_AS(ce.forward(logits, ids_from({3}), cache), std::out_of_range);
}
