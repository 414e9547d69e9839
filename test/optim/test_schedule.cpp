// Tests for include/kfsdp/optim/schedule.hpp: each schedule at its boundaries and in the middle
// against PyTorch's closed forms, composition, the type-erased holder, the error messages.
#include <doctest/doctest.h>
#include <kfsdp/optim/schedule.hpp>

#include "optim_test_support.hpp"

#include <cmath>
#include <numbers>

using namespace kfsdp::optim;
using kfsdp::optim::test::invalid_argument_message;

namespace {
// CosineAnnealingLR's closed form, written out again.
double cosine_closed_form(double base, double min, double t, double steps) {
  return min + (base - min) * (1 + std::cos(std::numbers::pi * t / steps)) / 2;
}
}  // namespace

TEST_CASE("constant: the same lr at every step") {
  const constant lr(3e-4);
  CHECK(lr(0) == 3e-4);
  CHECK(lr(123456) == 3e-4);
}

TEST_CASE("cosine: base at 0, the mean at T/2, min at T and after") {
  const cosine lr(1e-3, 1000, 1e-5);
  CHECK(lr(0) == 1e-3);
  CHECK(lr(500) == doctest::Approx(0.5 * (1e-3 + 1e-5)).epsilon(1e-14));
  CHECK(lr(250) == cosine_closed_form(1e-3, 1e-5, 250, 1000));
  CHECK(lr(999) == cosine_closed_form(1e-3, 1e-5, 999, 1000));
  CHECK(lr(999) > 1e-5);
  CHECK(lr(1000) == 1e-5);
  CHECK(lr(5000) == 1e-5);  // clamped, not PyTorch's periodic continuation
  CHECK(cosine(1.0, 4)(2) == doctest::Approx(0.5).epsilon(1e-15));  // min_lr defaults to 0
}

TEST_CASE("linear: start at 0, halfway at T/2, end at T and after") {
  const linear decay(1e-3, 0.0, 100);
  CHECK(decay(0) == 1e-3);
  CHECK(decay(50) == doctest::Approx(5e-4).epsilon(1e-15));
  CHECK(decay(25) == 1e-3 + (0.0 - 1e-3) * 25.0 / 100.0);
  CHECK(decay(100) == 0.0);
  CHECK(decay(101) == 0.0);
  const linear ramp(0.0, 2.0, 4);
  CHECK(ramp(1) == 0.5);
  CHECK(ramp(4) == 2.0);
}

TEST_CASE("step_decay: gamma every period steps, as StepLR") {
  const step_decay lr(0.1, 30, 0.5);
  CHECK(lr(0) == 0.1);
  CHECK(lr(29) == 0.1);
  CHECK(lr(30) == 0.1 * 0.5);
  CHECK(lr(59) == 0.1 * 0.5);
  CHECK(lr(60) == 0.1 * std::pow(0.5, 2.0));
  CHECK(lr(95) == 0.1 * std::pow(0.5, 3.0));
}

TEST_CASE("warmup: (t + 1)/W of the next schedule's first lr, then the next schedule from its step 0") {
  const auto lr = warmup(4, cosine(1.0, 10, 0.1));
  CHECK(lr(0) == 0.25);
  CHECK(lr(1) == 0.5);
  CHECK(lr(3) == 1.0);  // the peak on the warm-up's last step
  CHECK(lr(4) == 1.0);  // cosine's step 0
  CHECK(lr(9) == cosine_closed_form(1.0, 0.1, 5, 10));
  CHECK(lr(14) == 0.1);
  CHECK(lr(100) == 0.1);
}

TEST_CASE("warmup_cosine and warmup_linear: warm-up then decay ending at total_steps") {
  const auto cos = warmup_cosine(6e-4, 100, 1100, 6e-5);
  CHECK(cos(0) == 6e-4 / 100);
  CHECK(cos(99) == 6e-4);
  CHECK(cos(600) == cosine_closed_form(6e-4, 6e-5, 500, 1000));
  CHECK(cos(1100) == 6e-5);
  const auto lin = warmup_linear(1e-3, 10, 110);
  CHECK(lin(4) == 1e-3 * 5 / 10);
  CHECK(lin(60) == doctest::Approx(5e-4).epsilon(1e-15));
  CHECK(lin(110) == 0.0);
}

TEST_CASE("sequence and the type-erased schedule compose") {
  // constant for 10 steps, then step decay, then a linear tail to 0
  const auto lr = sequence(constant(1.0), 10, sequence(step_decay(0.5, 5, 0.1), 10, linear(0.05, 0.0, 10)));
  CHECK(lr(0) == 1.0);
  CHECK(lr(9) == 1.0);
  CHECK(lr(10) == 0.5);
  CHECK(lr(15) == 0.5 * 0.1);
  CHECK(lr(20) == 0.05);
  CHECK(lr(25) == doctest::Approx(0.025).epsilon(1e-15));
  CHECK(lr(30) == 0.0);
  schedule chosen = lr;
  CHECK(chosen(15) == lr(15));
  chosen = warmup(2, constant(1.0));
  CHECK(chosen(0) == 0.5);
}

TEST_CASE("bad arguments name the argument, the value seen and the expectation") {
  CHECK(invalid_argument_message([] { constant(-0.1); }) == "constant: lr = -0.1, expected a finite lr >= 0");
  CHECK(invalid_argument_message([] { constant(std::nan("")); }) == "constant: lr = nan, expected a finite lr >= 0");
  CHECK(invalid_argument_message([] { cosine(1e-3, 0); }) == "cosine: steps = 0, expected steps >= 1");
  CHECK(invalid_argument_message([] { cosine(1e-3, 10, -1.0); }) ==
        "cosine: min_lr = -1, expected a finite min_lr >= 0");
  CHECK(invalid_argument_message([] { cosine(1e-3, 10, 0.1); }) ==
        "cosine: min_lr = 0.1, expected min_lr <= base_lr = 0.001 (a decay)");
  CHECK(invalid_argument_message([] { linear(1.0, -1.0, 5); }) ==
        "linear: end_lr = -1, expected a finite end_lr >= 0");
  CHECK(invalid_argument_message([] { linear(1.0, 0.0, 0); }) == "linear: steps = 0, expected steps >= 1");
  CHECK(invalid_argument_message([] { step_decay(0.1, 0, 0.5); }) == "step_decay: period = 0, expected period >= 1");
  CHECK(invalid_argument_message([] { step_decay(0.1, 10, 0.0); }) ==
        "step_decay: gamma = 0, expected a finite gamma > 0");
  CHECK(invalid_argument_message([] { warmup(0, constant(1.0)); }) == "warmup: steps = 0, expected steps >= 1");
  CHECK(invalid_argument_message([] { sequence(constant(1.0), 0, constant(2.0)); }) ==
        "sequence: length = 0, expected length >= 1");
  CHECK(invalid_argument_message([] { warmup_cosine(1e-3, 100, 100); }) ==
        "warmup_cosine: warmup_steps = 100, expected warmup_steps < total_steps = 100 (steps left to decay)");
  CHECK(invalid_argument_message([] { warmup_linear(1e-3, 200, 100); }) ==
        "warmup_linear: warmup_steps = 200, expected warmup_steps < total_steps = 100 (steps left to decay)");
}
