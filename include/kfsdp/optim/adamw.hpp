#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::optim::adamw — PyTorch's torch.optim.AdamW (amsgrad off) on a rank's flat local shard, as
// ONE fused Kokkos kernel: decoupled weight decay, both moments and the update in one pass.
//
//   kfsdp::optim::adamw<float> optimizer(shard.extent(0), {.lr = 6e-4, .weight_decay = 0.1});
//   optimizer.step(shard_params, shard_grads);   // step_count() is now 1
//
// Per element at step t (t = 1, 2, ...), exactly PyTorch's order of operations:
//   g  = grad_scale * g                                      gradient clipping's factor (1: none), here so
//                                                            that clipping costs no pass of its own
//   p  = p * (1 - lr * weight_decay)                         decoupled decay
//   m  = lerp(m, g, 1 - beta1)                               torch.lerp: m + w*(g - m) for w < 0.5
//   v  = v * beta2 + ((1 - beta2) * g) * g
//   p  = p + (-lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The bias corrections are computed once per step on the host in double, then cast to Scalar.
//
// Padding invariant: padding rows of a shard are zero in the parameters and in the gradients, so
// they stay exactly zero after any number of steps (p*(1-lr*wd) = 0, m = v = 0, the update is
// 0 / eps = 0) — with weight decay on too. The optimizer needs no knowledge of where padding is.
//
// Parameter groups (opt-in, param_groups.hpp): built from a trainer, the optimizer decays 2-D and
// larger parameters only and lets groups chosen by name scale lr and set their weight decay; each
// element then runs the formulas above with lr·lr_scale and its group's weight_decay.
//
//   kfsdp::optim::adamw<float> optimizer(trainer, {.lr = 6e-4, .weight_decay = 0.1});  // biases, norms: no decay

#include <kfsdp/optim/sgd.hpp>  // detail::check_length

#include <Kokkos_Core.hpp>

#include <kfsdp/detail/kokkos_math.hpp>
#include <kfsdp/tensor/stateful.hpp>
#include <kfsdp/optim/param_groups.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfsdp::optim {

/// Hyper-parameters of torch.optim.AdamW (PyTorch's defaults).
///
///   kfsdp::optim::adamw_options{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1}
struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p -= lr * weight_decay * p
};

/// Throws std::invalid_argument naming the field, the value seen and what is expected
/// ("adamw: beta2 = 1, expected 0 <= beta2 < 1"); `who` starts the message.
void validate(const adamw_options& options, std::string_view who = "adamw");

/// One AdamW step number `step` (1 for the first) over a flat shard: updates `params`, `exp_avg`
/// and `exp_avg_sq` in place. All four views have the same length. The step reads the gradients
/// times `grad_scale` (clip_scale's factor; the gradients themselves are left as they are).
/// Throws std::invalid_argument for invalid options, step < 1 or views of different lengths.
///
///   kfsdp::optim::adamw_step(params, grads, exp_avg, exp_avg_sq, {.lr = 1e-3}, 1);
template <class Scalar>
void adamw_step(const Kokkos::View<Scalar*>& params,
                const std::type_identity_t<Kokkos::View<const Scalar*>>& grads,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg_sq,
                const adamw_options& options, std::int64_t step, double grad_scale = 1.0);

/// The same step with each element's lr scaled and its weight decay set by its group in `groups`
/// (make_param_groups); `groups.group_of` has the length of `params`.
///
///   kfsdp::optim::adamw_step(params, grads, exp_avg, exp_avg_sq, {.lr = 1e-3}, 1, layout);
template <class Scalar>
void adamw_step(const Kokkos::View<Scalar*>& params,
                const std::type_identity_t<Kokkos::View<const Scalar*>>& grads,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg_sq,
                const adamw_options& options, std::int64_t step, const param_group_layout& groups,
                double grad_scale = 1.0);


