#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::optim::sgd — PyTorch's torch.optim.SGD (dampening 0) on a rank's flat local shard, as
// ONE fused Kokkos kernel: weight decay, momentum, optional Nesterov and the update in one pass.
//
//   kfsdp::optim::sgd<float> optimizer(shard.extent(0), {.lr = 0.1, .momentum = 0.9});
//   optimizer.step(shard_params, shard_grads);   // after the reduce-scatter, per rank, no comms
//
// Per element, exactly PyTorch's order of operations (so that double results match bit for bit):
//   d   = g + weight_decay * p
//   buf = momentum * buf + d        (buf starts at 0, so the first step gives buf = d, as PyTorch)
//   d   = nesterov ? d + momentum * buf : buf        (only when momentum != 0)
//   p   = p - lr * d
//
// Padding invariant: padding rows of a shard are zero in the parameters and in the gradients, so
// they stay exactly zero after any number of steps (d = 0 + wd * 0 = 0, buf stays 0, p = 0 - lr*0)
// — with weight decay on too. The optimizer needs no knowledge of where the padding is.

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <kfsdp/tensor/stateful.hpp>
#include <kfsdp/optim/param_groups.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfsdp::optim {

/// Hyper-parameters of torch.optim.SGD with dampening 0 (PyTorch's defaults).
///
///   kfsdp::optim::sgd_options{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true}
struct sgd_options {
  double lr = 1e-3;
  double momentum = 0.0;      // 0 turns momentum (and the momentum buffer) off
  double weight_decay = 0.0;  // L2, PyTorch-style: added to the gradient
  bool nesterov = false;      // needs momentum > 0
};

/// Throws std::invalid_argument naming the field, the value seen and what is expected
/// ("sgd: lr = -0.1, expected lr >= 0"); `who` starts the message.
void validate(const sgd_options& options, std::string_view who = "sgd");

/// One SGD step over a flat shard: updates `params` and `momentum_buffer` in place.
/// `momentum_buffer` has the length of `params`, or may be empty when options.momentum == 0.
/// The step reads the gradients times `grad_scale` (clip_scale's factor; the gradients are not written).
/// Throws std::invalid_argument for invalid options or views of different lengths.
///
///   kfsdp::optim::sgd_step(params, grads, buffer, {.lr = 0.1, .momentum = 0.9});
template <class Scalar>
void sgd_step(const Kokkos::View<Scalar*>& params,
              const std::type_identity_t<Kokkos::View<const Scalar*>>& grads,
              const std::type_identity_t<Kokkos::View<Scalar*>>& momentum_buffer,
              const sgd_options& options, double grad_scale = 1.0);

namespace detail {
// SGD has one lr and one weight decay: its groups may only freeze.
inline void check_sgd_groups(const std::vector<param_group>& groups) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].lr_scale != 1.0)
      throw std::invalid_argument(fmt::format("sgd: group {} sets lr_scale = {}, expected 1 (SGD's groups may only freeze)",
                                              g, groups[g].lr_scale));
    if (groups[g].weight_decay)
      throw std::invalid_argument(fmt::format(
          "sgd: group {} sets weight_decay = {}, expected it unset (SGD's groups may only freeze)", g, *groups[g].weight_decay));
  }
}
}  // namespace detail

/// SGD with its momentum buffer (allocated, zero, when momentum != 0) for a shard of fixed length.
///
///   kfsdp::optim::sgd<double> optimizer(1024, {.lr = 0.1, .momentum = 0.9});
///   optimizer.step(params, grads);
///   optimizer.set_lr(0.05);                 // a schedule changes lr between steps
///
/// Built from a trainer (or an engine), parameters frozen there, and those of frozen groups (which
/// it freezes there too), hold no momentum and are never updated:
///
///   kfsdp::optim::sgd<double> optimizer(trainer, {.lr = 0.1, .momentum = 0.9}, {{.name_contains = "fc1.", .frozen = true}});
KFSDP_EXPORT template <class Scalar>
class sgd {
 public:
  using view_type = Kokkos::View<Scalar*>;
  using const_view_type = Kokkos::View<const Scalar*>;

