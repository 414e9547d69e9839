#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// fsdp_engine<Scalar> — everything an FSDP rank does to its parameters, independent of the
// sharding and bucketing policies (compiled once per scalar type in src/fsdp/). It owns the plan
// and its collaborators, split the way FSDP works:
//   shard_mapping     every offset (plan/shard_mapping.hpp)
//   sharded_storage   the parameter and gradient shards (fsdp/storage.hpp)
//   bucket_state      one bucket's gather / free / reduce state machine (fsdp/bucket_state.hpp)
//   buffer_pool       the unsharded buffers and their byte counts (fsdp/buffer_pool.hpp)
//   state-dict IO     initialisation, broadcast_from, load and gather of full state dicts
//                     (src/fsdp/state_dict_io.cpp)
// and orders the buckets' transitions: the limit on all-gathers in flight, finishing a reduction
// before its gradient is touched again.
//
//   kfsdp::fsdp_engine<float> e(kfsdp::make_param_table(model), comm, {.bucketing_strategy = kfsdp::bucketing::layer});
//   e.initialize(seed, choose_init);        // each rank evaluates its own rows only
// and, through the schedule (fsdp/scheduler.hpp), which alone issues a bucket's collectives:
//   unshard(b)                             all-gather bucket b
//   e.full_param(p)                        the full, unpadded parameter p (dim0 · row_numel)
//   e.full_grad(p) ...                     accumulate p's full gradient here
//   reduce_gradients(b)                    pack, reduce-scatter, divide by world size
//   reshard(b)                             free the unsharded buffers

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include <Kokkos_Core.hpp>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/fsdp/bucket_state.hpp>
#include <kfsdp/fsdp/buffer_pool.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/fsdp/pack.hpp>
#include <kfsdp/fsdp/storage.hpp>
#include <kfsdp/fsdp/trace.hpp>
#include <kfsdp/tensor/state_dict.hpp>
#include <kfsdp/model/param_table.hpp>
#include <kfsdp/plan/shard_mapping.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

using kernels::param_init;

// A parameter's default initialisation, from its layer's rule (param_info::init): nn.Linear's
// U(±1/√fan_in), LayerNorm's ones and zeros, Embedding's N(0, 1).
inline param_init default_init(const param_info& p) {
  switch (p.init.kind) {
    case init_rule::ones: return {param_init::ones, 0.0};
    case init_rule::normal: return {param_init::normal, p.init.scale};
    case init_rule::uniform:
      return {param_init::uniform, p.init.fan_in > 0 ? 1.0 / std::sqrt(double(p.init.fan_in)) : p.init.scale};
    case init_rule::zeros: break;
  }
  return {param_init::zeros, 0.0};
}

// Bytes a rank holds (memory accounting).
struct memory_report {
  std::size_t sharded_params = 0;  // flat parameter storage
  std::size_t sharded_grads = 0;   // flat gradient storage
  std::size_t unsharded_now = 0;   // gathered / unpacked parameters and full gradients alive now
  std::size_t unsharded_peak = 0;  // the most of those alive at once since the last reset
  std::size_t cached = 0;          // freed buffers kept for reuse (not in unsharded_now)
};

// A contiguous range of parameters [first, last) (buckets_of tells which buckets hold them).
struct param_range {
  std::size_t first = 0;
  std::size_t last = 0;
};

namespace detail {
template <class Scalar>
class bucket_collectives;
}

KFSDP_EXPORT template <class Scalar>
class fsdp_engine {
 public:
  using scalar_type = Scalar;
  using flat_view = Kokkos::View<Scalar*>;
  using initializer = std::function<param_init(const param_info&)>;