/// AdamW with its two moment buffers (zero at the start) and its step counter, for a shard of fixed
/// length.
///
///   kfsdp::optim::adamw<double> optimizer(1024);   // lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 1e-2
///   optimizer.step(params, grads);
///   optimizer.set_lr(schedule(optimizer.step_count()));
///
/// Built from a trainer (or an engine), it holds parameter groups: 1-D parameters are not decayed,
/// and `groups` chosen by name set their own lr scale and weight decay (param_groups.hpp):
///
///   kfsdp::optim::adamw<double> optimizer(trainer, {.lr = 1e-3, .weight_decay = 0.1},
///                                         {{.name_contains = "embedding", .lr_scale = 0.1}});
KFSDP_EXPORT template <class Scalar>
class adamw {
 public:
  using view_type = Kokkos::View<Scalar*>;
  using const_view_type = Kokkos::View<const Scalar*>;

  /// Every element alike, as torch.optim.AdamW over one parameter group.
  explicit adamw(std::size_t shard_size, adamw_options options = {});
  /// Groups from a layout of make_param_groups (shard_size is its length).
  adamw(param_group_layout groups, adamw_options options);
  /// Groups from a trainer's (or an engine's) parameters and shard plan: the default rule, then `groups`.
  /// Parameters frozen in the engine, and those of frozen groups, hold no state; the latter are
  /// frozen in the engine too (their gradients are not reduce-scattered).
  template <class Owner>
    requires requires(Owner& o) { detail::engine_of(o).plan(); detail::engine_of(o).params(); }
  adamw(Owner& owner, adamw_options options = {}, const std::vector<param_group>& groups = {})
      : adamw(detail::groups_freezing(detail::engine_of(owner), options.weight_decay, groups), options) {}

  /// One step (the counter goes up first, as in PyTorch); both views have shard_size() elements.
  /// Frozen elements are neither read nor written. The step uses grad_scale · grads (clipping's
  /// factor, applied in the same pass; the gradients are not written).
  void step(const view_type& params, const const_view_type& grads, double grad_scale = 1.0);

  void set_lr(double lr);
  /// Sets the counter, e.g. when the moments are restored from a checkpoint; steps >= 0.
  void set_step_count(std::int64_t steps);

  [[nodiscard]] const adamw_options& options() const noexcept { return options_; }
  [[nodiscard]] std::size_t shard_size() const noexcept { return shard_size_; }
  [[nodiscard]] std::int64_t step_count() const noexcept { return step_count_; }
  /// The moments: shard_size() elements, or, with frozen parameters, state_size() (the shard's runs
  /// that train, groups()->trained, back to back).
  [[nodiscard]] std::size_t state_size() const noexcept { return exp_avg_.extent(0); }
  /// The bytes of state this rank holds: the two moments.
  [[nodiscard]] std::size_t state_bytes() const noexcept { return 2 * state_size() * sizeof(Scalar); }
  [[nodiscard]] const view_type& exp_avg() const noexcept { return exp_avg_; }
  [[nodiscard]] const view_type& exp_avg_sq() const noexcept { return exp_avg_sq_; }
  /// The parameter groups (none for the shard_size constructor).
  [[nodiscard]] const std::optional<param_group_layout>& groups() const noexcept { return groups_; }

  /// The checkpoint protocol (tensor/stateful.hpp): the moments as "optimizer.exp_avg" and
  /// "optimizer.exp_avg_sq" (restored in place; frozen parameters have none), the kind and the
  /// step count as metadata.
  void add_state(io::checkpoint_state<Scalar>& state) const {
    state.shards.push_back({"optimizer.exp_avg", exp_avg_, frozen_params()});
    state.shards.push_back({"optimizer.exp_avg_sq", exp_avg_sq_, frozen_params()});
    state.metadata["optimizer"] = "adamw";
    state.metadata["optimizer.step_count"] = std::to_string(step_count_);
  }
  /// Refuses a checkpoint of another optimizer, naming the key; sets the step count.
  void restore_state(const io::metadata_map& metadata) {
    io::check_metadata(metadata, "optimizer", "adamw");
    set_step_count(static_cast<std::int64_t>(io::metadata_count(metadata, "optimizer.step_count")));
  }

 private:
  [[nodiscard]] std::vector<std::size_t> frozen_params() const {
    std::vector<std::size_t> frozen;
    if (groups_)
      for (std::size_t p = 0; p < groups_->frozen_param.size(); ++p)
        if (groups_->frozen_param[p]) frozen.push_back(p);
    return frozen;
  }

