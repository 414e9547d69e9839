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
// The schedule works on units (fsdp/units.hpp: each block, and the root): unit_scheduler
// (fsdp/scheduler.hpp) gathers, prefetches, frees and reduces around them. It is private:
// kfsdp::trainer (train/trainer.hpp) drives it, and only it, so a user's code cannot step out of
// the trainer's schedule.

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/fsdp/scheduler.hpp>
#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/meta/type_list.hpp>
#include <kfsdp/model/descriptor.hpp>
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

namespace detail {
struct scheduler_access;
}

KFSDP_EXPORT template <descriptor Model, class Scalar, class... Policies>
class fsdp : public fsdp_engine<Scalar> {
  using policies = detail::fsdp_policies<Policies...>;
  using engine = fsdp_engine<Scalar>;
  friend struct detail::scheduler_access;

 public:
  static constexpr kfsdp::sharding_strategy sharding = policies::sharding;
  static constexpr kfsdp::bucketing bucketing_strategy = policies::bucketing_strategy;
  // With static_world_size<N>: N, and the plan computed at compile time, for static_asserts on
  // the bytes per rank; 0 and std::nullopt_t where the communicator sets the world size.
  //   using sharded = kfsdp::fsdp<kfsdp::gpt<48, 1600, 1024>, float, kfsdp::zero3, kfsdp::static_world_size<8>>;
  //   static_assert(4 * sharded::static_plan.shard_numel * sizeof(float) < (std::size_t(80) << 30));  // fits a GPU
  static constexpr std::size_t static_world_size = policies::world_size;
  static constexpr auto static_plan = detail::static_plan_of<policies, Model>();

  using unit_state = typename unit_scheduler<Scalar>::unit_state;

  // options' sharding and bucketing, where set, must be the policies' (std::invalid_argument if not).
  fsdp(const Model& model, comm::any_communicator comm, fsdp_options options = {})
      : fsdp(make_model_graph(model), model, std::move(comm), std::move(options)) {}

  [[nodiscard]] const Model& model() const noexcept { return model_; }
  [[nodiscard]] const std::vector<fsdp_unit>& units() const noexcept { return schedule_.units(); }
  [[nodiscard]] unit_state state(std::size_t unit) const { return schedule_.state(unit); }
  static constexpr std::string_view state_name(unit_state s) noexcept { return unit_scheduler<Scalar>::state_name(s); }

  // The schedule holds this engine by reference.
  fsdp(const fsdp&) = delete;
  fsdp& operator=(const fsdp&) = delete;

 private:
  // The engine's table and the units both from one graph of the model.
  fsdp(const model_graph& graph, const Model& model, comm::any_communicator comm, fsdp_options options)
      : engine(graph.params, std::move(comm), detail::with_policies<policies>(std::move(options), "kfsdp::fsdp"), detail::planned<policies, Model>()),
        model_(model),
        schedule_(*this, make_units(graph, this->plan(), this->options().wrap)) {}

  Model model_;
  unit_scheduler<Scalar> schedule_;
};

namespace detail {
// An fsdp<>'s scheduler, for kfsdp's own tests of its state machine (users train through kfsdp::trainer).
struct scheduler_access {
  template <class Model, class Scalar, class... Policies>
  static unit_scheduler<Scalar>& of(fsdp<Model, Scalar, Policies...>& engine) noexcept {
    return engine.schedule_;
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
