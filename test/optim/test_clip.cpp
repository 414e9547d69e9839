// Tests for include/kfsdp/optim/clip.hpp: local squared norms that add up to the global one, the
// PyTorch clip coefficient, padding that adds nothing, bad input.
#include <doctest/doctest.h>
#include <kfsdp/optim/clip.hpp>

#include "optim_test_support.hpp"

#include <cmath>
#include <limits>

using namespace kfsdp::optim;
using namespace kfsdp::optim::test;

TEST_CASE_TEMPLATE("local_squared_norm is the sum of squares, accumulated in double", Scalar, double, float) {
  const auto values = test_values<Scalar>(1000, 5);
  double expected = 0;
  for (const Scalar value : values) expected += static_cast<double>(value) * static_cast<double>(value);
  const double squared = local_squared_norm(to_view(values));
  CHECK(squared == doctest::Approx(expected).epsilon(1e-13));
  // A const view works as well as a mutable one.
  const Kokkos::View<const Scalar*> read_only = to_view(values);
  CHECK(local_squared_norm(read_only) == squared);
  CHECK(local_squared_norm(Kokkos::View<Scalar*>("empty", 0)) == 0.0);
}

TEST_CASE("two ranks' local squared norms add up to the global norm; padding adds nothing") {
  const auto full = test_values<double>(11, 6);  // a parameter of 11 rows over 2 ranks: 6 + (5 + 1 pad)
  std::vector<double> rank_0(full.begin(), full.begin() + 6);
  std::vector<double> rank_1(full.begin() + 6, full.end());
  rank_1.push_back(0.0);  // the padding row
  const double global_squared = local_squared_norm(to_view(rank_0)) + local_squared_norm(to_view(rank_1));
  CHECK(global_squared == doctest::Approx(local_squared_norm(to_view(full))).epsilon(1e-15));
  rank_1.pop_back();
  CHECK(local_squared_norm(to_view(rank_1)) + local_squared_norm(to_view(rank_0)) == global_squared);
}

TEST_CASE("clip_scale is PyTorch's clip_grad_norm_ coefficient") {
  CHECK(clip_scale(10.0, 1.0) == 1.0 / (10.0 + 1e-6));
  CHECK(clip_scale(0.5, 1.0) == 1.0);
  CHECK(clip_scale(1.0, 1.0) == 1.0 / (1.0 + 1e-6));  // just below 1: PyTorch clips at the limit too
  CHECK(clip_scale(2.0, 1.0) == doctest::Approx(0.5));
  CHECK(clip_scale(0.0, 1.0) == 1.0);
  CHECK(clip_scale(3.0, 0.0) == 0.0);
}

TEST_CASE_TEMPLATE("scale_in_place multiplies every element", Scalar, double, float) {
  const auto values = test_values<Scalar>(20, 8);
  auto view = to_view(values);
  scale_in_place(view, 0.25);
  const auto scaled = to_vector(view);
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(scaled[i] == values[i] * Scalar(0.25));
  scale_in_place(view, 1.0);
  CHECK(to_vector(view) == scaled);
}

TEST_CASE("clip_scale rejects bad input, naming the parameter and the value") {
  CHECK(invalid_argument_message([] { (void)clip_scale(1.0, -1.0); }) ==
        "clip_scale: max_norm = -1, expected max_norm >= 0");
  CHECK(invalid_argument_message([] { (void)clip_scale(std::nan(""), 1.0); })
            .starts_with("clip_scale: global_norm = nan, expected a finite norm >= 0"));
  CHECK(invalid_argument_message([] { (void)clip_scale(std::numeric_limits<double>::infinity(), 1.0); })
            .starts_with("clip_scale: global_norm = inf, expected a finite norm >= 0"));
  CHECK(invalid_argument_message([] { (void)clip_scale(-2.0, 1.0); })
            .starts_with("clip_scale: global_norm = -2, expected"));
}