  std::size_t shard_size_;
  adamw_options options_;
  std::int64_t step_count_ = 0;
  view_type exp_avg_;
  view_type exp_avg_sq_;
  std::optional<param_group_layout> groups_;
  std::vector<param_group_layout> segment_groups_;  // per run of groups_->trained: its slice of the ids
};

namespace detail {
// Throws std::invalid_argument unless step >= 1.
void check_step(std::string_view who, std::int64_t step);

// Each group id's decay factor and step size, captured by value by the kernel.
template <class Scalar>
struct group_coefficients {
  Scalar decay_factor[max_param_groups];
  Scalar negative_step_size[max_param_groups];
  bool use_weight_decay[max_param_groups];
};

}  // namespace detail

// ---------------------------------------------------------------- definitions

template <class Scalar>
void adamw_step(const Kokkos::View<Scalar*>& params,
                const std::type_identity_t<Kokkos::View<const Scalar*>>& grads,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg_sq,
                const adamw_options& options, std::int64_t step, double grad_scale) {
  validate(options, "adamw_step");
  detail::check_step("adamw_step", step);
  const std::size_t length = params.extent(0);
  detail::check_length("adamw_step", "grads", grads.extent(0), "params", length);
  detail::check_length("adamw_step", "exp_avg", exp_avg.extent(0), "params", length);
  detail::check_length("adamw_step", "exp_avg_sq", exp_avg_sq.extent(0), "params", length);

  // Host-side scalars in double (Python floats in PyTorch), cast to Scalar for the kernel.
  const double bias_correction1 = 1.0 - std::pow(options.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options.beta2, static_cast<double>(step));
  const auto decay_factor = static_cast<Scalar>(1.0 - options.lr * options.weight_decay);
  const bool use_weight_decay = options.weight_decay != 0.0;
  const auto lerp_weight = static_cast<Scalar>(1.0 - options.beta1);
  const bool small_lerp_weight = std::abs(lerp_weight) < Scalar(0.5);
  const Scalar lerp_complement = Scalar(1) - lerp_weight;
  const auto beta2 = static_cast<Scalar>(options.beta2);
  const auto one_minus_beta2 = static_cast<Scalar>(1.0 - options.beta2);
  const auto negative_step_size = static_cast<Scalar>(-(options.lr / bias_correction1));
  const auto bias_correction2_sqrt = static_cast<Scalar>(std::sqrt(bias_correction2));
  const auto eps = static_cast<Scalar>(options.eps);
  const auto scale = static_cast<Scalar>(grad_scale);  // scaled as KokkosBlas::scal would: scale · g
  const auto p = params;
  const auto g = grads;
  const auto m = exp_avg;
  const auto v = exp_avg_sq;
  Kokkos::parallel_for(
      "kfsdp::optim::adamw_step", Kokkos::RangePolicy<>(0, length), KOKKOS_LAMBDA(const std::size_t i) {
        const Scalar gradient = scale * g(i);
        Scalar parameter = p(i);
        if (use_weight_decay) parameter = parameter * decay_factor;
        const Scalar first = m(i);
        const Scalar first_next = small_lerp_weight ? first + lerp_weight * (gradient - first)
                                                    : gradient - (gradient - first) * lerp_complement;
        const Scalar second_next = v(i) * beta2 + (one_minus_beta2 * gradient) * gradient;
        const Scalar denominator = math::sqrt(second_next) / bias_correction2_sqrt + eps;
        m(i) = first_next;
        v(i) = second_next;
        p(i) = parameter + (negative_step_size * first_next) / denominator;
      });
}

