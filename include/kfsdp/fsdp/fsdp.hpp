#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::fsdp<Model, Scalar, Policies...> — the engine with its schedule fixed at compile time by
// policy tags (any order, each defaulted: zero2, no_bucketing), and kfsdp::with_fsdp, the run-time
// entry point that takes Thunder's options and dispatches to the policies.
//
//   kfsdp::comm::mpi world;
//   auto model = kfsdp::make_gpt({.layers = 4, .dim = 128, .seq = 64});
//   kfsdp::fsdp<decltype(model), float, kfsdp::zero3, kfsdp::block_bucketing> sharded(model, world);
//
//   kfsdp::with_fsdp<float>(model, world, {.sharding_strategy = kfsdp::sharding_strategy::zero3,
//                                          .bucketing_strategy = kfsdp::bucketing::block},
//                           [&](auto& sharded) { train(sharded); });
//
// The schedule works on units (fsdp/units.hpp: each block, and the root). Around a unit's
// forward and backward:
//   before_forward(u, next)   gather u's buckets, prefetch the next unit's
//   after_forward(u)          zero3: free them (the root stays); zero2: keep them for backward
//   before_backward(u, next)  zero3: gather again (prefetching the next); zero2: nothing to do
//   after_backward(u, sync)   issue the gradients' reduce-scatters (they run behind the next
//                             unit's backward), free the parameters
//   finish_backward()         finish every reduce-scatter, free the root: the gradients are ready
// Each unit walks sharded -> forward -> forward done -> backward -> backward done; a hook called
// out of that order throws std::logic_error naming the unit and the state it was in.
// kfsdp::trainer (train/trainer.hpp) makes these calls, and only it: they are private, so a user's
// code cannot call one out of the trainer's schedule.

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/meta/type_list.hpp>
#include <kfsdp/model/descriptor.hpp>
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

// The unit hooks of any fsdp<Model, Scalar, Policies...>, without the policies' types (what
// kfsdp::trainer drives, so that it is compiled once per model and scalar type). fsdp<> keeps them
// private: the trainer is their one caller, so a user cannot break its schedule.
class unit_hooks {
 public:
  virtual ~unit_hooks() = default;
  [[nodiscard]] virtual const std::vector<fsdp_unit>& units() const noexcept = 0;
  virtual void before_forward(std::size_t unit, std::optional<std::size_t> next = std::nullopt) = 0;
  virtual void after_forward(std::size_t unit) = 0;
  virtual void before_backward(std::size_t unit, std::optional<std::size_t> next = std::nullopt) = 0;
  virtual void after_backward(std::size_t unit, bool sync = true) = 0;
  virtual void finish_backward() = 0;
  virtual void reshard_all() = 0;
};

template <descriptor Model, class Scalar, class... Policies>
class trainer;
namespace detail {
struct unit_hook_access;
}

KFSDP_EXPORT template <descriptor Model, class Scalar, class... Policies>
class fsdp : public fsdp_engine<Scalar>, private unit_hooks {
  using policies = detail::fsdp_policies<Policies...>;
  using engine = fsdp_engine<Scalar>;
  friend class trainer<Model, Scalar, Policies...>;
  friend struct detail::unit_hook_access;

 public:
  static constexpr kfsdp::sharding_strategy sharding = policies::sharding;
  static constexpr kfsdp::bucketing bucketing_strategy = policies::bucketing_strategy;
  // With static_world_size<N>: N, and the plan computed at compile time, for static_asserts on
  // the bytes per rank; 0 and std::nullopt_t where the communicator sets the world size.
  //   using sharded = kfsdp::fsdp<kfsdp::gpt<48, 1600, 1024>, float, kfsdp::zero3, kfsdp::static_world_size<8>>;
  //   static_assert(4 * sharded::static_plan.shard_numel * sizeof(float) < (std::size_t(80) << 30));  // fits a GPU
  static constexpr std::size_t static_world_size = policies::world_size;
  static constexpr auto static_plan = [] {
    if constexpr (static_world_size == 0) {
      return std::nullopt;
    } else {
      return static_shard_plan<Model, static_world_size, bucketing_strategy>;  // needs a fully static Model
    }
  }();

