// fsdp_engine<float|double>: storage, initialisation, bucket collectives, state dicts.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include <kfsdp/fsdp/engine.hpp>

namespace kfsdp {

namespace {
template <class View>
auto as_span(const View& v) {
  return std::span<typename View::value_type>(v.data(), v.extent(0));
}
template <class View>
auto as_const_span(const View& v) {
  return std::span<const typename View::value_type>(v.data(), v.extent(0));
}
template <class Scalar>
Kokkos::View<const Scalar*> as_const(const Kokkos::View<Scalar*>& v) {
  return v;
}

std::uint64_t options_fingerprint(const shard_plan& plan, const fsdp_options& o, std::size_t scalar_bytes) {
  std::uint64_t h = fingerprint(plan);
  for (std::uint64_t v : {std::uint64_t(o.sharding_strategy), std::uint64_t(o.broadcast_from.value_or(-1)),
                          std::uint64_t(scalar_bytes)})
    h = (h ^ v) * 0x100000001b3ull;
  return h;
}
}  // namespace

template <class Scalar>
fsdp_engine<Scalar>::fsdp_engine(std::vector<param_info> table, comm::any_communicator comm,
                                 const fsdp_options& options, std::optional<shard_plan> plan)
    : table_(std::move(table)), comm_(std::move(comm)), options_(options) {
  rank_ = comm_.rank();
  world_size_ = comm_.size();
  if (options_.broadcast_from && (*options_.broadcast_from < 0 || *options_.broadcast_from >= world_size_))
    throw std::invalid_argument(fmt::format("kfsdp::fsdp: broadcast_from is {}, expected a rank in [0, {})",
                                            *options_.broadcast_from, world_size_));
  using memory_space = Kokkos::DefaultExecutionSpace::memory_space;
  if (options_.device) {
    if constexpr (std::is_same_v<memory_space, Kokkos::HostSpace>) {
      throw std::invalid_argument(fmt::format(
          "kfsdp::fsdp: device is {}, but Kokkos' default execution space ({}) keeps memory on the host; "
          "leave device unset on CPU builds",
          *options_.device, Kokkos::DefaultExecutionSpace::name()));
    } else {
#if KOKKOS_VERSION >= 40100  // Kokkos::device_id() arrived in 4.1
      if (*options_.device != Kokkos::device_id())
        throw std::invalid_argument(fmt::format("kfsdp::fsdp: device is {}, but Kokkos runs this rank on device {}",
                                                *options_.device, Kokkos::device_id()));
#endif
    }
  }
  if (plan) {
    if (plan->world_size != static_cast<std::size_t>(world_size_))
      throw std::invalid_argument(fmt::format("kfsdp::fsdp: the communicator has {} ranks, expected {} (the plan's "
                                              "world size, static_world_size<{}>)",
                                              world_size_, plan->world_size, plan->world_size));
    if (plan->bucketing != options_.bucketing_strategy || plan->params.size() != table_.size())
      throw std::invalid_argument(fmt::format("kfsdp::fsdp: the plan given has {} parameters with {} bucketing, "
                                              "expected {} with {} (the table and options)",
                                              plan->params.size(), to_string(plan->bucketing), table_.size(),
                                              to_string(options_.bucketing_strategy)));
    plan_ = std::move(*plan);
  } else {
    plan_ = make_shard_plan(table_, static_cast<std::size_t>(world_size_), options_.bucketing_strategy);
  }
  // Ranks that disagree on the plan would hang in mismatched collectives: fail here instead.
  comm::check_agreement(comm_, options_fingerprint(plan_, options_, sizeof(Scalar)), "the shard plan and fsdp options");

  for (std::size_t p = 0; p < table_.size(); ++p) index_.emplace(std::string(table_[p].name.view()), p);
  shards_ = sharded_storage<Scalar>(plan_, "kfsdp::shards");
  grads_ = sharded_storage<Scalar>(plan_, "kfsdp::grads");
  buckets_.resize(plan_.buckets.size());
}

template <class Scalar>
fsdp_engine<Scalar>::~fsdp_engine() = default;

template <class Scalar>
std::size_t fsdp_engine<Scalar>::param_index(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end())
    throw std::out_of_range(fmt::format("kfsdp::fsdp: the model has no parameter named '{}'", name));
  return it->second;
}

