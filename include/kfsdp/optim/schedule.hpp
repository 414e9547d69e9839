#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::optim schedules — learning rates as values: a schedule maps the step about to run
// (0-based) to its lr, `double operator()(std::size_t step) const`. Header-only, no Kokkos.
//
//   auto lr = kfsdp::optim::warmup(100, kfsdp::optim::cosine(6e-4, 4900, /*min_lr=*/6e-5));
//   for (std::size_t step = 0; step < 5000; ++step) {
//     optimizer.set_lr(lr(step));
//     trainer.step({{x, y}}, optimizer);
//   }
//
// The closed forms, PyTorch's (t the step, T the schedule's steps):
//   constant     lr
//   cosine       min + (base - min)(1 + cos(pi t/T))/2      CosineAnnealingLR's closed form; t >= T: min
//   linear       start + (end - start) min(t, T)/T          LinearLR, with start/end as lrs, not factors
//   step_decay   base gamma^floor(t/N)                       StepLR(step_size = N, gamma)
//   warmup       after(0) (t + 1)/W for t < W, then after(t - W)
//                                                            LinearLR(start_factor = 1/W, total_iters = W - 1)
//   sequence     first(t) for t < n, then second(t - n)      SequentialLR(milestones = [n])
// Every schedule is a small value type; `schedule` holds any of them when the type is chosen at run time.

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <numbers>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace kfsdp::optim {

/// Any schedule, type-erased (e.g. chosen from a command line):
///   kfsdp::optim::schedule lr = kfsdp::optim::constant(1e-3);
using schedule = std::function<double(std::size_t)>;

namespace detail {
// Negated comparison so that NaN is rejected too.
inline void check_lr(std::string_view who, std::string_view name, double lr) {
  if (!(lr >= 0.0) || std::isinf(lr))
    throw std::invalid_argument(fmt::format("{}: {} = {}, expected a finite {} >= 0", who, name, lr, name));
}
inline void check_steps(std::string_view who, std::string_view name, std::size_t steps) {
  if (steps == 0) throw std::invalid_argument(fmt::format("{}: {} = 0, expected {} >= 1", who, name, name));
}
}  // namespace detail

/// The same lr at every step.
///
///   kfsdp::optim::constant lr(3e-4);   // lr(0) == lr(1000) == 3e-4
KFSDP_EXPORT class constant {
 public:
  explicit constant(double lr) : lr_(lr) { detail::check_lr("constant", "lr", lr); }
  double operator()(std::size_t) const noexcept { return lr_; }

 private:
  double lr_;
};

/// Cosine decay from base_lr to min_lr over `steps` steps (PyTorch's CosineAnnealingLR closed form,
/// T_max = steps, eta_min = min_lr); it stays at min_lr from step `steps` on (PyTorch's would rise again).
///
///   kfsdp::optim::cosine lr(1e-3, 1000, 1e-5);   // lr(0) = 1e-3, lr(500) = 5.05e-4, lr(1000) = 1e-5
KFSDP_EXPORT class cosine {
 public:
  cosine(double base_lr, std::size_t steps, double min_lr = 0.0) : base_(base_lr), min_(min_lr), steps_(steps) {
    detail::check_lr("cosine", "base_lr", base_lr);
    detail::check_lr("cosine", "min_lr", min_lr);
    detail::check_steps("cosine", "steps", steps);
    if (min_lr > base_lr)
      throw std::invalid_argument(
          fmt::format("cosine: min_lr = {}, expected min_lr <= base_lr = {} (a decay)", min_lr, base_lr));
  }
  double operator()(std::size_t step) const noexcept {
    if (step >= steps_) return min_;
    return min_ + (base_ - min_) * (1.0 + std::cos(std::numbers::pi * double(step) / double(steps_))) / 2.0;
  }

 private:
  double base_, min_;
  std::size_t steps_;
};

/// Linear from start_lr to end_lr over `steps` steps, then end_lr (PyTorch's LinearLR with the
/// factors times the base lr): a decay when end_lr < start_lr, a ramp when end_lr > start_lr.
///
///   kfsdp::optim::linear lr(1e-3, 0.0, 100);   // lr(0) = 1e-3, lr(50) = 5e-4, lr(100) = lr(200) = 0
KFSDP_EXPORT class linear {
 public:
  linear(double start_lr, double end_lr, std::size_t steps) : start_(start_lr), end_(end_lr), steps_(steps) {
    detail::check_lr("linear", "start_lr", start_lr);
    detail::check_lr("linear", "end_lr", end_lr);
    detail::check_steps("linear", "steps", steps);
  }
  double operator()(std::size_t step) const noexcept {
    const std::size_t t = step < steps_ ? step : steps_;
    return start_ + (end_ - start_) * double(t) / double(steps_);
  }

 private:
  double start_, end_;
  std::size_t steps_;
};

/// base_lr times gamma every `period` steps (PyTorch's StepLR, step_size = period).
///
///   kfsdp::optim::step_decay lr(0.1, 30, 0.1);   // 0.1 for steps 0..29, 0.01 for 30..59, ...
KFSDP_EXPORT class step_decay {
 public:
  step_decay(double base_lr, std::size_t period, double gamma) : base_(base_lr), gamma_(gamma), period_(period) {
    detail::check_lr("step_decay", "base_lr", base_lr);
    detail::check_steps("step_decay", "period", period);
    if (!(gamma > 0.0) || std::isinf(gamma))
      throw std::invalid_argument(fmt::format("step_decay: gamma = {}, expected a finite gamma > 0", gamma));
  }
  double operator()(std::size_t step) const noexcept {
    return base_ * std::pow(gamma_, double(step / period_));
  }

 private:
  double base_, gamma_;
  std::size_t period_;
};

/// `first` for steps 0..length-1, then `second` restarted at 0 (PyTorch's SequentialLR, one milestone).
/// Nest it for more phases: sequence(a, 10, sequence(b, 20, c)).
///
///   kfsdp::optim::sequence lr(kfsdp::optim::constant(1e-3), 500, kfsdp::optim::linear(1e-3, 0, 500));
KFSDP_EXPORT template <class First, class Second>
class sequence {
 public:
  sequence(First first, std::size_t length, Second second)
      : first_(std::move(first)), second_(std::move(second)), length_(length) {
    detail::check_steps("sequence", "length", length);
  }
  double operator()(std::size_t step) const { return step < length_ ? first_(step) : second_(step - length_); }

 private:
  First first_;
  Second second_;
  std::size_t length_;
};

/// Linear warm-up over `steps` steps to after(0), then `after` restarted at 0: step t < steps runs at
/// after(0)·(t + 1)/steps (PyTorch's LinearLR with start_factor = 1/steps, total_iters = steps - 1), so
/// the first step already moves the weights and step steps - 1 reaches the peak.
///
///   auto lr = kfsdp::optim::warmup(100, kfsdp::optim::cosine(6e-4, 900));   // 1000 steps in all
KFSDP_EXPORT template <class After>
class warmup {
 public:
  warmup(std::size_t steps, After after) : after_(std::move(after)), steps_(steps) {
    detail::check_steps("warmup", "steps", steps);
  }
  double operator()(std::size_t step) const {
    if (step >= steps_) return after_(step - steps_);
    return after_(0) * double(step + 1) / double(steps_);
  }

 private:
  After after_;
  std::size_t steps_;
};

/// nanoGPT's recipe: `warmup_steps` of linear warm-up to base_lr, then cosine decay to min_lr at
/// step `total_steps` (and min_lr after it).
///
///   auto lr = kfsdp::optim::warmup_cosine(6e-4, 2000, 600000, 6e-5);
KFSDP_EXPORT inline warmup<cosine> warmup_cosine(double base_lr, std::size_t warmup_steps, std::size_t total_steps,
                                    double min_lr = 0.0) {
  if (warmup_steps >= total_steps)
    throw std::invalid_argument(fmt::format(
        "warmup_cosine: warmup_steps = {}, expected warmup_steps < total_steps = {} (steps left to decay)",
        warmup_steps, total_steps));
  return warmup(warmup_steps, cosine(base_lr, total_steps - warmup_steps, min_lr));
}

/// Linear warm-up to base_lr over `warmup_steps`, then linear decay to end_lr at step `total_steps`.
///
///   auto lr = kfsdp::optim::warmup_linear(1e-3, 100, 1000);   // to 0 at step 1000
KFSDP_EXPORT inline warmup<linear> warmup_linear(double base_lr, std::size_t warmup_steps, std::size_t total_steps,
                                    double end_lr = 0.0) {
  if (warmup_steps >= total_steps)
    throw std::invalid_argument(fmt::format(
        "warmup_linear: warmup_steps = {}, expected warmup_steps < total_steps = {} (steps left to decay)",
        warmup_steps, total_steps));
  return warmup(warmup_steps, linear(base_lr, end_lr, total_steps - warmup_steps));
}

}  // namespace kfsdp::optim