template <class Scalar>
void adamw_step(const Kokkos::View<Scalar*>& params,
                const std::type_identity_t<Kokkos::View<const Scalar*>>& grads,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg,
                const std::type_identity_t<Kokkos::View<Scalar*>>& exp_avg_sq,
                const adamw_options& options, std::int64_t step, const param_group_layout& groups,
                double grad_scale) {
  validate(options, "adamw_step");
  detail::check_step("adamw_step", step);
  const std::size_t length = params.extent(0);
  detail::check_length("adamw_step", "grads", grads.extent(0), "params", length);
  detail::check_length("adamw_step", "exp_avg", exp_avg.extent(0), "params", length);
  detail::check_length("adamw_step", "exp_avg_sq", exp_avg_sq.extent(0), "params", length);
  detail::check_length("adamw_step", "groups.group_of", groups.group_of.extent(0), "params", length);

  // The ungrouped step's host scalars, per group id: lr · 1 is lr exactly, so a group of scale 1
  // and the options' weight decay gives the ungrouped step's bits.
  const double bias_correction1 = 1.0 - std::pow(options.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options.beta2, static_cast<double>(step));
  detail::group_coefficients<Scalar> coefficients{};
  for (std::size_t id = 0; id < groups.lr_scale.size() && id < max_param_groups; ++id) {
    const double lr = options.lr * groups.lr_scale[id];
    coefficients.decay_factor[id] = static_cast<Scalar>(1.0 - lr * groups.weight_decay[id]);
    coefficients.use_weight_decay[id] = groups.weight_decay[id] != 0.0;
    coefficients.negative_step_size[id] = static_cast<Scalar>(-(lr / bias_correction1));
  }
  const auto lerp_weight = static_cast<Scalar>(1.0 - options.beta1);
  const bool small_lerp_weight = std::abs(lerp_weight) < Scalar(0.5);
  const Scalar lerp_complement = Scalar(1) - lerp_weight;
  const auto beta2 = static_cast<Scalar>(options.beta2);
  const auto one_minus_beta2 = static_cast<Scalar>(1.0 - options.beta2);
  const auto bias_correction2_sqrt = static_cast<Scalar>(std::sqrt(bias_correction2));
  const auto eps = static_cast<Scalar>(options.eps);
  const auto scale = static_cast<Scalar>(grad_scale);  // scaled as KokkosBlas::scal would: scale · g
  const auto p = params;
  const auto g = grads;
  const auto m = exp_avg;
  const auto v = exp_avg_sq;
  const auto group_of = groups.group_of;
  Kokkos::parallel_for(
      "kfsdp::optim::adamw_step_grouped", Kokkos::RangePolicy<>(0, length), KOKKOS_LAMBDA(const std::size_t i) {
        const std::uint8_t id = group_of(i);
        const Scalar gradient = scale * g(i);
        Scalar parameter = p(i);
        if (coefficients.use_weight_decay[id]) parameter = parameter * coefficients.decay_factor[id];
        const Scalar first = m(i);
        const Scalar first_next = small_lerp_weight ? first + lerp_weight * (gradient - first)
                                                    : gradient - (gradient - first) * lerp_complement;
        const Scalar second_next = v(i) * beta2 + (one_minus_beta2 * gradient) * gradient;
        const Scalar denominator = math::sqrt(second_next) / bias_correction2_sqrt + eps;
        m(i) = first_next;
        v(i) = second_next;
        p(i) = parameter + (coefficients.negative_step_size[id] * first_next) / denominator;
      });
}

template <class Scalar>
adamw<Scalar>::adamw(std::size_t shard_size, adamw_options options)
    : shard_size_(shard_size),
      options_(options),
      exp_avg_("kfsdp::optim::adamw::exp_avg", shard_size),
      exp_avg_sq_("kfsdp::optim::adamw::exp_avg_sq", shard_size) {
  validate(options_, "adamw");
}