namespace {
// At most this many freed buffers wait for reuse: enough for a stage's buckets to swap with the
// next stage's of the same sizes (every block has the same), few enough to keep ZeRO3 lean.
constexpr std::size_t max_spare_buffers = 8;
}  // namespace

template <class Scalar>
typename fsdp_engine<Scalar>::flat_view fsdp_engine<Scalar>::allocate(const std::string& label, std::size_t numel,
                                                                       fill how) {
  flat_view v;
  for (std::size_t i = 0; i < spare_.size(); ++i)
    if (spare_[i].extent(0) == numel) {
      v = spare_[i];
      spare_.erase(spare_.begin() + std::ptrdiff_t(i));
      spare_bytes_ -= numel * sizeof(Scalar);
      if (how == fill::zeros) Kokkos::deep_copy(v, Scalar(0));
      break;
    }
  if (v.data() == nullptr)
    v = how == fill::zeros ? flat_view(label, numel)
                           : flat_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), numel);
  live_bytes_ += numel * sizeof(Scalar);
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return v;
}

template <class Scalar>
void fsdp_engine<Scalar>::release(flat_view& view) {
  if (view.data() == nullptr) return;
  live_bytes_ -= view.extent(0) * sizeof(Scalar);
  if (view.use_count() == 1) {  // no subview handed out is still alive: it may be reused
    spare_.push_back(view);
    spare_bytes_ += view.extent(0) * sizeof(Scalar);
    if (spare_.size() > max_spare_buffers) {
      spare_bytes_ -= spare_.front().extent(0) * sizeof(Scalar);
      spare_.erase(spare_.begin());
    }
  }
  view = flat_view();
}

template <class Scalar>
kernels::param_slot fsdp_engine<Scalar>::slot(std::size_t p) const {
  const param_shard& s = plan_.params[p];
  return {s.bucket_offset, s.chunk_numel(), s.full_numel(), s.full_offset};
}

template <class Scalar>
void fsdp_engine<Scalar>::check_bucket(std::size_t bucket, const char* where) const {
  if (bucket >= buckets_.size())
    throw std::out_of_range(fmt::format("kfsdp::fsdp::{}: bucket is {}, expected less than {}", where, bucket,
                                        buckets_.size()));
}

template <class Scalar>
void fsdp_engine<Scalar>::check_param(std::size_t param, const char* where) const {
  if (param >= table_.size())
    throw std::out_of_range(fmt::format("kfsdp::fsdp::{}: param is {}, expected less than {}", where, param,
                                        table_.size()));
}

template <class Scalar>
std::pair<std::size_t, std::size_t> fsdp_engine<Scalar>::buckets_of(param_range range) const {
  if (range.first >= range.last || range.last > table_.size())
    throw std::out_of_range(fmt::format("kfsdp::fsdp: parameter range [{}, {}) is not within [0, {})",
                                        range.first, range.last, table_.size()));
  return {plan_.params[range.first].bucket, plan_.params[range.last - 1].bucket + 1};
}

// ---------------------------------------------------------------- unshard / reshard

