// Tests of reference/mse.hpp.
#include "../nn/nn_test_helpers.hpp"

#include <mse.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::reference;
using namespace kfsdp::nn::testing;

TEST_CASE("mse_loss forward and backward, by hand") {
  // differences [1, -2; 0, 3] → mean of squares (1 + 4 + 0 + 9) / 4 = 3.5
  matrix<double> pred("pred", 2, 2), target("target", 2, 2);
  set_entry(pred, 0, 1.0), set_entry(pred, 1, -1.0), set_entry(pred, 3, 5.0);
  set_entry(target, 1, 1.0), set_entry(target, 2, 0.0), set_entry(target, 3, 2.0);
  const mse_loss<double> mse(2);
  CHECK(mse.features() == 2);
  CHECK(mse.forward(pred, target) == doctest::Approx(3.5));
  matrix<double> dpred("dpred", 2, 2);
  mse.backward(pred, target, 0.5, dpred);  // 2 · d / 2 · 0.5 = d / 2
  CHECK(to_vector(dpred) == std::vector<double>{0.5, -1.0, 0.0, 1.5});
  CHECK(mse.forward(matrix<double>("none", 0, 2), matrix<double>("none", 0, 2)) == 0.0);
}

TEST_CASE("mse_loss backward with grad_scale 1/rows matches central differences") {
  const std::size_t rows = 5, features = 7;
  const mse_loss<double> mse(features);
  auto pred = random_matrix<double>(rows, features, 1);
  auto target = random_matrix<double>(rows, features, 2);
  auto loss = [&] { return mse.forward(pred, target); };
  matrix<double> dpred("dpred", rows, features);
  mse.backward(pred, target, 1.0 / rows, dpred);
  check_gradient("dpred", pred, dpred, loss);
}

TEST_CASE("mse_loss forward is reproducible and float agrees with double") {
  auto pred = random_matrix<float>(64, 33, 3);
  auto target = random_matrix<float>(64, 33, 4);
  const mse_loss<float> mse(33);
  const float first = mse.forward(pred, target);
  CHECK(mse.forward(pred, target) == first);  // bit for bit
  auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pred);
  auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), target);
  double sum = 0;
  for (std::size_t i = 0; i < p.span(); ++i)
    sum += (double(p.data()[i]) - double(t.data()[i])) * (double(p.data()[i]) - double(t.data()[i]));
  CHECK(first == doctest::Approx(sum / (64 * 33)).epsilon(1e-5));
}

TEST_CASE("mse_loss shape errors name the parameter") {
  const mse_loss<double> mse(4);
  matrix<double> pred("pred", 2, 4), target("target", 2, 3), dpred("dpred", 3, 4);
  CHECK_THROWS_WITH_AS(mse.forward(pred, target),
                       "mse_loss::forward: target has shape [2, 3], expected [2, 4]",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(mse.backward(pred, pred, 1.0, dpred),
                       "mse_loss::backward: dpred has shape [3, 4], expected [2, 4]",
                       std::invalid_argument);
  CHECK_THROWS_AS(mse_loss<double>(0), std::invalid_argument);
}
