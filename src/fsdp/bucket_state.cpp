// bucket_state<float|double>: one bucket's state machine (see include/kfsdp/fsdp/bucket_state.hpp).
//
// Mixed precision: a collective in bf16 or f16 (the "wire" type) sends a converted copy of the
// shard and receives into a buffer of the wire type. Those buffers come from the same pool as
// the Scalar ones, as Scalar views big enough for the wire elements, seen through wire_view.
// int8 all-gathers quantize the shard into one wire buffer of bytes (fsdp/quantize.hpp), each
// parameter's chunk in blocks of its own, all-gathered as f32 words rank after rank, and dequantize
// each rank's chunk of each parameter straight into its place in the unpacked buffer. int8 gradient
// reductions (qgZ) quantize every rank's chunk of every unfrozen gradient into one wire buffer a
// rank, exchange them with one all-to-all of f32 words, and sum the dequantized contributions to
// this rank's chunks in Scalar; the replicas' all-reduce (HSDP) and the add run in Scalar.
#include <stdexcept>
#include <vector>

#include <KokkosBlas1_scal.hpp>
#include <fmt/format.h>

#include <kfsdp/fsdp/bucket_state.hpp>
#include <kfsdp/fsdp/pack.hpp>
#include <kfsdp/fsdp/quantize.hpp>
#include <kfsdp/optim/clip.hpp>