template <class Scalar>
void fsdp_engine<Scalar>::begin_unshard(std::size_t b) {
  check_bucket(b, "begin_unshard");
  bucket_state& s = buckets_[b];
  if (s.unsharded || s.gathering) return;
  // The limit on all-gathers in flight: complete the oldest before issuing one more.
  while (options_.limit_all_gathers > 0 && inflight_.size() >= options_.limit_all_gathers)
    finish_unshard(inflight_.front());
  s.gathered = allocate("kfsdp::gathered", plan_.gathered_numel(b));
  const flat_view local = shards_.bucket(b);
  if (trace_) s.issued_at = trace_->now();
  s.pending = comm_.iall_gather(as_const_span(local), as_span(s.gathered));
  s.gathering = true;
  inflight_.push_back(b);
  max_inflight_ = std::max(max_inflight_, inflight_.size());
  bytes_communicated_ += plan_.gathered_numel(b) * sizeof(Scalar);
}

template <class Scalar>
void fsdp_engine<Scalar>::finish_unshard(std::size_t b) {
  check_bucket(b, "finish_unshard");
  bucket_state& s = buckets_[b];
  if (s.unsharded) return;
  if (!s.gathering) begin_unshard(b);
  s.pending.wait();
  s.gathering = false;
  std::erase(inflight_, b);
  // From issue to the wait's return: with an overlapping backend most of it hides behind compute.
  if (trace_)
    trace_->complete("all_gather", "comm", trace_recorder::comm_lane, s.issued_at, std::int64_t(b),
                     plan_.gathered_numel(b) * sizeof(Scalar));
  if (!single(b)) {
    // (a one-parameter bucket needs none: its gathered buffer already is the padded parameter)
    const trace_recorder::scope region(trace_, "unpack", "compute", trace_recorder::compute_lane, std::int64_t(b), 0);
    const bucket_shard& bucket = plan_.buckets[b];
    s.unpacked = allocate("kfsdp::unpacked", bucket.full_numel);
    for (std::size_t p = bucket.first_param; p < bucket.first_param + bucket.param_count; ++p)
      kernels::unpack_param<Scalar>(as_const(s.gathered), bucket.shard_numel, slot(p), s.unpacked);
    Kokkos::fence();
    release(s.gathered);
  }
  s.unsharded = true;
}

template <class Scalar>
void fsdp_engine<Scalar>::reshard(std::size_t b) {
  check_bucket(b, "reshard");
  bucket_state& s = buckets_[b];
  s.pending.wait();  // never free a buffer a collective still writes
  s.gathering = false;
  std::erase(inflight_, b);
  s.unsharded = false;
  release(s.gathered);
  release(s.unpacked);
}

template <class Scalar>
bool fsdp_engine<Scalar>::is_unsharded(std::size_t b) const {
  check_bucket(b, "is_unsharded");
  return buckets_[b].unsharded;
}

template <class Scalar>
bool fsdp_engine<Scalar>::is_gathering(std::size_t b) const {
  check_bucket(b, "is_gathering");
  return buckets_[b].gathering;
}

template <class Scalar>
typename fsdp_engine<Scalar>::flat_view fsdp_engine<Scalar>::full_param(std::size_t p) const {
  check_param(p, "full_param");
  const std::size_t b = plan_.params[p].bucket;
  const bucket_state& s = buckets_[b];
  if (!s.unsharded)
    throw std::logic_error(fmt::format("kfsdp::fsdp::full_param: '{}' is sharded (bucket {}); unshard it first",
                                       table_[p].name.view(), b));
  // A one-parameter bucket is not unpacked: its gathered buffer is the padded parameter (full_offset 0).
  const param_shard& param = plan_.params[p];
  return Kokkos::subview(single(b) ? s.gathered : s.unpacked,
                         std::make_pair(param.full_offset, param.full_offset + param.full_numel()));
}

// ---------------------------------------------------------------- gradients