template <class Scalar>
adamw<Scalar>::adamw(param_group_layout groups, adamw_options options)
    : shard_size_(groups.group_of.extent(0)), options_(options) {
  validate(options_, "adamw");
  // The kernel indexes fixed arrays by group id: a layout not made by make_param_groups is checked here.
  if (groups.lr_scale.size() > max_param_groups || groups.weight_decay.size() != groups.lr_scale.size())
    throw std::invalid_argument("adamw: groups has " + std::to_string(groups.lr_scale.size()) + " lr scales and " +
                                std::to_string(groups.weight_decay.size()) +
                                " weight decays, expected as many of each, at most " +
                                std::to_string(max_param_groups));
  // Frozen parameters hold no moments: the state is the runs that train, back to back.
  std::size_t state_size = shard_size_;
  if (groups.any_frozen()) {
    state_size = 0;
    for (const state_segment& run : groups.trained) {
      if (run.first + run.count > shard_size_ || run.state_first != state_size)
        throw std::invalid_argument("adamw: groups.trained has a run [" + std::to_string(run.first) + ", " +
                                    std::to_string(run.first + run.count) + ") at state offset " +
                                    std::to_string(run.state_first) + ", expected one within the shard's " +
                                    std::to_string(shard_size_) + " elements at state offset " +
                                    std::to_string(state_size));
      segment_groups_.push_back({Kokkos::subview(groups.group_of, std::pair(run.first, run.first + run.count)),
                                 groups.lr_scale, groups.weight_decay, {}, {}, {}, 0});
      state_size += run.count;
    }
  }
  exp_avg_ = view_type("kfsdp::optim::adamw::exp_avg", state_size);
  exp_avg_sq_ = view_type("kfsdp::optim::adamw::exp_avg_sq", state_size);
  groups_ = std::move(groups);
}

template <class Scalar>
void adamw<Scalar>::step(const view_type& params, const const_view_type& grads, double grad_scale) {
  detail::check_length("adamw::step", "params", params.extent(0), "shard_size", shard_size_);
  if (groups_ && groups_->any_frozen()) {
    // The same kernel on each run that trains: frozen elements are neither read nor written.
    detail::check_length("adamw::step", "grads", grads.extent(0), "params", shard_size_);
    for (std::size_t s = 0; s < segment_groups_.size(); ++s) {
      const state_segment& run = groups_->trained[s];
      const auto in_shard = std::pair(run.first, run.first + run.count);
      const auto in_state = std::pair(run.state_first, run.state_first + run.count);
      adamw_step<Scalar>(Kokkos::subview(params, in_shard), Kokkos::subview(grads, in_shard),
                         Kokkos::subview(exp_avg_, in_state), Kokkos::subview(exp_avg_sq_, in_state), options_,
                         step_count_ + 1, segment_groups_[s], grad_scale);
    }
  } else if (groups_)
    adamw_step<Scalar>(params, grads, exp_avg_, exp_avg_sq_, options_, step_count_ + 1, *groups_, grad_scale);
  else
    adamw_step<Scalar>(params, grads, exp_avg_, exp_avg_sq_, options_, step_count_ + 1, grad_scale);
  ++step_count_;  // only once the step has gone through
}

template <class Scalar>
void adamw<Scalar>::set_lr(double lr) {
  adamw_options changed = options_;
  changed.lr = lr;
  validate(changed, "adamw::set_lr");
  options_ = changed;
}

template <class Scalar>
void adamw<Scalar>::set_step_count(std::int64_t steps) {
  if (steps < 0)
    throw std::invalid_argument("adamw::set_step_count: steps = " + std::to_string(steps) +
                                ", expected steps >= 0");
  step_count_ = steps;
}

extern template void adamw_step<float>(const Kokkos::View<float*>&, const Kokkos::View<const float*>&,
                                        const Kokkos::View<float*>&, const Kokkos::View<float*>&,
                                        const adamw_options&, std::int64_t, double);
extern template void adamw_step<double>(const Kokkos::View<double*>&, const Kokkos::View<const double*>&,
                                         const Kokkos::View<double*>&, const Kokkos::View<double*>&,
                                         const adamw_options&, std::int64_t, double);
extern template void adamw_step<float>(const Kokkos::View<float*>&, const Kokkos::View<const float*>&,
                                        const Kokkos::View<float*>&, const Kokkos::View<float*>&,
                                        const adamw_options&, std::int64_t, const param_group_layout&, double);
extern template void adamw_step<double>(const Kokkos::View<double*>&, const Kokkos::View<const double*>&,
                                         const Kokkos::View<double*>&, const Kokkos::View<double*>&,
                                         const adamw_options&, std::int64_t, const param_group_layout&, double);
extern template class adamw<float>;
extern template class adamw<double>;

}  // namespace kfsdp::optim