  explicit sgd(std::size_t shard_size, sgd_options options = {});
  /// Frozen parameters from a layout of make_param_groups (shard_size is its length); its lr scales
  /// and weight decays are not used.
  sgd(const param_group_layout& frozen, sgd_options options);
  template <class Owner>
    requires requires(Owner& o) { detail::engine_of(o).plan(); detail::engine_of(o).params(); }
  sgd(Owner& owner, sgd_options options = {}, const std::vector<param_group>& groups = {})
      : sgd((detail::check_sgd_groups(groups), detail::groups_freezing(detail::engine_of(owner), 0.0, groups)),
            options) {}

  /// One step; `params` and `grads` must both have shard_size() elements. The step uses
  /// grad_scale · grads (clipping's factor, applied in the same pass).
  void step(const view_type& params, const const_view_type& grads, double grad_scale = 1.0);

  void set_lr(double lr);
  [[nodiscard]] const sgd_options& options() const noexcept { return options_; }
  [[nodiscard]] std::size_t shard_size() const noexcept { return shard_size_; }
  /// The momentum buffer (empty when momentum == 0), e.g. for a checkpoint; with frozen parameters
  /// it holds the shard's runs that train (trained()) back to back.
  [[nodiscard]] const view_type& momentum_buffer() const noexcept { return momentum_buffer_; }
  /// The bytes of state this rank holds: the momentum buffer (none without momentum).
  [[nodiscard]] std::size_t state_bytes() const noexcept { return momentum_buffer_.extent(0) * sizeof(Scalar); }

  /// The checkpoint protocol (tensor/stateful.hpp): the momentum buffer as "optimizer.momentum_buffer"
  /// (restored in place; none without momentum) and the kind as metadata.
  void add_state(io::checkpoint_state<Scalar>& state) const {
    if (momentum_buffer_.extent(0) > 0)
      state.shards.push_back({"optimizer.momentum_buffer", momentum_buffer_, frozen_params_});
    state.metadata["optimizer"] = "sgd";
  }
  /// Refuses a checkpoint of another optimizer, naming the key (a file without the momentum buffer
  /// that this one needs is refused by the load, naming the tensor).
  void restore_state(const io::metadata_map& metadata) { io::check_metadata(metadata, "optimizer", "sgd"); }

  /// With frozen parameters: the shard's runs that are stepped; empty otherwise.
  [[nodiscard]] const std::vector<state_segment>& trained() const noexcept { return trained_; }

 private:
  std::size_t shard_size_;
  sgd_options options_;
  view_type momentum_buffer_;
  bool any_frozen_ = false;
  std::vector<state_segment> trained_;
  std::vector<std::size_t> frozen_params_;  // ascending
};

namespace detail {
// Throws std::invalid_argument when `view` does not have `expected` elements.
void check_length(std::string_view who, std::string_view view_name, std::size_t seen,
                  std::string_view expected_name, std::size_t expected);
}  // namespace detail

// ---------------------------------------------------------------- definitions

