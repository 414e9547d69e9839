// fsdp_engine<float|double>: the plan, and the order of the buckets' transitions (the state
// dicts are in state_dict_io.cpp).
#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include <kfsdp/detail/between_kernels.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/optim/clip.hpp>

namespace kfsdp {

namespace {
std::uint64_t options_fingerprint(const shard_plan& plan, const fsdp_options& o, std::size_t scalar_bytes) {
  std::uint64_t h = fingerprint(plan);
  for (std::uint64_t v : {std::uint64_t(o.sharding()), std::uint64_t(o.broadcast_from.value_or(-1)),
                          std::uint64_t(o.gradient_division), std::uint64_t(o.param_dtype),
                          std::uint64_t(o.reduce_dtype), std::uint64_t(scalar_bytes)})
    h = (h ^ v) * 0x100000001b3ull;
  for (const auto& [unit, reshard] : o.reshard_after_forward) {  // ranks that free other units would gather apart
    for (char c : unit) h = (h ^ std::uint64_t(static_cast<unsigned char>(c))) * 0x100000001b3ull;
    h = (h ^ std::uint64_t(reshard ? 2 : 1)) * 0x100000001b3ull;
  }
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
      throw std::invalid_argument(fmt::format("kfsdp::fsdp: the communicator has {} ranks, expected {} (the world "
                                              "size of the plan given, static_shard_plan<Model, {}, ...>)",
                                              world_size_, plan->world_size, plan->world_size));
    if (plan->bucketing != options_.bucketing() || plan->params.size() != table_.size())
      throw std::invalid_argument(fmt::format("kfsdp::fsdp: the plan given has {} parameters with {} bucketing, "
                                              "expected {} with {} (the table and options)",
                                              plan->params.size(), to_string(plan->bucketing), table_.size(),
                                              to_string(options_.bucketing())));
    plan_ = std::move(*plan);
  } else {
    plan_ = make_shard_plan(table_, static_cast<std::size_t>(world_size_), options_.bucketing());
  }
  // Ranks that disagree on the plan would hang in mismatched collectives: fail here instead.
  const std::uint64_t fingerprint = options_fingerprint(plan_, options_, sizeof(Scalar));
  comm::check_agreement(comm_, fingerprint, "the shard plan and fsdp options");
  if (options_.replica_group) {
    replica_count_ = options_.replica_group->size();
    // Every replica of a shard must hold the same plan (and so the same shard-group size).
    comm::check_agreement(*options_.replica_group, fingerprint, "the shard plan and fsdp options across replicas");
    context_.replicas = &*options_.replica_group;
  }

  for (std::size_t p = 0; p < table_.size(); ++p) index_.emplace(std::string(table_[p].name.view()), p);
  // The parameter shards where the other ranks read them in place, if the communicator has such
  // memory (one node, host memory): the unshard then copies them without messages.
  if constexpr (std::is_same_v<typename sharded_storage<Scalar>::flat_view::memory_space, Kokkos::HostSpace>)
    shards_ = sharded_storage<Scalar>(plan_, "kfsdp::shards", comm_.allocate_shared(plan_.shard_numel * sizeof(Scalar)));
  else
    shards_ = sharded_storage<Scalar>(plan_, "kfsdp::shards");
  grads_ = sharded_storage<Scalar>(plan_, "kfsdp::grads");
  division_ = division_of(options_.gradient_division, std::size_t(data_parallel_size()));
  context_.param_dtype = options_.param_dtype;
  context_.reduce_dtype = options_.reduce_dtype;
  context_.frozen.assign(table_.size(), 0);
  buckets_.reserve(plan_.buckets.size());
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) buckets_.emplace_back(b, map_);
}

template <class Scalar>
fsdp_engine<Scalar>::~fsdp_engine() {
  set_progress_between_kernels(false);  // no poll may reach a freed engine
}

template <class Scalar>
void fsdp_engine<Scalar>::progress() {
  for (bucket_state<Scalar>& bucket : buckets_) bucket.progress();
}

template <class Scalar>
void fsdp_engine<Scalar>::set_progress_between_kernels(bool on) noexcept {
  detail::kernel_boundary& boundary = detail::current_kernel_boundary;
  if (on)
    boundary = {[](void* engine) { static_cast<fsdp_engine*>(engine)->progress(); }, this};
  else if (boundary.target == this)
    boundary = {};
}

template <class Scalar>
std::size_t fsdp_engine<Scalar>::param_index(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end())
    throw std::out_of_range(fmt::format("kfsdp::fsdp: the model has no parameter named '{}'", name));
  return it->second;
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
  if (buckets_[b].params() != param_phase::sharded) return;
  // The limit on all-gathers in flight: complete the oldest before issuing one more.
  while (options_.limit_all_gathers > 0 && inflight_.size() >= options_.limit_all_gathers)
    finish_unshard(inflight_.front());
  buckets_[b].begin_gather(context_);
  inflight_.push_back(b);
  max_inflight_ = std::max(max_inflight_, inflight_.size());
}

template <class Scalar>
void fsdp_engine<Scalar>::finish_unshard(std::size_t b) {
  check_bucket(b, "finish_unshard");
  if (buckets_[b].params() == param_phase::unsharded) return;
  if (buckets_[b].params() == param_phase::sharded) begin_unshard(b);
  std::erase(inflight_, b);
  buckets_[b].finish_gather(context_);
}

template <class Scalar>
void fsdp_engine<Scalar>::reshard(std::size_t b) {
  check_bucket(b, "reshard");
  std::erase(inflight_, b);
  buckets_[b].free(context_);
}

