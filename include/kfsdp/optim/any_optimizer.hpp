#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::optim::any_optimizer — the optimizer a program chooses at run time (its --optimizer flag):
// AdamW or SGD behind one type that trainer.step, fit and the checkpoint protocol all take, so a
// program keeps no variant of its own and names no tensor of the optimizer's state.
//
//   kfsdp::optim::any_optimizer<float> optimizer(trainer, {.kind = "sgd", .lr = 0.1, .momentum = 0.9});
//   trainer.step(batches, optimizer, 1.0);
//   optimizer.add_state(state);                      // checkpoints: "optimizer.momentum_buffer", "optimizer"
//
// Parameter groups are the default rule's (optim/param_groups.hpp: AdamW decays 2-D weights only),
// then `groups`; frozen groups hold no state in either.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/sgd.hpp>

namespace kfsdp::optim {

/// Which optimizer, with the hyper-parameters the two share; every field has a default.
KFSDP_EXPORT struct optimizer_choice {
  std::string kind = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double momentum = 0.0;      // sgd's (0: no momentum buffer); adamw's betas are its defaults'
  double weight_decay = 0.0;  // adamw: decoupled, on the groups that decay; sgd: L2 on every element

  // Shard-sized states it keeps, for memory estimates: AdamW 2, SGD with momentum 1, without 0.
  [[nodiscard]] std::size_t states() const { return kind == "adamw" ? 2 : momentum > 0 ? 1 : 0; }
};

KFSDP_EXPORT template <class Scalar>
class any_optimizer {
 public:
  using view_type = Kokkos::View<Scalar*>;
  using const_view_type = Kokkos::View<const Scalar*>;

  /// Made from a trainer (or an engine); throws std::invalid_argument naming a kind that is neither.
  template <class Owner>
  any_optimizer(Owner& owner, const optimizer_choice& choice, const std::vector<param_group>& groups = {})
      : chosen_(make(owner, choice, groups)) {}

  /// The chosen optimizer's step on grad_scale · grads (clipping's factor, in the same pass).
  void step(const view_type& params, const const_view_type& grads, double grad_scale = 1.0) {
    std::visit([&](auto& o) { o.step(params, grads, grad_scale); }, chosen_);
  }
  void set_lr(double lr) {
    std::visit([&](auto& o) { o.set_lr(lr); }, chosen_);
  }
  /// "adamw" or "sgd".
  [[nodiscard]] std::string_view kind() const noexcept { return chosen_.index() == 0 ? "adamw" : "sgd"; }
  /// The bytes of state this rank holds: AdamW's two moments, SGD's momentum buffer (none without momentum).
  [[nodiscard]] std::size_t state_bytes() const noexcept {
    return std::visit([](const auto& o) { return o.state_bytes(); }, chosen_);
  }

  /// The checkpoint protocol (tensor/stateful.hpp): the chosen optimizer's.
  void add_state(io::checkpoint_state<Scalar>& state) const {
    std::visit([&](const auto& o) { o.add_state(state); }, chosen_);
  }
  void restore_state(const io::metadata_map& metadata) {
    std::visit([&](auto& o) { o.restore_state(metadata); }, chosen_);
  }

  /// The optimizer itself, for what only one kind has (AdamW's step count, say).
  [[nodiscard]] const std::variant<adamw<Scalar>, sgd<Scalar>>& chosen() const noexcept { return chosen_; }

 private:
  template <class Owner>
  static std::variant<adamw<Scalar>, sgd<Scalar>> make(Owner& owner, const optimizer_choice& choice,
                                                       const std::vector<param_group>& groups) {
    using result = std::variant<adamw<Scalar>, sgd<Scalar>>;
    if (choice.kind == "adamw")
      return result(std::in_place_index<0>, owner, adamw_options{.lr = choice.lr, .weight_decay = choice.weight_decay},
                    groups);
    if (choice.kind == "sgd")
      return result(std::in_place_index<1>, owner,
                    sgd_options{.lr = choice.lr, .momentum = choice.momentum, .weight_decay = choice.weight_decay},
                    groups);
    throw std::invalid_argument(fmt::format("any_optimizer: kind is '{}', expected adamw or sgd", choice.kind));
  }

  std::variant<adamw<Scalar>, sgd<Scalar>> chosen_;
};

}  // namespace kfsdp::optim
