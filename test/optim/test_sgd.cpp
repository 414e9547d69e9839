// Tests for include/kfsdp/optim/sgd.hpp: several steps against a scalar loop written from PyTorch's
// torch.optim.SGD (bit for bit in double and in float), the padding invariant, bad input.
#include <doctest/doctest.h>
#include <kfsdp/optim/clip.hpp>
#include <kfsdp/optim/sgd.hpp>

#include "optim_test_support.hpp"

#include <cmath>
#include <optional>

using namespace kfsdp::optim;
using namespace kfsdp::optim::test;

namespace {

// torch.optim.SGD._single_tensor_sgd with dampening 0, one "tensor op" per line (each rounds).
template <class Scalar>
struct reference_sgd {
  sgd_options options;
  std::vector<Scalar> params;
  std::optional<std::vector<Scalar>> momentum_buffer;  // None before the first step

  void step(const std::vector<Scalar>& grads) {
    const auto lr = static_cast<Scalar>(options.lr);
    const auto momentum = static_cast<Scalar>(options.momentum);
    const auto weight_decay = static_cast<Scalar>(options.weight_decay);
    std::vector<Scalar> d_p = grads;
    if (options.weight_decay != 0)
      for (std::size_t i = 0; i < d_p.size(); ++i) d_p[i] = d_p[i] + weight_decay * params[i];  // grad.add(param, alpha=wd)
    if (options.momentum != 0) {
      if (!momentum_buffer) {
        momentum_buffer = d_p;  // torch.clone(grad).detach()
      } else {
        for (std::size_t i = 0; i < d_p.size(); ++i)
          (*momentum_buffer)[i] = (*momentum_buffer)[i] * momentum + Scalar(1) * d_p[i];  // mul_(m).add_(g, alpha=1)
      }
      for (std::size_t i = 0; i < d_p.size(); ++i)
        d_p[i] = options.nesterov ? d_p[i] + momentum * (*momentum_buffer)[i] : (*momentum_buffer)[i];
    }
    for (std::size_t i = 0; i < d_p.size(); ++i) params[i] = params[i] + (-lr) * d_p[i];  // add_(d_p, alpha=-lr)
  }
};

template <class Scalar>
void check_against_reference(const sgd_options& options) {
  constexpr std::size_t length = 37;
  reference_sgd<Scalar> reference{options, test_values<Scalar>(length, 1), std::nullopt};
  auto params = to_view(reference.params, "params");
  sgd<Scalar> optimizer(length, options);
  for (unsigned step = 0; step < 6; ++step) {
    const auto grads = test_values<Scalar>(length, 100 + step);
    reference.step(grads);
    optimizer.step(params, to_view(grads, "grads"));
    const auto result = to_vector(params);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < length; ++i) mismatches += result[i] != reference.params[i];
    CAPTURE(step);
    CHECK(mismatches == 0);
    if (options.momentum != 0) CHECK(to_vector(optimizer.momentum_buffer()) == *reference.momentum_buffer);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("sgd matches PyTorch's formulas exactly over several steps", Scalar, double, float) {
  SUBCASE("plain") { check_against_reference<Scalar>({.lr = 0.1}); }
  SUBCASE("weight decay") { check_against_reference<Scalar>({.lr = 0.05, .weight_decay = 0.01}); }
  SUBCASE("momentum") { check_against_reference<Scalar>({.lr = 0.1, .momentum = 0.9}); }
  SUBCASE("momentum, weight decay, nesterov") {
    check_against_reference<Scalar>({.lr = 0.02, .momentum = 0.8, .weight_decay = 1e-3, .nesterov = true});
  }
}

TEST_CASE_TEMPLATE("sgd with grad_scale: the same bits as scaling the gradients first", Scalar, double, float) {
  constexpr std::size_t length = 41;
  const sgd_options options{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  const auto start = test_values<Scalar>(length, 3);
  auto fused = to_view(start, "fused"), separate = to_view(start, "separate");
  sgd<Scalar> fused_optimizer(length, options), separate_optimizer(length, options);
  for (unsigned step = 1; step <= 4; ++step) {
    const double scale = 0.3 + 0.1 * step;
    const auto grads = to_view(test_values<Scalar>(length, 200 + step), "grads");
    fused_optimizer.step(fused, grads, scale);
    scale_in_place(grads, scale);
    separate_optimizer.step(separate, grads);
    CAPTURE(step);
    CHECK(to_vector(fused) == to_vector(separate));
  }
}

TEST_CASE("sgd: one step by hand") {
  // p = 1, g = 0.5, wd = 0.1: d = 0.5 + 0.1 = 0.6; buf = 0.6; p = 1 - 0.1 * 0.6 = 0.94
  auto params = to_view(std::vector<double>{1.0});
  sgd<double> optimizer(1, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
  optimizer.step(params, to_view(std::vector<double>{0.5}));
  CHECK(to_vector(params)[0] == doctest::Approx(0.94).epsilon(1e-15));
  CHECK(to_vector(optimizer.momentum_buffer())[0] == doctest::Approx(0.6).epsilon(1e-15));
}

TEST_CASE_TEMPLATE("sgd keeps zero padding at zero, with weight decay and momentum", Scalar, double, float) {
  // A shard whose last 3 rows are padding: zero parameters and zero gradients.
  auto values = test_values<Scalar>(10, 7);
  for (std::size_t i = 7; i < 10; ++i) values[i] = 0;
  auto params = to_view(values);
  sgd<Scalar> optimizer(10, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5, .nesterov = true});
  for (unsigned step = 0; step < 20; ++step) {
    auto grads = test_values<Scalar>(10, 50 + step);
    for (std::size_t i = 7; i < 10; ++i) grads[i] = 0;
    optimizer.step(params, to_view(grads));
  }
  const auto result = to_vector(params);
  const auto buffer = to_vector(optimizer.momentum_buffer());
  for (std::size_t i = 7; i < 10; ++i) {
    CHECK(result[i] == 0);
    CHECK_FALSE(std::signbit(result[i]));
    CHECK(buffer[i] == 0);
  }
  CHECK(result[0] != values[0]);  // the real rows did move
}

TEST_CASE("sgd rejects bad input, naming the parameter and the value") {
  auto params = to_view(std::vector<double>(8, 1.0));
  auto grads = to_view(std::vector<double>(7, 1.0));
  auto buffer = to_view(std::vector<double>(8, 0.0));
  CHECK(invalid_argument_message([&] { sgd_step<double>(params, grads, buffer, {.lr = 0.1}); }) ==
        "sgd_step: grads has 7 elements, expected 8 (the length of params)");
  auto short_buffer = to_view(std::vector<double>(3, 0.0));
  CHECK(invalid_argument_message([&] {
          sgd_step<double>(params, to_view(std::vector<double>(8)), short_buffer, {.lr = 0.1, .momentum = 0.9});
        }) == "sgd_step: momentum_buffer has 3 elements, expected 8 (the length of params)");
  CHECK(invalid_argument_message([] { sgd<double>(8, {.lr = -0.1}); }) ==
        "sgd: lr = -0.1, expected a finite lr >= 0");
  CHECK(invalid_argument_message([] { sgd<double>(8, {.lr = std::nan("")}); }) ==
        "sgd: lr = nan, expected a finite lr >= 0");
  CHECK(invalid_argument_message([] { sgd<double>(8, {.momentum = -0.5}); }) ==
        "sgd: momentum = -0.5, expected a finite momentum >= 0");
  CHECK(invalid_argument_message([] { sgd<double>(8, {.weight_decay = -1}); }) ==
        "sgd: weight_decay = -1, expected a finite weight_decay >= 0");
  CHECK(invalid_argument_message([] { sgd<double>(8, {.nesterov = true}); }).starts_with(
      "sgd: nesterov = true with momentum = 0, expected momentum > 0"));
  sgd<double> optimizer(8);
  CHECK(invalid_argument_message([&] { optimizer.step(to_view(std::vector<double>(9)), to_view(std::vector<double>(9))); }) ==
        "sgd::step: params has 9 elements, expected 8 (the length of shard_size)");
  CHECK(invalid_argument_message([&] { optimizer.set_lr(-1); }) == "sgd::set_lr: lr = -1, expected a finite lr >= 0");
  CHECK(optimizer.options().lr == 1e-3);  // unchanged after the rejected set_lr
}