template <class Scalar>
typename fsdp_engine<Scalar>::flat_view fsdp_engine<Scalar>::full_grad(std::size_t p) {
  check_param(p, "full_grad");
  const std::size_t b = plan_.params[p].bucket;
  bucket_state& s = buckets_[b];
  if (s.reducing) finish_reduce_gradients(b);  // a reduce-scatter in flight may still read the buffer
  if (s.full_grads.data() == nullptr) {
    // One parameter: the padded layout, so the buffer is the reduce-scatter's input as it is.
    const std::size_t n = single(b) ? plan_.gathered_numel(b) : plan_.buckets[b].full_numel;
    s.full_grads = allocate("kfsdp::full_grads", n, fill::zeros);  // accumulated into; padding stays zero
  }
  const param_shard& param = plan_.params[p];
  return Kokkos::subview(s.full_grads, std::make_pair(param.full_offset, param.full_offset + param.full_numel()));
}

template <class Scalar>
void fsdp_engine<Scalar>::begin_reduce_gradients(std::size_t b) {
  check_bucket(b, "begin_reduce_gradients");
  bucket_state& s = buckets_[b];
  if (s.reducing) return;
  const bucket_shard& bucket = plan_.buckets[b];
  if (s.full_grads.data() == nullptr) (void)full_grad(bucket.first_param);  // no gradient reached it: zeros
  s.packed_grads = s.full_grads;  // one parameter: already in the padded layout
  if (!single(b)) {
    s.packed_grads = allocate("kfsdp::packed_grads", plan_.gathered_numel(b));
    for (std::size_t p = bucket.first_param; p < bucket.first_param + bucket.param_count; ++p)
      kernels::pack_param<Scalar>(as_const(s.full_grads), slot(p), bucket.shard_numel,
                                  static_cast<std::size_t>(world_size_), s.packed_grads);
    release(s.full_grads);
  }
  s.reduced_grads = allocate("kfsdp::reduced_grads", bucket.shard_numel);
  Kokkos::fence();
  if (trace_) s.reduce_issued_at = trace_->now();
  s.reduce_pending = comm_.ireduce_scatter_sum(as_const_span(s.packed_grads), as_span(s.reduced_grads));
  s.reducing = true;
  bytes_communicated_ += plan_.gathered_numel(b) * sizeof(Scalar);
}

template <class Scalar>
void fsdp_engine<Scalar>::finish_reduce_gradients(std::size_t b) {
  check_bucket(b, "finish_reduce_gradients");
  bucket_state& s = buckets_[b];
  if (!s.reducing) return;
  s.reduce_pending.wait();
  s.reducing = false;
  if (trace_)
    trace_->complete("reduce_scatter", "comm", trace_recorder::comm_lane, s.reduce_issued_at, std::int64_t(b),
                     plan_.gathered_numel(b) * sizeof(Scalar));
  // The average over ranks: as if one process had seen the global batch with a mean loss.
  kernels::accumulate_scaled<Scalar>(grads_.bucket(b), as_const(s.reduced_grads), Scalar(1) / Scalar(world_size_));
  Kokkos::fence();
  release(s.reduced_grads);
  if (s.packed_grads.data() == s.full_grads.data()) s.packed_grads = flat_view();  // the same buffer: count it once
  release(s.packed_grads);
  release(s.full_grads);
}

template <class Scalar>
void fsdp_engine<Scalar>::finish_gradient_reductions() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) finish_reduce_gradients(b);
}

template <class Scalar>
void fsdp_engine<Scalar>::zero_grad() {
  Kokkos::deep_copy(grads_.flat(), Scalar(0));
}

// ---------------------------------------------------------------- initialisation

template <class Scalar>
void fsdp_engine<Scalar>::fill_local(
    const std::function<void(std::size_t, std::size_t, std::size_t, flat_view)>& fill) {
  for (std::size_t p = 0; p < table_.size(); ++p) {
    const param_shard& s = plan_.params[p];
    const flat_view chunk = shards_.chunk(p);
    Kokkos::deep_copy(chunk, Scalar(0));  // padding rows stay zero
    const std::size_t valid = s.valid_rows(static_cast<std::size_t>(rank_)) * s.row_numel;
    if (valid > 0)
      fill(p, static_cast<std::size_t>(rank_) * s.chunk_numel(), valid,
           Kokkos::subview(chunk, std::make_pair(std::size_t(0), valid)));
  }
  Kokkos::fence();
}