  enum class unit_state { sharded, forward, forward_done, backward, backward_done };

  // options' sharding and bucketing, where set, must be the policies' (std::invalid_argument if not).
  fsdp(const Model& model, comm::any_communicator comm, fsdp_options options = {})
      : fsdp(make_model_graph(model), model, std::move(comm), std::move(options)) {}

  [[nodiscard]] const Model& model() const noexcept { return model_; }
  [[nodiscard]] const std::vector<fsdp_unit>& units() const noexcept override { return units_; }
  [[nodiscard]] unit_state state(std::size_t unit) const { return state_.at(checked(unit, "state")); }

  static constexpr std::string_view state_name(unit_state s) noexcept {
    constexpr std::string_view names[] = {"sharded", "forward", "forward done", "backward", "backward done"};
    return names[static_cast<int>(s)];
  }

 private:
  void before_forward(std::size_t unit, std::optional<std::size_t> next = std::nullopt) override {
    expect(unit, "before_forward", {unit_state::sharded, unit_state::forward_done, unit_state::backward_done});
    gather(unit, next);
    state_[unit] = unit_state::forward;
  }
  void after_forward(std::size_t unit) override {
    expect(unit, "after_forward", {unit_state::forward});
    if constexpr (sharding == sharding_strategy::zero3)
      if (unit != 0) for (std::size_t b : units_[unit].buckets) this->reshard(b);  // the root stays gathered
    state_[unit] = unit_state::forward_done;
  }
  void before_backward(std::size_t unit, std::optional<std::size_t> next = std::nullopt) override {
    expect(unit, "before_backward", {unit_state::forward_done});
    gather(unit, next);  // zero2: already unsharded, nothing is issued
    state_[unit] = unit_state::backward;
  }
  // sync = false (gradient accumulation, Thunder's no_sync): the full gradients are kept and
  // summed over micro-batches; the last micro-batch's after_backward(unit, true) reduces them.
  void after_backward(std::size_t unit, bool sync = true) override {
    expect(unit, "after_backward", {unit_state::backward});
    // At most one unit of reduce-scatters in flight: the previous unit's, which ran behind this
    // unit's backward, finish now (and this unit's at once without overlap_reduce_scatter).
    for (std::size_t u : reducing_)
      for (std::size_t b : units_[u].buckets) this->finish_reduce_gradients(b);
    reducing_.clear();
    for (std::size_t b : units_[unit].buckets) {
      if (sync) this->begin_reduce_gradients(b);
      this->reshard(b);
    }
    if (sync) {
      if (this->options().overlap_reduce_scatter) reducing_.push_back(unit);
      else for (std::size_t b : units_[unit].buckets) this->finish_reduce_gradients(b);
    }
    state_[unit] = unit_state::backward_done;
  }
  // Finishes every reduce-scatter in flight (before the optimizer reads the gradients).
  void finish_backward() override {
    for (std::size_t u = 0; u < units_.size(); ++u)
      if (state_[u] == unit_state::backward)
        throw std::logic_error("kfsdp::fsdp: finish_backward() while unit " + describe(u) +
                               " is in backward (after_backward first)");
    this->finish_gradient_reductions();
    reducing_.clear();
  }
  // Frees every gathered unit (after an evaluation, which has no backward).
  void reshard_all() override {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (state_[u] == unit_state::backward)
        throw std::logic_error("kfsdp::fsdp: reshard_all() while unit " + describe(u) + " is in backward");
      for (std::size_t b : units_[u].buckets)
        if (this->is_unsharded(b) || this->is_gathering(b)) this->reshard(b);
      state_[u] = unit_state::sharded;
    }
  }

  // The engine's table and the units both from one graph of the model.
  fsdp(const model_graph& graph, const Model& model, comm::any_communicator comm, fsdp_options options)
      : engine(graph.params, std::move(comm), with_policies(options), planned()),
        model_(model),
        units_(make_units(graph, this->plan(), this->options().wrap)),
        state_(units_.size(), unit_state::sharded) {}

  // The engine's plan: the compile-time one with static_world_size<N> (checked against the communicator).
  static std::optional<shard_plan> planned() {
    if constexpr (static_world_size == 0)
      return std::nullopt;
    else
      return to_dynamic(static_plan);
  }
  static fsdp_options with_policies(fsdp_options o) {
    if (o.sharding_strategy && *o.sharding_strategy != sharding)
      throw std::invalid_argument("kfsdp::fsdp: options.sharding_strategy is " + std::string(to_string(*o.sharding_strategy)) +
                                  ", but the policies select " + std::string(to_string(sharding)) +
                                  " (leave it unset, or make them agree)");
    if (o.bucketing_strategy && *o.bucketing_strategy != bucketing_strategy)
      throw std::invalid_argument("kfsdp::fsdp: options.bucketing_strategy is " +
                                  std::string(to_string(*o.bucketing_strategy)) + ", but the policies select " +
                                  std::string(to_string(bucketing_strategy)) + " (leave it unset, or make them agree)");
    o.sharding_strategy = sharding;
    o.bucketing_strategy = bucketing_strategy;
    return o;
  }
  std::size_t checked(std::size_t unit, const char* hook) const {
    if (unit >= units_.size())
      throw std::out_of_range("kfsdp::fsdp: " + std::string(hook) + "(unit " + std::to_string(unit) +
                              "): the model has units 0.." + std::to_string(units_.size() - 1));
    return unit;
  }
  std::string describe(std::size_t unit) const { return std::to_string(unit) + " '" + units_[unit].name + "'"; }
  void expect(std::size_t unit, const char* hook, std::initializer_list<unit_state> allowed) const {
    checked(unit, hook);
    for (unit_state s : allowed)
      if (state_[unit] == s) return;
    std::string expected;
    for (unit_state s : allowed) expected += (expected.empty() ? "'" : " or '") + std::string(state_name(s)) + "'";
    throw std::logic_error("kfsdp::fsdp: " + std::string(hook) + "(unit " + describe(unit) + ") while the unit is '" +
                           std::string(state_name(state_[unit])) + "', expected " + expected);
  }
  void gather(std::size_t unit, std::optional<std::size_t> next) {
    for (std::size_t b : units_[unit].buckets) this->begin_unshard(b);
    if (next)  // overlaps this unit's compute
      for (std::size_t b : units_[checked(*next, "prefetch")].buckets) this->begin_unshard(b);
    for (std::size_t b : units_[unit].buckets) this->finish_unshard(b);
  }

  Model model_;
  std::vector<fsdp_unit> units_;
  std::vector<unit_state> state_;
  std::vector<std::size_t> reducing_;  // units whose reduce-scatters are in flight
};

namespace detail {
// An fsdp<>'s unit hooks, for kfsdp's own tests of their state machine (users train through kfsdp::trainer).
struct unit_hook_access {
  template <class Model, class Scalar, class... Policies>
  static unit_hooks& of(fsdp<Model, Scalar, Policies...>& engine) noexcept {
    return engine;
  }
};
}  // namespace detail

// Thunder's enum API: runs f(engine) with the fsdp<Model, Scalar, ...> that options select.
KFSDP_EXPORT template <class Scalar, descriptor Model, class F>
decltype(auto) with_fsdp(const Model& model, comm::any_communicator comm, const fsdp_options& options, F&& f) {
  return meta::mp_with_index<2>(static_cast<std::size_t>(options.sharding()), [&](auto s) -> decltype(auto) {
    return meta::mp_with_index<3>(static_cast<std::size_t>(options.bucketing()), [&](auto b) -> decltype(auto) {
      fsdp<Model, Scalar, sharding_policy<static_cast<sharding_strategy>(decltype(s)::value)>,
           bucketing_policy<static_cast<bucketing>(decltype(b)::value)>>
          engine(model, comm, options);
      return f(engine);
    });
  });
}

}  // namespace kfsdp
