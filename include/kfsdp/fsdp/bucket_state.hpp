#pragma once
// bucket_state<Scalar> — one bucket's parameters and gradients through a step, as a state machine
// (compiled in src/fsdp/bucket_state.cpp). The engine owns one per bucket and orders them.
//
//   parameters:  sharded ──begin_gather──▶ gathering ──finish_gather──▶ unsharded ──free──▶ sharded
//                (all-gathers issued; finish waits for them; free gives the buffers back)
//   gradients:   none ──grad──▶ accumulating ──begin_reduce──▶ reducing ──finish_reduce──▶ none
//                (grad hands out the full gradient, zero at first; begin_reduce issues the
//                reduce-scatters; finish_reduce waits and adds the averaged shard to the gradients;
//                while the bucket's gradient shard is known to be zero, the reduce-scatters write
//                it directly and average it too: no buffer, no add and no pass of its own)
//   HSDP:        ... reducing ──finish_reduce──▶ summing ──finish_replica_sum──▶ none
//                (finish_reduce issues the all-reduce over the replicas and returns: it runs behind
//                the rest of the backward; finish_replica_sum waits for it and adds the shard)
//
// A transition from any other state throws std::logic_error naming the bucket, the state it is in
// and the one expected.
//
// A full bucket (world_size · S elements, S: its shard on one rank) has two layouts, both computed
// by plan/shard_mapping.hpp and converted by fsdp/pack.hpp:
//   gathered  rank-major, (world_size, S): each rank's shard whole, as one collective of the shards
//             leaves it;
//   unpacked  parameter-major: each parameter's chunks in rank order, its padding last, as the
//             parameter's own all-gather leaves it, so each parameter starts with its full tensor.
// Linear(1, 3) at world size 2, one bucket: weight w [3,1] and bias b [3], chunks of 2 rows, S = 4
// (w2: w's element 2, ·: padding; test_bucket_state.cpp checks it):
//   gathered  [w0 w1 b0 b1 | w2 · b2 ·]
//   unpacked  [w0 w1 w2 · | b0 b1 b2 ·]   (w is [0, 3), b is [4, 7))
// The layers read the unpacked layout and the gradients live in it; only int8's all-gather (each
// rank's wire buffer whole) and broadcast_from use the gathered one.
//
// No copy around the collectives: the bucket's parameters are all-gathered as one batch, each from
// its chunk of the local shard straight into its padded place of the unpacked buffer, where the
// layers read it (comm::iall_gather_parts: over MPI one message a peer); each gradient is
// reduce-scattered from the unpacked layout straight into its chunk of the reduced shard, the
// bucket's reduce-scatters issued together and complete as one request (comm::when_all). With a
// wire type (mixed precision) the shard is converted before and the gathered buffer after, flat;
// with int8 the shard is quantized into one wire buffer and the bucket's all-gather is one
// collective, and the gradients are quantized per destination rank and exchanged by one
// all-to-all (qgZ).

#include <optional>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>
#include <Kokkos_Core.hpp>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/fsdp/buffer_pool.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/fsdp/storage.hpp>
#include <kfsdp/fsdp/trace.hpp>
#include <kfsdp/meta/enum_names.hpp>
#include <kfsdp/plan/shard_mapping.hpp>