template <class Scalar>
void fsdp_engine<Scalar>::scatter_from(int root, const std::function<void(std::size_t, flat_view)>& fill) {
  // Bucket by bucket: no rank ever needs room for more than one gathered bucket.
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
    const bucket_shard& bucket = plan_.buckets[b];
    flat_view packed = allocate("kfsdp::broadcast", plan_.gathered_numel(b));
    if (rank_ == root) {
      flat_view unpacked = allocate("kfsdp::broadcast_full", bucket.full_numel);
      for (std::size_t p = bucket.first_param; p < bucket.first_param + bucket.param_count; ++p) {
        const param_shard& param = plan_.params[p];
        fill(p, Kokkos::subview(unpacked, std::make_pair(param.full_offset, param.full_offset + param.full_numel())));
        kernels::pack_param<Scalar>(as_const(unpacked), slot(p), bucket.shard_numel,
                                    static_cast<std::size_t>(world_size_), packed);
      }
      Kokkos::fence();
      release(unpacked);
    }
    comm_.ibroadcast(as_span(packed), root).wait();
    bytes_communicated_ += plan_.gathered_numel(b) * sizeof(Scalar);
    const std::size_t mine = static_cast<std::size_t>(rank_) * bucket.shard_numel;
    Kokkos::deep_copy(shards_.bucket(b), Kokkos::subview(packed, std::make_pair(mine, mine + bucket.shard_numel)));
    release(packed);
  }
  Kokkos::fence();
}

template <class Scalar>
void fsdp_engine<Scalar>::initialize(std::uint64_t seed, const initializer& choose) {
  std::vector<param_init> how(table_.size());
  for (std::size_t p = 0; p < table_.size(); ++p) how[p] = choose(table_[p]);
  if (options_.broadcast_from) {
    scatter_from(*options_.broadcast_from, [&](std::size_t p, flat_view out) {
      kernels::fill_init<Scalar>(out, out.extent(0), 0, seed, p, how[p]);
    });
  } else {
    fill_local([&](std::size_t p, std::size_t first, std::size_t count, flat_view out) {
      kernels::fill_init<Scalar>(out, count, first, seed, p, how[p]);
    });
  }
}

template <class Scalar>
std::string fsdp_engine<Scalar>::validate(const state_dict& full) const {
  for (const param_info& p : table_) {
    const std::span<const std::size_t> expected(p.shape.data(), p.rank);
    const tensor* t = full.find(p.name.view());
    if (t == nullptr)
      return fmt::format("kfsdp::load_original_state_dict: parameter '{}' is missing (expected shape {}, dtype {})",
                         p.name.view(), shape_string(expected), io::dtype_name(dtype_of<Scalar>));
    if (!std::equal(t->shape.begin(), t->shape.end(), expected.begin(), expected.end()))
      return fmt::format("kfsdp::load_original_state_dict: parameter '{}' has shape {}, expected {}",
                         p.name.view(), shape_string(t->shape), shape_string(expected));
    if (t->type != dtype_of<Scalar>)
      return fmt::format("kfsdp::load_original_state_dict: parameter '{}' has dtype {}, expected {}",
                         p.name.view(), io::dtype_name(t->type), io::dtype_name(dtype_of<Scalar>));
    if (t->bytes.size() != p.numel * sizeof(Scalar))
      return fmt::format("kfsdp::load_original_state_dict: parameter '{}' holds {} bytes, expected {} for shape {}",
                         p.name.view(), t->bytes.size(), p.numel * sizeof(Scalar), shape_string(expected));
  }
  for (const tensor& t : full)
    if (!index_.contains(t.name))
      return fmt::format("kfsdp::load_original_state_dict: '{}' (shape {}) is not a parameter of the model",
                         t.name, shape_string(t.shape));
  return {};
}