namespace kfsdp {

namespace {
std::size_t wire_bytes(wire_precision wire, std::size_t scalar_bytes) {
  return wire == wire_precision::scalar ? scalar_bytes : 2;
}

// What a reduction's sums are held in: int8 gradients are summed in Scalar once dequantized.
wire_precision summed_as(wire_precision wire) { return wire == wire_precision::int8 ? wire_precision::scalar : wire; }

// Calls f with a value of the wire type (bf16 or f16).
template <class F>
void with_wire(wire_precision wire, F&& f) {
  if (wire == wire_precision::bf16) f(bf16{});
  else if (wire == wire_precision::f16) f(f16{});
  else throw std::logic_error(fmt::format("kfsdp::fsdp: {} is not a 16-bit wire type", to_string(wire)));
}

// The first n elements of a pooled Scalar buffer, as Wire.
template <class Wire, class Scalar>
Kokkos::View<Wire*> wire_view(const Kokkos::View<Scalar*>& storage, std::size_t n) {
  return Kokkos::View<Wire*>(reinterpret_cast<Wire*>(storage.data()), n);
}
}  // namespace

template <class Scalar>
std::vector<index_range> bucket_state<Scalar>::unfrozen_runs(const bucket_context<Scalar>& ctx) const {
  std::vector<index_range> runs;
  for (std::size_t p = first_param_; p < first_param_ + param_count_; ++p) {
    if (ctx.is_frozen(p)) continue;
    const index_range chunk = ctx.map.bucket_chunk(p);
    if (!runs.empty() && runs.back().last() == chunk.first) runs.back().count += chunk.count;
    else runs.push_back(chunk);
  }
  return runs;
}

template <class Scalar>
bucket_state<Scalar>::bucket_state(std::size_t bucket, const shard_mapping& map)
    : bucket_(bucket),
      first_param_(map.plan().buckets[bucket].first_param),
      param_count_(map.plan().buckets[bucket].param_count) {}

template <class Scalar>
void bucket_state<Scalar>::wrong_phase(const char* transition, std::string_view seen,
                                       std::string_view expected) const {
  throw std::logic_error(fmt::format("kfsdp::fsdp: bucket {} cannot {}: it is {}, expected {}", bucket_,
                                     transition, seen, expected));
}

template <class Scalar>
typename bucket_state<Scalar>::view bucket_state<Scalar>::acquire_wire(
    bucket_context<Scalar>& ctx, const char* label, std::size_t numel, wire_precision wire,
    typename buffer_pool<Scalar>::fill how) {
  const std::size_t bytes = numel * wire_bytes(wire, sizeof(Scalar));
  return ctx.pool.acquire(label, (bytes + sizeof(Scalar) - 1) / sizeof(Scalar), how);
}

template <class Scalar>
typename bucket_state<Scalar>::view bucket_state<Scalar>::acquire_bytes(bucket_context<Scalar>& ctx,
                                                                        const char* label,
                                                                        std::size_t bytes) {
  return ctx.pool.acquire(label, (bytes + sizeof(Scalar) - 1) / sizeof(Scalar));
}

template <class Scalar>
template <class T>
comm::request bucket_state<Scalar>::reduce_params(bucket_context<Scalar>& ctx, const Kokkos::View<T*>& from,
                                                  const Kokkos::View<T*>& to,
                                                  comm::scale_type<T> factor) const {
  using space = typename Kokkos::View<T*>::memory_space;
  std::vector<comm::reduce_scatter_part<T, space>> parts;
  parts.reserve(param_count_);
  for (std::size_t p = first_param_; p < first_param_ + param_count_; ++p)
    if (!ctx.is_frozen(p))
      parts.push_back({const_span_of(Kokkos::subview(from, ctx.map.padded(p).pair())),
                       span_of(Kokkos::subview(to, ctx.map.bucket_chunk(p).pair()))});
  return ctx.comm.template ireduce_scatter_sum_parts<T, space>(parts, factor);
}

template <class Scalar>
template <class T>
comm::request bucket_state<Scalar>::gather_params(bucket_context<Scalar>& ctx, const Kokkos::View<T*>& from,
                                                  const Kokkos::View<T*>& to) const {
  using space = typename Kokkos::View<T*>::memory_space;
  std::vector<comm::gather_part<T, space>> parts;
  parts.reserve(param_count_);
  for (std::size_t p = first_param_; p < first_param_ + param_count_; ++p)
    parts.push_back({const_span_of(Kokkos::subview(from, ctx.map.bucket_chunk(p).pair())),
                     span_of(Kokkos::subview(to, ctx.map.padded(p).pair()))});
  return ctx.comm.template iall_gather_parts<T, space>(parts);
}

template <class Scalar>
void bucket_state<Scalar>::begin_gather(bucket_context<Scalar>& ctx) {
  if (params_ != param_phase::sharded) wrong_phase("begin its all-gather", to_string(params_), "sharded");
  const view local = ctx.shards.bucket(bucket_);
  const std::size_t numel = ctx.map.gathered_numel(bucket_);
  gathered_as_ = ctx.param_dtype;
  if (gathered_as_ == wire_precision::int8) {
    // One wire buffer a rank: the bucket's all-gather is one collective of f32 words.
    const int8_blocks blocks = int8_bucket_blocks(ctx.map, bucket_);
    const std::size_t world = ctx.map.world_size();
    send_ = acquire_bytes(ctx, "kfsdp::gather_send", blocks.bytes());
    gathered_ = acquire_bytes(ctx, "kfsdp::gathered", world * blocks.bytes());
    const auto values = blocks.values(send_.data());
    const auto scales = blocks.scales(send_.data());
    walk_int8_chunks(ctx.map, bucket_, every_param{}, [&](const int8_chunk& c) {
      kernels::quantize_int8<Scalar>(Kokkos::subview(local, c.shard.pair()), Kokkos::subview(values, c.values.pair()),
                                     Kokkos::subview(scales, c.scales.pair()));
    });
    ctx.comm.order_after(ctx.compute);
    if (ctx.trace) gather_issued_at_ = ctx.trace->now();
    using space = typename view::memory_space;
    const comm::gather_part<float, space> whole{
        comm::span_in<const float, space>(reinterpret_cast<const float*>(send_.data()), blocks.words()),
        comm::span_in<float, space>(reinterpret_cast<float*>(gathered_.data()), world * blocks.words())};
    gather_pending_ = ctx.comm.template iall_gather_parts<float, space>(std::span(&whole, 1));
    gather_bytes_ = world * blocks.bytes();
    ctx.bytes_communicated += gather_bytes_;
    params_ = param_phase::gathering;
    return;
  }
  gathered_ = acquire_wire(ctx, "kfsdp::gathered", numel, gathered_as_);
  if (gathered_as_ == wire_precision::scalar) {
    ctx.comm.order_after(ctx.compute);  // the optimizer's last write to the shard
    if (ctx.trace) gather_issued_at_ = ctx.trace->now();
    gather_pending_ = gather_params(ctx, local, gathered_);
  } else {
    with_wire(gathered_as_, [&]<class Wire>(Wire) {
      send_ = acquire_wire(ctx, "kfsdp::gather_send", local.extent(0), gathered_as_);
      const auto send = wire_view<Wire>(send_, local.extent(0));
      kernels::to_wire<Scalar, Wire>(local, Scalar(1), send);
      ctx.comm.order_after(ctx.compute);
      if (ctx.trace) gather_issued_at_ = ctx.trace->now();
      gather_pending_ = gather_params(ctx, send, wire_view<Wire>(gathered_, numel));
    });
  }
  gather_bytes_ = numel * wire_bytes(gathered_as_, sizeof(Scalar));
  ctx.bytes_communicated += gather_bytes_;
  params_ = param_phase::gathering;
}

template <class Scalar>
void bucket_state<Scalar>::finish_gather(bucket_context<Scalar>& ctx) {
  if (params_ != param_phase::gathering) wrong_phase("finish its all-gather", to_string(params_), "gathering");
  gather_pending_.complete_before(comm::stream_of(ctx.compute));  // the layers' kernels come after it
  params_ = param_phase::unsharded;
  ++params_version_;
  ctx.pool.release(send_);
  // From issue to the wait's return: with an overlapping backend most of it hides behind compute.
  if (ctx.trace)
    ctx.trace->complete("all_gather", "comm", trace_recorder::comm_lane, gather_issued_at_, std::int64_t(bucket_),
                        gather_bytes_);
  if (!unpacks()) return;
  const trace_recorder::scope region(ctx.trace, "unpack", "compute", trace_recorder::compute_lane,
                                     std::int64_t(bucket_), 0);
  const std::size_t numel = ctx.map.gathered_numel(bucket_);
  unpacked_ = ctx.pool.acquire("kfsdp::unpacked", numel);
  if (gathered_as_ == wire_precision::int8) {
    // Only the real elements: the layers never read the padding.
    const int8_blocks blocks = int8_bucket_blocks(ctx.map, bucket_);
    for (std::size_t rank = 0; rank < ctx.map.world_size(); ++rank) {
      char* wire = reinterpret_cast<char*>(gathered_.data()) + rank * blocks.bytes();
      const auto values = blocks.values(wire);
      const auto scales = blocks.scales(wire);
      walk_int8_chunks(ctx.map, bucket_, every_param{}, [&](const int8_chunk& c) {
        const index_range to = ctx.map.unpacked(c.param, rank);
        if (to.count > 0)
          kernels::dequantize_int8<Scalar>(Kokkos::subview(values, c.values.pair()),
                                           Kokkos::subview(scales, c.scales.pair()), 0,
                                           Kokkos::subview(unpacked_, to.pair()));
      });
    }
  } else {
    with_wire(gathered_as_, [&]<class Wire>(Wire) {
      kernels::from_wire<Scalar, Wire>(wire_view<Wire>(gathered_, numel), unpacked_);
    });
  }
  // Back to the pool while the kernels may still read it: its next user writes it on the compute
  // instance too, or by a collective ordered after that instance.
  ctx.pool.release(gathered_);
}

template <class Scalar>
void bucket_state<Scalar>::free(bucket_context<Scalar>& ctx) {
  gather_pending_.wait();  // never free a buffer a collective still writes
  params_ = param_phase::sharded;
  ++params_version_;
  ctx.pool.release(send_);
  ctx.pool.release(gathered_);
  ctx.pool.release(unpacked_);
}

template <class Scalar>
typename bucket_state<Scalar>::view bucket_state<Scalar>::param(const bucket_context<Scalar>& ctx,
                                                                std::size_t p) const {
  if (params_ != param_phase::unsharded) wrong_phase("hand out a parameter", to_string(params_), "unsharded");
  return Kokkos::subview(unpacks() ? unpacked_ : gathered_, ctx.map.unpacked(p).pair());
}

template <class Scalar>
typename bucket_state<Scalar>::view bucket_state<Scalar>::grad(bucket_context<Scalar>& ctx, std::size_t p) {
  if (grads_ == grad_phase::reducing || grads_ == grad_phase::summing)
    wrong_phase("hand out a gradient", to_string(grads_), "none or accumulating");
  if (grads_ == grad_phase::none) {
    // The unpacked layout, padding included: each parameter's reduce-scatter reads it as it is.
    full_grads_ = ctx.pool.acquire("kfsdp::full_grads", ctx.map.gathered_numel(bucket_),
                                   buffer_pool<Scalar>::fill::zeros);  // padding stays zero
    grads_ = grad_phase::accumulating;
  }
  return Kokkos::subview(full_grads_, ctx.map.unpacked(p).pair());
}

template <class Scalar>
void bucket_state<Scalar>::begin_reduce(bucket_context<Scalar>& ctx, Scalar before, Scalar after) {
  if (grads_ == grad_phase::reducing || grads_ == grad_phase::summing)
    wrong_phase("begin its reduce-scatter", to_string(grads_), "none or accumulating");
  shard_grad_squared_norm_.reset();  // until finish_reduce has the new shard
  // What the reduce-scatters carry: every parameter's padded gradient but the frozen ones'.
  std::size_t reduced_numel = 0, frozen_count = 0;
  for (std::size_t p = first_param_; p < first_param_ + param_count_; ++p) {
    if (ctx.is_frozen(p)) ++frozen_count;
    else reduced_numel += ctx.map.padded(p).count;
  }
  if (frozen_count == param_count_) {
    // Nothing to reduce: the gradients computed for frozen parameters are dropped.
    ctx.pool.release(full_grads_);
    grads_ = grad_phase::none;
    if (ctx.norm_with_reductions)  // unchanged (zeros)
      shard_grad_squared_norm_ = optim::local_squared_norm<Scalar>(ctx.grads.bucket(bucket_));
    return;
  }
  if (grads_ == grad_phase::none) (void)grad(ctx, first_param_);  // no gradient reached it: zeros
  const std::size_t shard = ctx.map.bucket(bucket_).count, numel = ctx.map.gathered_numel(bucket_);
  // Frozen chunks of a pooled reduce buffer are never written by a collective: zeros, so that the
  // add leaves their gradient shard at zero.
  const auto reduced_fill = frozen_count > 0 ? buffer_pool<Scalar>::fill::zeros : buffer_pool<Scalar>::fill::none;
  reduced_as_ = ctx.reduce_dtype;
  after_ = after;
  // A zero gradient shard receives the sums itself: the add would only copy them. Without replicas
  // to sum over next, the reduce-scatters multiply by `after` too (mpi's ring in its last addition).
  reduces_in_place_ = shard_grads_zero_ && summed_as(reduced_as_) == wire_precision::scalar;
  const bool folds_after = reduces_in_place_ && !ctx.replicated();
  reduced_grads_ = reduces_in_place_ ? ctx.grads.bucket(bucket_)
                                     : acquire_wire(ctx, "kfsdp::reduced_grads", shard, summed_as(reduced_as_), reduced_fill);
  std::size_t int8_bytes = 0;  // int8: every rank's wire buffer
  if (reduced_as_ == wire_precision::int8) {
    // qgZ: rank r's chunk of every unfrozen gradient, divided in Scalar, quantized for rank r (blocks
    // of its own), one wire buffer a rank; one all-to-all; finish_reduce sums what arrives.
    if (before != Scalar(1)) KokkosBlas::scal(full_grads_, before, full_grads_);
    const std::size_t world = ctx.map.world_size();
    const auto unfrozen = [&](std::size_t p) { return !ctx.is_frozen(p); };
    const int8_blocks layout = walk_int8_chunks(ctx.map, bucket_, unfrozen, ignore_chunks{});
    packed_grads_ = acquire_bytes(ctx, "kfsdp::packed_grads_int8", world * layout.bytes());
    received_grads_ = acquire_bytes(ctx, "kfsdp::received_grads_int8", world * layout.bytes());
    int8_bytes = world * layout.bytes();
    for (std::size_t rank = 0; rank < world; ++rank) {
      char* wire = reinterpret_cast<char*>(packed_grads_.data()) + rank * layout.bytes();
      const auto values = layout.values(wire);
      const auto scales = layout.scales(wire);
      walk_int8_chunks(ctx.map, bucket_, unfrozen, [&](const int8_chunk& c) {
        const index_range from{ctx.map.padded(c.param).first + rank * c.shard.count, c.shard.count};
        kernels::quantize_int8<Scalar>(Kokkos::subview(full_grads_, from.pair()),
                                       Kokkos::subview(values, c.values.pair()), Kokkos::subview(scales, c.scales.pair()));
      });
    }
    ctx.comm.order_after(ctx.compute);
    ctx.pool.release(full_grads_);
    if (ctx.trace) reduce_issued_at_ = ctx.trace->now();
    using space = typename view::memory_space;
    reduce_pending_ = ctx.comm.template iall_to_all<float, space>(
        comm::span_in<const float, space>(reinterpret_cast<const float*>(packed_grads_.data()), world * layout.words()),
        comm::span_in<float, space>(reinterpret_cast<float*>(received_grads_.data()), world * layout.words()));
  } else if (reduced_as_ == wire_precision::scalar) {
    if (before != Scalar(1)) KokkosBlas::scal(full_grads_, before, full_grads_);
    ctx.comm.order_after(ctx.compute);
    if (ctx.trace) reduce_issued_at_ = ctx.trace->now();
    reduce_pending_ = reduce_params(ctx, full_grads_, reduced_grads_, folds_after ? after : Scalar(1));
  } else {
    with_wire(reduced_as_, [&]<class Wire>(Wire) {
      // Divided in Scalar, then rounded once: the wire copy replaces the Scalar one.
      packed_grads_ = acquire_wire(ctx, "kfsdp::packed_grads_wire", numel, reduced_as_);
      kernels::to_wire<Scalar, Wire>(full_grads_, before, wire_view<Wire>(packed_grads_, numel));
      ctx.comm.order_after(ctx.compute);
      ctx.pool.release(full_grads_);
      if (ctx.trace) reduce_issued_at_ = ctx.trace->now();
      reduce_pending_ =
          reduce_params(ctx, wire_view<Wire>(packed_grads_, numel), wire_view<Wire>(reduced_grads_, shard), 1.0f);
    });
  }
  // int8: the all-to-all's send buffer, as the others count theirs (the own block included).
  reduce_bytes_ = reduced_as_ == wire_precision::int8 ? int8_bytes : reduced_numel * wire_bytes(reduced_as_, sizeof(Scalar));
  ctx.bytes_communicated += reduce_bytes_;
  grads_ = grad_phase::reducing;
}

template <class Scalar>
void bucket_state<Scalar>::finish_reduce(bucket_context<Scalar>& ctx) {
  if (grads_ != grad_phase::reducing) wrong_phase("finish its reduce-scatter", to_string(grads_), "reducing");
  const comm::native_stream compute = comm::stream_of(ctx.compute);
  reduce_pending_.complete_before(compute);
  if (ctx.trace)
    ctx.trace->complete("reduce_scatter", "comm", trace_recorder::comm_lane, reduce_issued_at_, std::int64_t(bucket_),
                        reduce_bytes_);
  const view shard = ctx.grads.bucket(bucket_);
  if (reduced_as_ == wire_precision::int8) {
    // Every rank's quantization of this rank's chunks, summed in Scalar (times `after` where the
    // reduce-scatters would have folded it in).
    const std::size_t world = ctx.map.world_size();
    const auto unfrozen = [&](std::size_t p) { return !ctx.is_frozen(p); };
    const int8_blocks layout = walk_int8_chunks(ctx.map, bucket_, unfrozen, ignore_chunks{});
    const Kokkos::View<const char*> received(reinterpret_cast<const char*>(received_grads_.data()),
                                             world * layout.bytes());
    const Scalar factor = reduces_in_place_ && !ctx.replicated() ? after_ : Scalar(1);
    walk_int8_chunks(ctx.map, bucket_, unfrozen, [&](const int8_chunk& c) {
      kernels::sum_dequantized_int8<Scalar>(received, world, layout, c, factor,
                                            Kokkos::subview(reduced_grads_, c.shard.pair()));
    });
  }
  if (!ctx.replicated()) return add_reduced_shard(ctx);
  // HSDP: the group's sums, summed over the replicas on the shard (Ψ / group bytes a rank), issued
  // now and waited for by finish_replica_sum, so that it runs behind the rest of the backward. A
  // frozen parameter's chunks are zero on every replica: only the others' runs are summed. bf16 /
  // f16 sums stay in the wire type (NaN included); int8's are summed in Scalar, as dequantized.
  const wire_precision summed = summed_as(reduced_as_);
  ctx.replicas->order_after(ctx.compute);  // the group's sums are in
  if (ctx.trace) replica_sum_issued_at_ = ctx.trace->now();
  std::vector<comm::request> sums;
  std::size_t summed_numel = 0;
  for (const index_range run : unfrozen_runs(ctx)) {
    if (summed == wire_precision::scalar) {
      sums.push_back(ctx.replicas->iall_reduce_sum(span_of(Kokkos::subview(reduced_grads_, run.pair()))));
    } else {
      with_wire(reduced_as_, [&]<class Wire>(Wire) {
        const auto wire = wire_view<Wire>(reduced_grads_, shard.extent(0));
        sums.push_back(ctx.replicas->iall_reduce_sum(span_of(Kokkos::subview(wire, run.pair()))));
      });
    }
    summed_numel += run.count;
  }
  // The request pins reduced_grads_: a timeout abandons it with the memory MPI may still write.
  struct pinning {
    comm::request sums;
    view pinned;
    bool test() { return sums.test(); }
    void wait() { sums.wait(); }
    void complete_before(comm::native_stream stream) { sums.complete_before(stream); }
  };
  replica_sum_pending_ = comm::request(pinning{comm::when_all(std::move(sums)), reduced_grads_});
  replica_sum_bytes_ = summed_numel * wire_bytes(summed, sizeof(Scalar));
  ctx.bytes_communicated += replica_sum_bytes_;
  // What the all-reduce does not touch goes back now: only reduced_grads_ stays in use.
  ctx.pool.release(packed_grads_);
  ctx.pool.release(received_grads_);
  ctx.pool.release(full_grads_);
  grads_ = grad_phase::summing;
}

template <class Scalar>
void bucket_state<Scalar>::finish_replica_sum(bucket_context<Scalar>& ctx) {
  if (grads_ != grad_phase::summing)
    wrong_phase("finish its all-reduce over the replicas", to_string(grads_), "summing");
  replica_sum_pending_.complete_before(comm::stream_of(ctx.compute));
  if (ctx.trace)
    ctx.trace->complete("replica_all_reduce", "comm", trace_recorder::comm_lane, replica_sum_issued_at_,
                        std::int64_t(bucket_), replica_sum_bytes_);
  add_reduced_shard(ctx);
}

template <class Scalar>
void bucket_state<Scalar>::add_reduced_shard(bucket_context<Scalar>& ctx) {
  grads_ = grad_phase::none;
  const view shard = ctx.grads.bucket(bucket_);
  if (reduces_in_place_) {
    // Replicated, the factor waits for the replicas' sum; otherwise the reduce-scatters applied it.
    if (ctx.replicated() && after_ != Scalar(1)) KokkosBlas::scal(shard, after_, shard);
    reduced_grads_ = view();  // the storage's, not the pool's
  } else if (summed_as(reduced_as_) == wire_precision::scalar) {
    kernels::accumulate_scaled<Scalar>(shard, reduced_grads_, after_);
  } else {
    with_wire(reduced_as_, [&]<class Wire>(Wire) {
      kernels::accumulate_wire_scaled<Scalar, Wire>(shard, wire_view<Wire>(reduced_grads_, shard.extent(0)),
                                                    after_);
    });
  }
  // Clipping's norm where asked for, read here while the shard is fresh from the reduction instead of
  // in a pass of its own; otherwise grad_squared_norm() sums the bucket alike when called.
  if (ctx.norm_with_reductions) shard_grad_squared_norm_ = optim::local_squared_norm<Scalar>(shard);
  shard_grads_zero_ = false;
  ctx.pool.release(reduced_grads_);
  ctx.pool.release(packed_grads_);
  ctx.pool.release(received_grads_);
  ctx.pool.release(full_grads_);
}

template class bucket_state<float>;
template class bucket_state<double>;

}  // namespace kfsdp
