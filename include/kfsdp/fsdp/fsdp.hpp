#pragma once
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
// The schedule works on stages: contiguous ranges of parameters that compute together (the GPT's
// embeddings, each block, the head). Around a stage's forward and backward:
//   before_forward(stage, next)  gather the stage's buckets, prefetch the next stage's
//   after_forward(stage)         zero3: free them; zero2: keep them for backward
//   before_backward(stage, next) zero3: gather again (prefetching the next); zero2: nothing to do
//   after_backward(stage)        issue the gradients' reduce-scatters (they run behind the next
//                                stage's backward: the previous stage's are finished here), free
//                                the parameters; finish_gradient_reductions() before the optimizer

#ifndef KFSDP_MODULE
#include <optional>
#include <utility>
#endif

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/meta/type_list.hpp>
#include <kfsdp/model/descriptor.hpp>
#include <kfsdp/model/param_table.hpp>

namespace kfsdp {

template <descriptor Model, class Scalar, class... Policies>
class fsdp : public fsdp_engine<Scalar> {
  using policies = detail::fsdp_policies<Policies...>;
  using engine = fsdp_engine<Scalar>;

 public:
  static constexpr kfsdp::sharding_strategy sharding = policies::sharding;
  static constexpr kfsdp::bucketing bucketing_strategy = policies::bucketing_strategy;

  // options' sharding and bucketing are those of the policies; the rest is taken as given.
  fsdp(const Model& model, comm::any_communicator comm, fsdp_options options = {})
      : engine(make_param_table(model), std::move(comm), with_policies(options)), model_(model) {}

  [[nodiscard]] const Model& model() const noexcept { return model_; }

  void before_forward(param_range stage, std::optional<param_range> next = std::nullopt) {
    gather(stage, next);
  }
  void after_forward(param_range stage) {
    if constexpr (sharding == sharding_strategy::zero3) for_buckets(stage, [&](std::size_t b) { this->reshard(b); });
  }
  void before_backward(param_range stage, std::optional<param_range> next = std::nullopt) {
    gather(stage, next);  // zero2: already unsharded, nothing is issued
  }
  // sync = false (gradient accumulation, Thunder's no_sync): the full gradients are kept and
  // summed over micro-batches; the last micro-batch's after_backward(stage, true) reduces them.
  void after_backward(param_range stage, bool sync = true) {
    const auto [first, last] = this->buckets_of(stage);
    for (std::size_t b = first; b < last; ++b) {
      if (sync) this->begin_reduce_gradients(b);
      this->reshard(b);
    }
    // At most one stage of reduce-scatters in flight: the ones issued by later stages finish now
    // (and this stage's too without overlap_reduce_scatter).
    const std::size_t keep_from = this->options().overlap_reduce_scatter ? last : first;
    for (std::size_t b = keep_from; b < this->plan().buckets.size(); ++b) this->finish_reduce_gradients(b);
  }

 private:
  static fsdp_options with_policies(fsdp_options o) {
    o.sharding_strategy = sharding;
    o.bucketing_strategy = bucketing_strategy;
    return o;
  }
  template <class F>
  void for_buckets(param_range stage, F&& f) {
    const auto [first, last] = this->buckets_of(stage);
    for (std::size_t b = first; b < last; ++b) f(b);
  }
  void gather(param_range stage, std::optional<param_range> next) {
    for_buckets(stage, [&](std::size_t b) { this->begin_unshard(b); });
    if (next) for_buckets(*next, [&](std::size_t b) { this->begin_unshard(b); });  // overlaps this stage
    for_buckets(stage, [&](std::size_t b) { this->finish_unshard(b); });
  }

  Model model_;
};

// Thunder's enum API: runs f(engine) with the fsdp<Model, Scalar, ...> that options select.
template <class Scalar, descriptor Model, class F>
decltype(auto) with_fsdp(const Model& model, comm::any_communicator comm, const fsdp_options& options, F&& f) {
  return meta::mp_with_index<2>(static_cast<std::size_t>(options.sharding_strategy), [&](auto s) -> decltype(auto) {
    return meta::mp_with_index<3>(static_cast<std::size_t>(options.bucketing_strategy), [&](auto b) -> decltype(auto) {
      fsdp<Model, Scalar, sharding_policy<static_cast<sharding_strategy>(decltype(s)::value)>,
           bucketing_policy<static_cast<bucketing>(decltype(b)::value)>>
          engine(model, comm, options);
      return f(engine);
    });
  });
}

}  // namespace kfsdp