template <class Scalar>
void fsdp_engine<Scalar>::load_original_state_dict(const state_dict& full) {
  const bool reads = !options_.broadcast_from || *options_.broadcast_from == rank_;
  const std::string error = reads ? validate(full) : std::string();
  // Every rank learns whether any rank rejected it, so none goes on into a collective alone.
  if (comm::any_rank(comm_, !error.empty())) {
    if (!error.empty()) throw std::invalid_argument(error);
    throw std::invalid_argument(
        "kfsdp::load_original_state_dict: another rank rejected its state dict (its error names the parameter); "
        "nothing was loaded");
  }
  auto host_values = [&](std::size_t p) { return full.at(table_[p].name.view()).template values<Scalar>(); };
  if (options_.broadcast_from) {
    scatter_from(*options_.broadcast_from, [&](std::size_t p, flat_view out) {
      const auto values = host_values(p);
      Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> src(values.data(), values.size());
      Kokkos::deep_copy(out, src);
    });
  } else {
    fill_local([&](std::size_t p, std::size_t first, std::size_t count, flat_view out) {
      const auto values = host_values(p);
      Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> src(values.data() + first, count);
      Kokkos::deep_copy(out, src);
    });
  }
}

template <class Scalar>
state_dict fsdp_engine<Scalar>::original_state_dict(bool rank0_only) {
  return gather_full(shards_, rank0_only);
}

template <class Scalar>
state_dict fsdp_engine<Scalar>::original_grad_dict(bool rank0_only) {
  return gather_full(grads_, rank0_only);
}

template <class Scalar>
state_dict fsdp_engine<Scalar>::gather_full(const sharded_storage<Scalar>& storage, bool rank0_only) {
  const bool keep = !rank0_only || rank_ == 0;
  std::vector<tensor> tensors;
  std::vector<flat_view> on_device;  // when not moving each parameter to the host at once
  for (std::size_t p = 0; p < table_.size(); ++p) {
    const param_shard& s = plan_.params[p];
    flat_view gathered = allocate("kfsdp::state_dict_param", s.chunk_numel() * static_cast<std::size_t>(world_size_));
    const flat_view chunk = storage.chunk(p);
    comm_.iall_gather(as_const_span(chunk), as_span(gathered)).wait();
    bytes_communicated_ += gathered.extent(0) * sizeof(Scalar);
    if (keep) {
      const param_info& info = table_[p];
      tensors.push_back(tensor::zeros(std::string(info.name.view()),
                                      std::vector<std::size_t>(info.shape.begin(), info.shape.begin() + info.rank),
                                      dtype_of<Scalar>));
      if (options_.move_state_dict_to_cpu) {
        auto dst = tensors.back().template values<Scalar>();
        Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(dst.data(), dst.size());
        Kokkos::deep_copy(host, Kokkos::subview(gathered, std::make_pair(std::size_t(0), s.full_numel())));
      } else {
        on_device.push_back(gathered);
        live_bytes_ += gathered.extent(0) * sizeof(Scalar);  // still held: counted until the end
        peak_bytes_ = std::max(peak_bytes_, live_bytes_);
      }
    }
    release(gathered);
  }
  for (std::size_t i = 0; i < on_device.size(); ++i) {
    auto dst = tensors[i].template values<Scalar>();
    Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(dst.data(), dst.size());
    Kokkos::deep_copy(host, Kokkos::subview(on_device[i], std::make_pair(std::size_t(0), dst.size())));
    release(on_device[i]);
  }
  return state_dict(std::move(tensors));
}

template <class Scalar>
memory_report fsdp_engine<Scalar>::memory() const noexcept {
  return {shards_.bytes(), grads_.bytes(), live_bytes_, peak_bytes_, spare_bytes_};
}

template class fsdp_engine<float>;
template class fsdp_engine<double>;

}  // namespace kfsdp