  // The plan is make_shard_plan's for the communicator's size, or `plan` where one is given (say
  // to_dynamic(static_shard_plan<Model, N, B>), computed at compile time): a communicator of
  // another size, or a plan of another table or bucketing, throws std::invalid_argument naming both.
  fsdp_engine(std::vector<param_info> table, comm::any_communicator comm, const fsdp_options& options,
              std::optional<shard_plan> plan = std::nullopt);
  fsdp_engine(const fsdp_engine&) = delete;
  fsdp_engine& operator=(const fsdp_engine&) = delete;
  ~fsdp_engine();

  [[nodiscard]] const shard_plan& plan() const noexcept { return plan_; }
  // Every offset of the plan: a rank's rows, a chunk in storage or in a gathered buffer, ...
  [[nodiscard]] const shard_mapping& mapping() const noexcept { return map_; }
  [[nodiscard]] std::span<const param_info> params() const noexcept { return table_; }
  [[nodiscard]] const fsdp_options& options() const noexcept { return options_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  // The ranks of the shard group (the plan's world size; every rank under flat FSDP).
  [[nodiscard]] int world_size() const noexcept { return world_size_; }
  [[nodiscard]] comm::any_communicator& communicator() noexcept { return comm_; }
  // HSDP: the shard groups (1 under flat FSDP); the gradients are averaged over all their ranks.
  [[nodiscard]] int replica_count() const noexcept { return replica_count_; }
  [[nodiscard]] int data_parallel_size() const noexcept { return world_size_ * replica_count_; }
  // Sums `values` over every rank of every shard group (collective), e.g. a loss.
  void sum_over_ranks(std::span<double> values);
  // Index of the parameter with this dotted name; throws naming it when there is none.
  [[nodiscard]] std::size_t param_index(std::string_view name) const;

  [[nodiscard]] sharded_storage<Scalar>& shards() noexcept { return shards_; }
  [[nodiscard]] const sharded_storage<Scalar>& shards() const noexcept { return shards_; }
  // Write access to the gradient shards: from here on every bucket's next reduction adds into them.
  [[nodiscard]] sharded_storage<Scalar>& grads() noexcept {
    for (auto& bucket : buckets_) bucket.set_shard_grads_zero(false);
    return grads_;
  }
  // Read access to the gradient shards, without grads()'s effect on the next reduction.
  [[nodiscard]] const sharded_storage<Scalar>& grad_shards() const noexcept { return grads_; }

  // --- initialisation (collective when options().broadcast_from is set) ---
  // Every parameter from choose(info): zeros, ones or normal(0, std) keyed by (seed, parameter,
  // global element), so the model starts from the same weights at every world size.
  void initialize(std::uint64_t seed, const initializer& choose);
  // The same with every parameter's default_init.
  void initialize(std::uint64_t seed) { initialize(seed, default_init); }
  // Shards a full state dict (every name, shape and dtype checked first: nothing half-loaded).
  // With broadcast_from = r only rank r's state dict is read; the others may pass an empty one.
  void load_original_state_dict(const state_dict& full);
  // The full, unpadded parameters under their names, gathered one at a time (collective).
  // rank0_only: the other ranks return an empty state dict.
  [[nodiscard]] state_dict original_state_dict(bool rank0_only = false);
  // The same for the gradient shards: the full, averaged gradients under the parameters' names.
  [[nodiscard]] state_dict original_grad_dict(bool rank0_only = false);

  // --- the full parameters and gradients of gathered buckets (what a pass's layers read and write) ---
  // The full, unpadded parameter (dim0 · row_numel, row-major) while its bucket is unsharded.
  [[nodiscard]] flat_view full_param(std::size_t param) const;
  // Moves on whenever `param`'s bucket is gathered or freed: a view full_param gave holds while it
  // is unchanged (a pass binds a layer's views once per gathering by it).
  [[nodiscard]] std::uint64_t params_version(std::size_t param) const;
  // Where parameter `param`'s full gradient accumulates (zero when first asked for).
  [[nodiscard]] flat_view full_grad(std::size_t param);
  // Finishes every reduction still in flight, reduce-scatters and HSDP's all-reduces over the
  // replicas (before the optimizer reads the gradients).
  void finish_gradient_reductions();
  // Tests every collective in flight, never blocking: MPI moves a collective on only inside its calls.
  void progress();
  // On: the calling thread calls progress() as each kernel and matrix product starts
  // (detail::between_kernels), so that the collectives move on while it computes: overlap without
  // a communication thread, for a rank with no core to spare for one (the examples' --overlap).
  void set_progress_between_kernels(bool on) noexcept;
  // Zeros the gradient shards; each bucket's next reduction then writes its shard instead of
  // adding into it (the same sums, without the add's pass and buffer).
  void zero_grad();
  // Σ g² over this rank's gradient shards in double (clipping's local norm; call it with no reduction
  // in flight), summed bucket by bucket: each bucket's sum taken as its reduction finished, while
  // the shard was fresh (set_grad_norm_with_reductions), or a pass over the bucket's shard now
  // (not asked for, or written since through grads()). The same bits either way.
  [[nodiscard]] double grad_squared_norm() const;
  // Whether each reduction also sums its shard's squares for grad_squared_norm (off: a reduction
  // costs its collective alone). The trainer turns it on: it asks for the norm every step.
  void set_grad_norm_with_reductions(bool on) noexcept { context_.norm_with_reductions = on; }

  // --- frozen parameters (fine-tuning part of a model: FSDP2's requires_grad=False) ---
  // A frozen parameter is still gathered and still passes gradients to the layers below it, but
  // its own gradient is never reduce-scattered (a bucket of frozen parameters sends nothing) and
  // its gradient shard stays zero, so norms and clipping leave it out. The built-in linear and
  // embedding compute no gradient for it (no product, no buffer: a bucket of frozen parameters
  // fills none); another layer computes it into the bucket's buffer, and it is dropped. Under HSDP
  // only the unfrozen chunks are all-reduced over the replicas. Every rank must freeze the same
  // parameters; throws std::logic_error while its bucket holds unreduced gradients.
  void set_frozen(std::size_t param, bool frozen = true);
  [[nodiscard]] bool is_frozen(std::size_t param) const;
  // Per parameter: 1 where frozen.
  [[nodiscard]] std::span<const std::uint8_t> frozen() const noexcept { return context_.frozen; }

  // Buckets a range of parameters touches.
  [[nodiscard]] std::pair<std::size_t, std::size_t> buckets_of(param_range range) const;

  // The most all-gathers that were in flight at once (issued, not yet unpacked) since the last reset.
  [[nodiscard]] std::size_t max_inflight_all_gathers() const noexcept { return max_inflight_; }
  void reset_max_inflight_all_gathers() noexcept { max_inflight_ = inflight_.size(); }

  // Record every collective (and unpack / pack) into `trace` (nullptr: stop recording).
  void set_trace(trace_recorder* trace) noexcept { context_.trace = trace; }
  [[nodiscard]] trace_recorder* trace() const noexcept { return context_.trace; }

  [[nodiscard]] memory_report memory() const noexcept;
  void reset_peak_memory() noexcept { pool_.reset_peak(); }
  // Bytes of every collective buffer so far (all-gathers of the full bucket, reduce-scatters of
  // its parameters that are not frozen).
  [[nodiscard]] std::size_t bytes_communicated() const noexcept { return context_.bytes_communicated; }

 private:
  class state_dict_io;  // src/fsdp/state_dict_io.cpp
  friend class detail::bucket_collectives<Scalar>;

  // --- one bucket's collectives (the schedule's alone: detail::bucket_collectives) ---
  void begin_unshard(std::size_t bucket);   // issue the all-gather (non-blocking)
  void finish_unshard(std::size_t bucket);  // wait for it
  void unshard(std::size_t bucket) {
    begin_unshard(bucket);
    finish_unshard(bucket);
  }
  void reshard(std::size_t bucket);  // free the bucket's unsharded parameters
  [[nodiscard]] bool is_unsharded(std::size_t bucket) const;
  [[nodiscard]] bool is_gathering(std::size_t bucket) const;
  // Packs the bucket's full gradients, reduce-scatters them with SUM, divides by world size and
  // adds the result to the gradient shards; frees the full gradients (collective). The begin /
  // finish halves let the reduce-scatter run behind the next unit's backward.
  void begin_reduce_gradients(std::size_t bucket);
  // Waits for the reduce-scatter; under HSDP issues the replicas' all-reduce and leaves it in flight
  // (it runs behind the rest of the backward; finish_reduce_gradients waits for it).
  void finish_reduce_scatter(std::size_t bucket);
  // Waits for every collective of the bucket's reduction: the gradient shard is final.
  void finish_reduce_gradients(std::size_t bucket);
  void reduce_gradients(std::size_t bucket) {
    begin_reduce_gradients(bucket);
    finish_reduce_gradients(bucket);
  }
  // A reduce-scatter or an all-reduce over the replicas of the bucket is in flight.
  [[nodiscard]] bool is_reducing(std::size_t bucket) const;

  void check_bucket(std::size_t bucket, const char* where) const;
  void check_param(std::size_t param, const char* where) const;

  std::vector<param_info> table_;
  comm::any_communicator comm_;
  fsdp_options options_;
  int rank_ = 0;
  int world_size_ = 1;
  int replica_count_ = 1;
  division_factors division_;  // the gradients' factors around the SUM, fixed by the options and ranks
  shard_plan plan_;
  shard_mapping map_{plan_};
  std::unordered_map<std::string, std::size_t> index_;
  sharded_storage<Scalar> shards_;
  sharded_storage<Scalar> grads_;
  buffer_pool<Scalar> pool_;
  bucket_context<Scalar> context_{comm_, pool_, map_, shards_, grads_};
  std::vector<bucket_state<Scalar>> buckets_;
  std::deque<std::size_t> inflight_;  // buckets whose all-gather is issued, oldest first
  std::size_t max_inflight_ = 0;
};

namespace detail {
// The engine's per-bucket collectives, private to it: the schedule (fsdp/scheduler.hpp) issues them
// through this handle, as do kfsdp's own tests and benchmarks of the collectives.
//   kfsdp::detail::bucket_collectives buckets(engine);
//   buckets.unshard(b);  ...  buckets.reduce_gradients(b);  buckets.reshard(b);
template <class Scalar>
class bucket_collectives {
 public:
  explicit bucket_collectives(fsdp_engine<Scalar>& engine) noexcept : e_(engine) {}
  void begin_unshard(std::size_t bucket) { e_.begin_unshard(bucket); }
  void finish_unshard(std::size_t bucket) { e_.finish_unshard(bucket); }
  void unshard(std::size_t bucket) { e_.unshard(bucket); }
  void reshard(std::size_t bucket) { e_.reshard(bucket); }
  [[nodiscard]] bool is_unsharded(std::size_t bucket) const { return e_.is_unsharded(bucket); }
  [[nodiscard]] bool is_gathering(std::size_t bucket) const { return e_.is_gathering(bucket); }
  void begin_reduce_gradients(std::size_t bucket) { e_.begin_reduce_gradients(bucket); }
  void finish_reduce_scatter(std::size_t bucket) { e_.finish_reduce_scatter(bucket); }
  void finish_reduce_gradients(std::size_t bucket) { e_.finish_reduce_gradients(bucket); }
  void reduce_gradients(std::size_t bucket) { e_.reduce_gradients(bucket); }
  [[nodiscard]] bool is_reducing(std::size_t bucket) const { return e_.is_reducing(bucket); }

 private:
  fsdp_engine<Scalar>& e_;
};
}  // namespace detail

extern template class fsdp_engine<float>;
extern template class fsdp_engine<double>;

}  // namespace kfsdp