template <class Scalar>
void sgd_step(const Kokkos::View<Scalar*>& params,
              const std::type_identity_t<Kokkos::View<const Scalar*>>& grads,
              const std::type_identity_t<Kokkos::View<Scalar*>>& momentum_buffer,
              const sgd_options& options, double grad_scale) {
  validate(options, "sgd_step");
  const std::size_t length = params.extent(0);
  detail::check_length("sgd_step", "grads", grads.extent(0), "params", length);
  const bool use_momentum = options.momentum != 0.0;
  if (use_momentum)
    detail::check_length("sgd_step", "momentum_buffer", momentum_buffer.extent(0), "params", length);

  // Hyper-parameters in the parameters' type, as PyTorch casts Python scalars for the kernel.
  const auto lr = static_cast<Scalar>(options.lr);
  const auto momentum = static_cast<Scalar>(options.momentum);
  const auto weight_decay = static_cast<Scalar>(options.weight_decay);
  const bool use_weight_decay = options.weight_decay != 0.0;
  const bool nesterov = options.nesterov;
  const auto scale = static_cast<Scalar>(grad_scale);  // scaled as KokkosBlas::scal would: scale · g
  const auto p = params;
  const auto g = grads;
  const auto buffer = momentum_buffer;
  Kokkos::parallel_for(
      "kfsdp::optim::sgd_step", Kokkos::RangePolicy<>(0, length), KOKKOS_LAMBDA(const std::size_t i) {
        Scalar direction = scale * g(i);
        if (use_weight_decay) direction = direction + weight_decay * p(i);
        if (use_momentum) {
          const Scalar velocity = buffer(i) * momentum + direction;
          buffer(i) = velocity;
          direction = nesterov ? direction + momentum * velocity : velocity;
        }
        p(i) = p(i) - lr * direction;
      });
}

template <class Scalar>
sgd<Scalar>::sgd(std::size_t shard_size, sgd_options options)
    : shard_size_(shard_size), options_(options) {
  validate(options_, "sgd");
  if (options_.momentum != 0.0) momentum_buffer_ = view_type("kfsdp::optim::sgd::momentum_buffer", shard_size_);
}

template <class Scalar>
sgd<Scalar>::sgd(const param_group_layout& frozen, sgd_options options)
    : shard_size_(frozen.group_of.extent(0)), options_(options), any_frozen_(frozen.any_frozen()) {
  validate(options_, "sgd");
  std::size_t state_size = shard_size_;
  if (any_frozen_) {
    trained_ = frozen.trained;
    state_size = 0;
    for (const state_segment& run : trained_) state_size += run.count;
    for (std::size_t p = 0; p < frozen.frozen_param.size(); ++p)
      if (frozen.frozen_param[p]) frozen_params_.push_back(p);
  }
  if (options_.momentum != 0.0) momentum_buffer_ = view_type("kfsdp::optim::sgd::momentum_buffer", state_size);
}

template <class Scalar>
void sgd<Scalar>::step(const view_type& params, const const_view_type& grads, double grad_scale) {
  detail::check_length("sgd::step", "params", params.extent(0), "shard_size", shard_size_);
  if (!any_frozen_) {
    sgd_step<Scalar>(params, grads, momentum_buffer_, options_, grad_scale);
    return;
  }
  // The same kernel on each run that trains: frozen elements are neither read nor written.
  detail::check_length("sgd::step", "grads", grads.extent(0), "params", shard_size_);
  for (const state_segment& run : trained_) {
    const auto in_shard = std::pair(run.first, run.first + run.count);
    const view_type buffer = momentum_buffer_.extent(0) > 0
                                 ? view_type(Kokkos::subview(momentum_buffer_, std::pair(run.state_first, run.state_first + run.count)))
                                 : view_type();
    sgd_step<Scalar>(Kokkos::subview(params, in_shard), Kokkos::subview(grads, in_shard), buffer, options_, grad_scale);
  }
}

template <class Scalar>
void sgd<Scalar>::set_lr(double lr) {
  sgd_options changed = options_;
  changed.lr = lr;
  validate(changed, "sgd::set_lr");
  options_ = changed;
}

extern template void sgd_step<float>(const Kokkos::View<float*>&, const Kokkos::View<const float*>&,
                                      const Kokkos::View<float*>&, const sgd_options&, double);
extern template void sgd_step<double>(const Kokkos::View<double*>&, const Kokkos::View<const double*>&,
                                       const Kokkos::View<double*>&, const sgd_options&, double);
extern template class sgd<float>;
extern template class sgd<double>;

}  // namespace kfsdp::optim