namespace kfsdp {

enum class param_phase { sharded, gathering, unsharded };
enum class grad_phase { none, accumulating, reducing, summing };

inline constexpr enum_names<param_phase, 3> param_phase_names = {
    {param_phase::sharded, "sharded"}, {param_phase::gathering, "gathering"}, {param_phase::unsharded, "unsharded"}};
inline constexpr enum_names<grad_phase, 4> grad_phase_names = {{grad_phase::none, "none"},
                                                                {grad_phase::accumulating, "accumulating"},
                                                                {grad_phase::reducing, "reducing"},
                                                                {grad_phase::summing, "summing"}};
constexpr std::string_view to_string(param_phase phase) noexcept { return name_of(param_phase_names, phase); }
constexpr std::string_view to_string(grad_phase phase) noexcept { return name_of(grad_phase_names, phase); }

// What every bucket's transitions use, owned by the engine.
template <class Scalar>
struct bucket_context {
  comm::any_communicator& comm;
  buffer_pool<Scalar>& pool;
  const shard_mapping& map;
  sharded_storage<Scalar>& shards;
  sharded_storage<Scalar>& grads;
  trace_recorder* trace = nullptr;
  std::size_t bytes_communicated = 0;  // every collective buffer so far
  wire_precision param_dtype = wire_precision::scalar;   // what the all-gathers carry
  wire_precision reduce_dtype = wire_precision::scalar;  // what the reduce-scatters carry
  comm::any_communicator* replicas = nullptr;             // HSDP: the shard's replicas in other groups
  std::vector<std::uint8_t> frozen{};                     // per parameter: 1 = its gradient is never reduced
  bool norm_with_reductions = false;  // finish_reduce takes the shard's Σ g² (someone will ask for it)
  // Where the engine's kernels run (the compute stream on a GPU): collectives are ordered after its
  // work and its later work after them, by events where the backend has streams, never a global fence.
  Kokkos::DefaultExecutionSpace compute{};
  [[nodiscard]] bool is_frozen(std::size_t p) const { return p < frozen.size() && frozen[p] != 0; }
  // Whether a reduced shard is summed over replicas next (HSDP with more than one group).
  [[nodiscard]] bool replicated() const { return replicas != nullptr && replicas->size() > 1; }
};

template <class Scalar>
class bucket_state {
 public:
  using view = Kokkos::View<Scalar*>;

  bucket_state(std::size_t bucket, const shard_mapping& map);

  [[nodiscard]] std::size_t index() const noexcept { return bucket_; }
  [[nodiscard]] param_phase params() const noexcept { return params_; }
  [[nodiscard]] grad_phase grads() const noexcept { return grads_; }
  // Moves on at every gathering and every free: param()'s views hold while it is unchanged.
  [[nodiscard]] std::uint64_t params_version() const noexcept { return params_version_; }

  void begin_gather(bucket_context<Scalar>& ctx);   // sharded → gathering
  void finish_gather(bucket_context<Scalar>& ctx);  // gathering → unsharded
  void free(bucket_context<Scalar>& ctx);           // any → sharded (waits for an all-gather in flight)
  // Parameter p (of this bucket), full and unpadded; unsharded only.
  [[nodiscard]] view param(const bucket_context<Scalar>& ctx, std::size_t p) const;

  // Parameter p's full gradient, accumulated into (none → accumulating; not while reducing or
  // summing: a collective may still read or write the buffers).
  [[nodiscard]] view grad(bucket_context<Scalar>& ctx, std::size_t p);
  // Frozen parameters (ctx.frozen) are left out: their gradient shard stays zero and no byte of
  // theirs is sent; a bucket of frozen parameters only goes back to none without a collective.
  // none | accumulating → reducing (no gradient: zeros); the packed gradients are multiplied by
  // `before` first, the reduced shard by `after` (1: not at all; before · after = 1 / world size:
  // the average). Where the shard receives the sums itself, the reduce-scatters multiply by `after`.
  void begin_reduce(bucket_context<Scalar>& ctx, Scalar before = 1, Scalar after = 1);
  // reducing → none: grads += reduced shard · after. Replicated (ctx.replicated()): reducing →
  // summing, the replicas' all-reduce of the reduced shard issued and left in flight.
  void finish_reduce(bucket_context<Scalar>& ctx);
  // summing → none: waits for the replicas' all-reduce, then grads += summed shard · after.
  void finish_replica_sum(bucket_context<Scalar>& ctx);
  // Tests the collectives in flight (MPI moves them on inside its calls). Never blocks and changes
  // no phase: a collective seen complete leaves its request empty, and the finish that comes next
  // has nothing left to wait for.
  void progress() {
    (void)gather_pending_.test();
    (void)reduce_pending_.test();
    (void)replica_sum_pending_.test();
  }
  // Whether this bucket's gradient shard holds zeros that nothing else will write before its next
  // reduction (the engine's zero_grad says so; any other write access, and each reduction, not).
  void set_shard_grads_zero(bool zero) noexcept {
    shard_grads_zero_ = zero;
    if (zero) shard_grad_squared_norm_ = 0.0;
    else shard_grad_squared_norm_.reset();  // whoever writes may change it
  }
  // Σ g² over this rank's gradient shard of the bucket, in double, as the last reduction left it
  // (summed while the shard is fresh from it, where ctx.norm_with_reductions asked); none while a
  // reduction is in flight, after write access, or where the reduction was not asked to sum.
  [[nodiscard]] std::optional<double> shard_grad_squared_norm() const noexcept { return shard_grad_squared_norm_; }