template <class Scalar>
bool fsdp_engine<Scalar>::is_unsharded(std::size_t b) const {
  check_bucket(b, "is_unsharded");
  return buckets_[b].params() == param_phase::unsharded;
}

template <class Scalar>
bool fsdp_engine<Scalar>::is_gathering(std::size_t b) const {
  check_bucket(b, "is_gathering");
  return buckets_[b].params() == param_phase::gathering;
}

template <class Scalar>
typename fsdp_engine<Scalar>::flat_view fsdp_engine<Scalar>::full_param(std::size_t p) const {
  check_param(p, "full_param");
  const std::size_t b = plan_.params[p].bucket;
  if (buckets_[b].params() != param_phase::unsharded)
    throw std::logic_error(fmt::format("kfsdp::fsdp::full_param: '{}' is sharded (bucket {}); unshard it first",
                                       table_[p].name.view(), b));
  return buckets_[b].param(context_, p);
}

template <class Scalar>
std::uint64_t fsdp_engine<Scalar>::params_version(std::size_t p) const {
  check_param(p, "params_version");
  return buckets_[plan_.params[p].bucket].params_version();
}

// ---------------------------------------------------------------- gradients

template <class Scalar>
typename fsdp_engine<Scalar>::flat_view fsdp_engine<Scalar>::full_grad(std::size_t p) {
  check_param(p, "full_grad");
  const std::size_t b = plan_.params[p].bucket;
  finish_reduce_gradients(b);  // a reduce-scatter in flight may still read the buffer
  return buckets_[b].grad(context_, p);
}

template <class Scalar>
void fsdp_engine<Scalar>::begin_reduce_gradients(std::size_t b) {
  check_bucket(b, "begin_reduce_gradients");
  // The average over ranks: as if one process had seen the global batch with a mean loss.
  if (buckets_[b].grads() == grad_phase::summing) buckets_[b].finish_replica_sum(context_);
  if (buckets_[b].grads() != grad_phase::reducing)
    buckets_[b].begin_reduce(context_, Scalar(division_.before), Scalar(division_.after));
}

template <class Scalar>
void fsdp_engine<Scalar>::finish_reduce_scatter(std::size_t b) {
  check_bucket(b, "finish_reduce_scatter");
  if (buckets_[b].grads() == grad_phase::reducing) buckets_[b].finish_reduce(context_);
}

template <class Scalar>
void fsdp_engine<Scalar>::finish_reduce_gradients(std::size_t b) {
  check_bucket(b, "finish_reduce_gradients");
  if (buckets_[b].grads() == grad_phase::reducing) buckets_[b].finish_reduce(context_);
  if (buckets_[b].grads() == grad_phase::summing) buckets_[b].finish_replica_sum(context_);
}

template <class Scalar>
void fsdp_engine<Scalar>::set_frozen(std::size_t p, bool frozen) {
  check_param(p, "set_frozen");
  const std::size_t b = plan_.params[p].bucket;
  if (buckets_[b].grads() != grad_phase::none)
    throw std::logic_error(fmt::format("kfsdp::fsdp::set_frozen: '{}' (bucket {}) has gradients that are {}, expected "
                                       "none (freeze between steps)",
                                       table_[p].name.view(), b, to_string(buckets_[b].grads())));
  context_.frozen[p] = frozen ? 1 : 0;
  // A frozen gradient shard is zero: what an earlier reduction left there goes.
  if (frozen) Kokkos::deep_copy(grads_.chunk(p), Scalar(0));
}

template <class Scalar>
bool fsdp_engine<Scalar>::is_frozen(std::size_t p) const {
  check_param(p, "is_frozen");
  return context_.is_frozen(p);
}

template <class Scalar>
bool fsdp_engine<Scalar>::is_reducing(std::size_t b) const {
  check_bucket(b, "is_reducing");
  return buckets_[b].grads() == grad_phase::reducing || buckets_[b].grads() == grad_phase::summing;
}

template <class Scalar>
void fsdp_engine<Scalar>::finish_gradient_reductions() {
  // Every reduce-scatter first: each all-reduce over the replicas starts before any is waited for.
  for (std::size_t b = 0; b < buckets_.size(); ++b) finish_reduce_scatter(b);
  for (std::size_t b = 0; b < buckets_.size(); ++b) finish_reduce_gradients(b);
}

template <class Scalar>
void fsdp_engine<Scalar>::sum_over_ranks(std::span<double> values) {
  comm::all_reduce_sum(comm_, values);
  if (options_.replica_group) comm::all_reduce_sum(*options_.replica_group, values);
}

template <class Scalar>
void fsdp_engine<Scalar>::zero_grad() {
  finish_gradient_reductions();  // none may write the shards after they are zeroed
  Kokkos::deep_copy(grads_.flat(), Scalar(0));
  for (auto& bucket : buckets_) bucket.set_shard_grads_zero(true);  // the next reductions write, not add
}

template <class Scalar>
double fsdp_engine<Scalar>::grad_squared_norm() const {
  // Bucket by bucket, as finish_reduce sums them: the same bits whether the reductions took them or not.
  double sum = 0;
  for (const auto& bucket : buckets_) {
    const std::optional<double> norm = bucket.shard_grad_squared_norm();
    sum += norm ? *norm : optim::local_squared_norm<Scalar>(grads_.bucket(bucket.index()));
  }
  return sum;
}

template <class Scalar>
memory_report fsdp_engine<Scalar>::memory() const noexcept {
  return {shards_.bytes(), grads_.bytes(), pool_.live_bytes(), pool_.peak_bytes(), pool_.cached_bytes()};
}

template class fsdp_engine<float>;
template class fsdp_engine<double>;

}  // namespace kfsdp
