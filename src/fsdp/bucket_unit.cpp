// bucket_unit<float|double>: one bucket's state machine (see include/kfsdp/fsdp/bucket_unit.hpp).
#include <stdexcept>

#include <KokkosBlas1_scal.hpp>
#include <fmt/format.h>

#include <kfsdp/fsdp/bucket_unit.hpp>
#include <kfsdp/fsdp/pack.hpp>

namespace kfsdp {

template <class Scalar>
bucket_unit<Scalar>::bucket_unit(std::size_t bucket, const shard_mapping& map)
    : bucket_(bucket),
      first_param_(map.plan().buckets[bucket].first_param),
      param_count_(map.plan().buckets[bucket].param_count) {}

template <class Scalar>
void bucket_unit<Scalar>::wrong_phase(const char* transition, std::string_view seen, std::string_view expected) const {
  throw std::logic_error(fmt::format("kfsdp::fsdp: bucket {} cannot {}: it is {}, expected {}", bucket_, transition,
                                     seen, expected));
}

template <class Scalar>
void bucket_unit<Scalar>::begin_gather(unit_context<Scalar>& ctx) {
  if (params_ != param_phase::sharded) wrong_phase("begin its all-gather", to_string(params_), "sharded");
  const index_range rank_shard = ctx.map.rank_shard(bucket_, 0);
  gathered_ = ctx.pool.acquire("kfsdp::gathered", rank_shard.count * ctx.map.world_size());
  if (ctx.trace) gather_issued_at_ = ctx.trace->now();
  gather_pending_ = ctx.comm.iall_gather(const_span_of(ctx.shards.bucket(bucket_)), span_of(gathered_));
  ctx.bytes_communicated += gathered_.extent(0) * sizeof(Scalar);
  params_ = param_phase::gathering;
}

template <class Scalar>
void bucket_unit<Scalar>::finish_gather(unit_context<Scalar>& ctx) {
  if (params_ != param_phase::gathering) wrong_phase("finish its all-gather", to_string(params_), "gathering");
  gather_pending_.wait();
  params_ = param_phase::unsharded;
  // From issue to the wait's return: with an overlapping backend most of it hides behind compute.
  if (ctx.trace)
    ctx.trace->complete("all_gather", "comm", trace_recorder::comm_lane, gather_issued_at_, std::int64_t(bucket_),
                        gathered_.extent(0) * sizeof(Scalar));
  if (single()) return;
  const trace_recorder::scope region(ctx.trace, "unpack", "compute", trace_recorder::compute_lane,
                                     std::int64_t(bucket_), 0);
  unpacked_ = ctx.pool.acquire("kfsdp::unpacked", ctx.map.plan().buckets[bucket_].full_numel);
  for (std::size_t p = first_param_; p < first_param_ + param_count_; ++p)
    kernels::unpack_param<Scalar>(gathered_, ctx.map, p, unpacked_);
  Kokkos::fence();
  ctx.pool.release(gathered_);
}

template <class Scalar>
void bucket_unit<Scalar>::free(unit_context<Scalar>& ctx) {
  gather_pending_.wait();  // never free a buffer a collective still writes
  params_ = param_phase::sharded;
  ctx.pool.release(gathered_);
  ctx.pool.release(unpacked_);
}

template <class Scalar>
typename bucket_unit<Scalar>::view bucket_unit<Scalar>::param(const unit_context<Scalar>& ctx, std::size_t p) const {
  if (params_ != param_phase::unsharded) wrong_phase("hand out a parameter", to_string(params_), "unsharded");
  // A one-parameter bucket's gathered buffer is the padded parameter: its real rows come first.
  return Kokkos::subview(single() ? gathered_ : unpacked_, ctx.map.unpacked(p).pair());
}

template <class Scalar>
typename bucket_unit<Scalar>::view bucket_unit<Scalar>::grad(unit_context<Scalar>& ctx, std::size_t p) {
  if (grads_ == grad_phase::reducing) wrong_phase("hand out a gradient", to_string(grads_), "none or accumulating");
  if (grads_ == grad_phase::none) {
    // One parameter: the padded layout, so the buffer is the reduce-scatter's input as it is.
    const std::size_t n = single() ? ctx.map.padded_numel(p) : ctx.map.plan().buckets[bucket_].full_numel;
    full_grads_ = ctx.pool.acquire("kfsdp::full_grads", n, buffer_pool<Scalar>::fill::zeros);  // padding stays zero
    grads_ = grad_phase::accumulating;
  }
  return Kokkos::subview(full_grads_, ctx.map.unpacked(p).pair());
}

template <class Scalar>
void bucket_unit<Scalar>::begin_reduce(unit_context<Scalar>& ctx, Scalar before) {
  if (grads_ == grad_phase::reducing) wrong_phase("begin its reduce-scatter", to_string(grads_), "none or accumulating");
  if (grads_ == grad_phase::none) (void)grad(ctx, first_param_);  // no gradient reached it: zeros
  const std::size_t shard = ctx.map.rank_shard(bucket_, 0).count;
  packed_grads_ = full_grads_;  // one parameter: already in the padded layout
  if (!single()) {
    packed_grads_ = ctx.pool.acquire("kfsdp::packed_grads", shard * ctx.map.world_size());
    for (std::size_t p = first_param_; p < first_param_ + param_count_; ++p)
      kernels::pack_param<Scalar>(full_grads_, ctx.map, p, packed_grads_);
    ctx.pool.release(full_grads_);
  }
  if (before != Scalar(1)) KokkosBlas::scal(packed_grads_, before, packed_grads_);
  reduced_grads_ = ctx.pool.acquire("kfsdp::reduced_grads", shard);
  Kokkos::fence();
  if (ctx.trace) reduce_issued_at_ = ctx.trace->now();
  reduce_pending_ = ctx.comm.ireduce_scatter_sum(const_span_of(packed_grads_), span_of(reduced_grads_));
  ctx.bytes_communicated += packed_grads_.extent(0) * sizeof(Scalar);
  grads_ = grad_phase::reducing;
}

template <class Scalar>
void bucket_unit<Scalar>::finish_reduce(unit_context<Scalar>& ctx, Scalar after) {
  if (grads_ != grad_phase::reducing) wrong_phase("finish its reduce-scatter", to_string(grads_), "reducing");
  reduce_pending_.wait();
  grads_ = grad_phase::none;
  if (ctx.trace)
    ctx.trace->complete("reduce_scatter", "comm", trace_recorder::comm_lane, reduce_issued_at_, std::int64_t(bucket_),
                        packed_grads_.extent(0) * sizeof(Scalar));
  kernels::accumulate_scaled<Scalar>(ctx.grads.bucket(bucket_), reduced_grads_, after);
  Kokkos::fence();
  ctx.pool.release(reduced_grads_);
  if (packed_grads_.data() == full_grads_.data()) packed_grads_ = view();  // the same buffer: count it once
  ctx.pool.release(packed_grads_);
  ctx.pool.release(full_grads_);
}

template class bucket_unit<float>;
template class bucket_unit<double>;

}  // namespace kfsdp