 private:
  // A wire type to convert from: the gathered buffer is not the parameters.
  [[nodiscard]] bool unpacks() const noexcept { return gathered_as_ != wire_precision::scalar; }
  // The bucket's parameters all-gathered as one batch: each from its chunk of `from` (the shard)
  // into its padded place in `to` (comm::iall_gather_parts).
  template <class T>
  [[nodiscard]] comm::request gather_params(bucket_context<Scalar>& ctx, const Kokkos::View<T*>& from,
                                            const Kokkos::View<T*>& to) const;
  // The bucket's gradients reduce-scattered as one batch, times `factor`: each unfrozen
  // parameter's padded gradient in `from` into its chunk of `to` (comm::ireduce_scatter_sum_parts).
  template <class T>
  [[nodiscard]] comm::request reduce_params(bucket_context<Scalar>& ctx, const Kokkos::View<T*>& from,
                                            const Kokkos::View<T*>& to, comm::scale_type<T> factor) const;
  // A pooled Scalar buffer with room for numel elements of `wire`.
  [[nodiscard]] view acquire_wire(bucket_context<Scalar>& ctx, const char* label, std::size_t numel,
                                  wire_precision wire,
                                  typename buffer_pool<Scalar>::fill how = buffer_pool<Scalar>::fill::none);
  // A pooled Scalar buffer with room for `bytes` bytes (int8's wire buffers).
  [[nodiscard]] view acquire_bytes(bucket_context<Scalar>& ctx, const char* label, std::size_t bytes);
  [[noreturn]] void wrong_phase(const char* transition, std::string_view seen, std::string_view expected) const;
  // The chunks of the bucket's shard that are not frozen, adjacent ones merged (a frozen weight
  // beside trainable ones: one or two runs), as offsets in the shard.
  [[nodiscard]] std::vector<index_range> unfrozen_runs(const bucket_context<Scalar>& ctx) const;
  // The reduced shard into the gradients (times after_), its norm, the buffers back: the last step
  // of a reduction, once every collective on reduced_grads_ is complete.
  void add_reduced_shard(bucket_context<Scalar>& ctx);

  std::size_t bucket_;
  std::size_t first_param_;
  std::size_t param_count_;
  param_phase params_ = param_phase::sharded;
  std::uint64_t params_version_ = 0;
  grad_phase grads_ = grad_phase::none;
  bool shard_grads_zero_ = true;  // the storage starts at zero
  std::optional<double> shard_grad_squared_norm_ = 0.0;  // see shard_grad_squared_norm()
  bool reduces_in_place_ = false;  // the reduction in flight writes the gradient shard itself (and,
                                   // unless replicated, its reduce-scatters multiply by after_)
  Scalar after_ = 1;               // the reduction in flight's factor on the reduced shard
  wire_precision gathered_as_ = wire_precision::scalar;  // what gathered_ holds
  wire_precision reduced_as_ = wire_precision::scalar;   // what packed_grads_ (once issued) and reduced_grads_ hold
  view send_;           // the shard converted to the wire type (mixed precision only)
  view gathered_;       // what the all-gathers wrote: unpacked layout; int8: every rank's wire buffer, rank-major
  view unpacked_;       // gathered_ converted to Scalar (mixed precision only)
  view full_grads_;     // the bucket's full gradients, in the unpacked layout
  view packed_grads_;   // full_grads_ converted to the wire type (mixed precision; int8: every rank's wire buffer)
  view received_grads_; // int8: every rank's wire buffer for this rank, as the all-to-all delivered them
  view reduced_grads_;  // the reduce-scatters' output: this rank's summed shard
  comm::request gather_pending_;
  comm::request reduce_pending_;
  comm::request replica_sum_pending_;  // HSDP: the replicas' all-reduce, pinning reduced_grads_
  double gather_issued_at_ = 0;  // trace times
  double reduce_issued_at_ = 0;
  double replica_sum_issued_at_ = 0;
  std::size_t gather_bytes_ = 0;  // of the collectives in flight
  std::size_t reduce_bytes_ = 0;
  std::size_t replica_sum_bytes_ = 0;
};

extern template class bucket_state<float>;
extern template class bucket_state<double>;

}  // namespace kfsdp
