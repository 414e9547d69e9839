// Tests for include/kfsdp/optim/adamw.hpp: several steps against a scalar loop written from
// PyTorch's torch.optim.AdamW (bit for bit in double and in float), the padding invariant,
// the step counter, bad input.
#include <doctest/doctest.h>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/clip.hpp>

#include "optim_test_support.hpp"

#include <cmath>

using namespace kfsdp::optim;
using namespace kfsdp::optim::test;

namespace {

// torch.optim.AdamW's _single_tensor path (amsgrad off), one "tensor op" per line: Python floats
// are doubles, cast to Scalar where they meet a tensor.
template <class Scalar>
struct reference_adamw {
  adamw_options options;
  std::vector<Scalar> params;
  std::vector<Scalar> exp_avg = std::vector<Scalar>(params.size(), Scalar(0));
  std::vector<Scalar> exp_avg_sq = std::vector<Scalar>(params.size(), Scalar(0));
  double step_t = 0;

  static Scalar lerp(Scalar self, Scalar end, Scalar weight) {  // ATen's lerp
    return std::abs(weight) < Scalar(0.5) ? self + weight * (end - self)
                                          : end - (end - self) * (Scalar(1) - weight);
  }

  void step(const std::vector<Scalar>& grads) {
    step_t += 1;
    const double lr = options.lr;
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i] = params[i] * static_cast<Scalar>(1 - lr * options.weight_decay);    // param.mul_(1 - lr * wd)
      exp_avg[i] = lerp(exp_avg[i], grads[i], static_cast<Scalar>(1 - options.beta1));  // exp_avg.lerp_(grad, 1 - beta1)
      exp_avg_sq[i] = exp_avg_sq[i] * static_cast<Scalar>(options.beta2);              // exp_avg_sq.mul_(beta2)
      exp_avg_sq[i] = exp_avg_sq[i] + static_cast<Scalar>(1 - options.beta2) * grads[i] * grads[i];  // .addcmul_
    }
    const double bias_correction1 = 1 - std::pow(options.beta1, step_t);
    const double bias_correction2 = 1 - std::pow(options.beta2, step_t);
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    for (std::size_t i = 0; i < params.size(); ++i) {
      Scalar denom = std::sqrt(exp_avg_sq[i]);                    // exp_avg_sq.sqrt()
      denom = denom / static_cast<Scalar>(bias_correction2_sqrt);  // / bias_correction2_sqrt
      denom = denom + static_cast<Scalar>(options.eps);            // .add_(eps)
      params[i] = params[i] + static_cast<Scalar>(-step_size) * exp_avg[i] / denom;  // addcdiv_(value=-step_size)
    }
  }
};

template <class Scalar>
void check_against_reference(const adamw_options& options) {
  constexpr std::size_t length = 41;
  reference_adamw<Scalar> reference{options, test_values<Scalar>(length, 3)};
  auto params = to_view(reference.params, "params");
  adamw<Scalar> optimizer(length, options);
  for (unsigned step = 1; step <= 6; ++step) {
    const auto grads = test_values<Scalar>(length, 200 + step);
    reference.step(grads);
    optimizer.step(params, to_view(grads, "grads"));
    CAPTURE(step);
    CHECK(optimizer.step_count() == step);
    std::size_t mismatches = 0;
    const auto result = to_vector(params);
    for (std::size_t i = 0; i < length; ++i) mismatches += result[i] != reference.params[i];
    CHECK(mismatches == 0);
    CHECK(to_vector(optimizer.exp_avg()) == reference.exp_avg);
    CHECK(to_vector(optimizer.exp_avg_sq()) == reference.exp_avg_sq);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("adamw matches PyTorch's formulas exactly over several steps", Scalar, double, float) {
  SUBCASE("defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 1e-2)") {
    check_against_reference<Scalar>({});
  }
  SUBCASE("no weight decay") { check_against_reference<Scalar>({.lr = 3e-4, .weight_decay = 0}); }
  SUBCASE("GPT-style") {
    check_against_reference<Scalar>({.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
  }
  SUBCASE("beta1 < 0.5 takes lerp's other branch") {
    check_against_reference<Scalar>({.lr = 1e-2, .beta1 = 0.3, .beta2 = 0.5, .eps = 1e-6});
  }
}

TEST_CASE_TEMPLATE("adamw with grad_scale: the same bits as scaling the gradients first", Scalar, double, float) {
  constexpr std::size_t length = 41;
  const adamw_options options{.lr = 1e-2, .weight_decay = 0.1};
  const auto start = test_values<Scalar>(length, 3);
  auto fused = to_view(start, "fused"), separate = to_view(start, "separate");
  adamw<Scalar> fused_optimizer(length, options), separate_optimizer(length, options);
  for (unsigned step = 1; step <= 4; ++step) {
    const double scale = 0.3 + 0.1 * step;  // clip_scale's factor
    const auto grads = to_view(test_values<Scalar>(length, 200 + step), "grads");
    fused_optimizer.step(fused, grads, scale);
    scale_in_place(grads, scale);  // clipping as its own pass: KokkosBlas::scal, scale · g
    separate_optimizer.step(separate, grads);
    CAPTURE(step);
    CHECK(to_vector(fused) == to_vector(separate));
    CHECK(to_vector(fused_optimizer.exp_avg_sq()) == to_vector(separate_optimizer.exp_avg_sq()));
  }
}

TEST_CASE("adamw: the first step moves every parameter by about lr") {
  // After one step m/sqrt(v) = g/|g| (bias-corrected), so p moves by lr * sign(g), less decay.
  auto params = to_view(std::vector<double>{1.0, -2.0, 0.0});
  adamw<double> optimizer(3, {.lr = 0.01, .weight_decay = 0});
  optimizer.step(params, to_view(std::vector<double>{0.3, -5.0, 1e-3}));
  const auto result = to_vector(params);
  CHECK(result[0] == doctest::Approx(0.99).epsilon(1e-9));
  CHECK(result[1] == doctest::Approx(-1.99).epsilon(1e-9));
  CHECK(result[2] == doctest::Approx(-0.01).epsilon(1e-4));
}

TEST_CASE_TEMPLATE("adamw keeps zero padding at zero, with weight decay on", Scalar, double, float) {
  auto values = test_values<Scalar>(12, 9);
  for (std::size_t i = 9; i < 12; ++i) values[i] = 0;
  auto params = to_view(values);
  adamw<Scalar> optimizer(12, {.lr = 0.1, .weight_decay = 0.5});
  for (unsigned step = 0; step < 20; ++step) {
    auto grads = test_values<Scalar>(12, 70 + step);
    for (std::size_t i = 9; i < 12; ++i) grads[i] = 0;
    optimizer.step(params, to_view(grads));
  }
  const auto result = to_vector(params);
  const auto first = to_vector(optimizer.exp_avg());
  const auto second = to_vector(optimizer.exp_avg_sq());
  for (std::size_t i = 9; i < 12; ++i) {
    CHECK(result[i] == 0);
    CHECK_FALSE(std::signbit(result[i]));
    CHECK(first[i] == 0);
    CHECK(second[i] == 0);
  }
  CHECK(result[0] != values[0]);
}

TEST_CASE("adamw: the step counter and resuming from a checkpoint") {
  const auto grads = test_values<double>(5, 11);
  auto straight = to_view(test_values<double>(5, 12));
  adamw<double> optimizer(5);
  for (int step = 0; step < 3; ++step) optimizer.step(straight, to_view(grads));
  CHECK(optimizer.step_count() == 3);

  // The same three steps done by the free function with explicit step numbers.
  auto manual = to_view(test_values<double>(5, 12));
  Kokkos::View<double*> exp_avg("exp_avg", 5), exp_avg_sq("exp_avg_sq", 5);
  for (std::int64_t step = 1; step <= 3; ++step)
    adamw_step<double>(manual, to_view(grads), exp_avg, exp_avg_sq, {}, step);
  CHECK(to_vector(manual) == to_vector(straight));

  // Resume: restored moments and counter continue exactly as if never stopped.
  adamw<double> resumed(5);
  Kokkos::deep_copy(resumed.exp_avg(), optimizer.exp_avg());
  Kokkos::deep_copy(resumed.exp_avg_sq(), optimizer.exp_avg_sq());
  resumed.set_step_count(3);
  auto copy = to_view(to_vector(straight));
  optimizer.step(straight, to_view(grads));
  resumed.step(copy, to_view(grads));
  CHECK(to_vector(copy) == to_vector(straight));
  CHECK(resumed.step_count() == 4);
}

TEST_CASE("adamw rejects bad input, naming the parameter and the value") {
  auto params = to_view(std::vector<double>(8, 1.0));
  auto grads = to_view(std::vector<double>(8, 1.0));
  Kokkos::View<double*> exp_avg("exp_avg", 8), exp_avg_sq("exp_avg_sq", 6);
  CHECK(invalid_argument_message([&] { adamw_step<double>(params, grads, exp_avg, exp_avg_sq, {}, 1); }) ==
        "adamw_step: exp_avg_sq has 6 elements, expected 8 (the length of params)");
  CHECK(invalid_argument_message([&] {
          adamw_step<double>(params, to_view(std::vector<double>(9)), exp_avg, exp_avg, {}, 1);
        }) == "adamw_step: grads has 9 elements, expected 8 (the length of params)");
  CHECK(invalid_argument_message([&] { adamw_step<double>(params, grads, exp_avg, exp_avg, {}, 0); }) ==
        "adamw_step: step = 0, expected step >= 1 (steps count from 1)");
  CHECK(invalid_argument_message([] { adamw<double>(8, {.lr = -1e-3}); }) ==
        "adamw: lr = -0.001, expected a finite lr >= 0");
  CHECK(invalid_argument_message([] { adamw<double>(8, {.beta1 = 1.0}); }) ==
        "adamw: beta1 = 1, expected 0 <= beta1 < 1");
  CHECK(invalid_argument_message([] { adamw<double>(8, {.beta2 = -0.1}); }) ==
        "adamw: beta2 = -0.1, expected 0 <= beta2 < 1");
  CHECK(invalid_argument_message([] { adamw<double>(8, {.beta2 = 1.5}); }) ==
        "adamw: beta2 = 1.5, expected 0 <= beta2 < 1");
  CHECK(invalid_argument_message([] { adamw<double>(8, {.eps = -1e-8}); }) ==
        "adamw: eps = -1e-08, expected a finite eps >= 0");
  CHECK(invalid_argument_message([] { adamw<double>(8, {.weight_decay = std::nan("")}); }) ==
        "adamw: weight_decay = nan, expected a finite weight_decay >= 0");
  adamw<float> optimizer(8);
  CHECK(invalid_argument_message([&] {
          optimizer.step(to_view(std::vector<float>(8)), to_view(std::vector<float>(2)));
        }) == "adamw_step: grads has 2 elements, expected 8 (the length of params)");
  CHECK(optimizer.step_count() == 0);  // a rejected step does not count
  CHECK(invalid_argument_message([&] { optimizer.set_step_count(-1); }) ==
        "adamw::set_step_count: steps = -1, expected steps >= 0");
}
