// The unit scheduler (fsdp/scheduler.hpp), compiled once per scalar type.
#include <kfsdp/fsdp/scheduler.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace kfsdp {

template <class Scalar>
unit_scheduler<Scalar>::unit_scheduler(fsdp_engine<Scalar>& engine, std::vector<fsdp_unit> units)
    : engine_(engine), units_(std::move(units)), state_(units_.size(), unit_state::sharded) {
  const fsdp_options& o = engine_.options();
  for (std::size_t u = 0; u < units_.size(); ++u)  // the sharding's rule: zero3 frees every unit but the root
    reshard_after_forward_.push_back(o.sharding() == sharding_strategy::zero3 && u != 0);
  for (const auto& [name, reshard] : o.reshard_after_forward) {
    const auto named = std::find_if(units_.begin(), units_.end(), [&](const fsdp_unit& x) { return x.name == name; });
    if (named == units_.end()) {
      std::string known;
      for (const fsdp_unit& x : units_) known += (known.empty() ? "'" : ", '") + x.name + "'";
      throw std::invalid_argument("kfsdp::fsdp: options.reshard_after_forward names unit '" + name +
                                  "', which the model does not have; its units are " + known);
    }
    reshard_after_forward_[std::size_t(named - units_.begin())] = reshard;
  }
}

template <class Scalar>
auto unit_scheduler<Scalar>::state(std::size_t unit) const -> unit_state {
  return state_[checked(unit, "state")];
}

template <class Scalar>
void unit_scheduler<Scalar>::begin_forward() {
  if (full_model_) return;
  before_forward(0, next(0, +1));
  current_ = 0;
  region("forward " + units_[0].name);
}

template <class Scalar>
void unit_scheduler<Scalar>::enter_forward(std::size_t unit) {
  if (full_model_ || unit == current_) return;
  region_.reset();
  if (current_ != 0) after_forward(current_);
  before_forward(unit, next(unit, +1));
  current_ = unit;
  region("forward " + units_[unit].name);
}

template <class Scalar>
void unit_scheduler<Scalar>::end_forward() {
  if (full_model_) return;
  region_.reset();
  if (current_ != 0) after_forward(current_);
  after_forward(0);
}

template <class Scalar>
void unit_scheduler<Scalar>::begin_backward(bool sync) {
  sync_ = sync;
  before_backward(0, next(units_.size(), -1));
  current_ = 0;
  region("backward " + units_[0].name);
}

template <class Scalar>
void unit_scheduler<Scalar>::enter_backward(std::size_t unit) {
  if (unit == current_) return;
  region_.reset();
  if (current_ != 0) after_backward(current_, sync_);
  before_backward(unit, next(unit, -1));
  current_ = unit;
  region("backward " + units_[unit].name);
}

template <class Scalar>
void unit_scheduler<Scalar>::end_backward() {
  region_.reset();
  if (current_ != 0) after_backward(current_, sync_);
  after_backward(0, sync_);
}

template <class Scalar>
void unit_scheduler<Scalar>::finish_backward() {
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (state_[u] == unit_state::backward)
      throw std::logic_error("kfsdp::fsdp: finish_backward() while unit " + describe(u) +
                             " is in backward (after_backward first)");
  engine_.finish_gradient_reductions();
  reducing_.clear();
}

template <class Scalar>
void unit_scheduler<Scalar>::end_evaluation() {
  if (!full_model_) reshard_all();
}

template <class Scalar>
void unit_scheduler<Scalar>::hold_full_model() {
  const std::size_t buckets = engine_.plan().buckets.size();
  for (std::size_t b = 0; b < buckets; ++b) buckets_.begin_unshard(b);
  for (std::size_t b = 0; b < buckets; ++b) buckets_.finish_unshard(b);
  full_model_ = true;
}

template <class Scalar>
void unit_scheduler<Scalar>::release_full_model() {
  full_model_ = false;
  for (std::size_t b = 0; b < engine_.plan().buckets.size(); ++b) buckets_.reshard(b);
}

template <class Scalar>
void unit_scheduler<Scalar>::before_forward(std::size_t unit, std::optional<std::size_t> next) {
  expect(unit, "before_forward", {unit_state::sharded, unit_state::forward_done, unit_state::backward_done});
  gather(unit, next);
  state_[unit] = unit_state::forward;
}

template <class Scalar>
void unit_scheduler<Scalar>::after_forward(std::size_t unit) {
  expect(unit, "after_forward", {unit_state::forward});
  if (reshard_after_forward_[unit])
    for (std::size_t b : units_[unit].buckets) buckets_.reshard(b);
  state_[unit] = unit_state::forward_done;
}

template <class Scalar>
void unit_scheduler<Scalar>::before_backward(std::size_t unit, std::optional<std::size_t> next) {
  expect(unit, "before_backward", {unit_state::forward_done});
  gather(unit, next);  // zero2: already unsharded, nothing is issued
  state_[unit] = unit_state::backward;
}

template <class Scalar>
void unit_scheduler<Scalar>::after_backward(std::size_t unit, bool sync) {
  expect(unit, "after_backward", {unit_state::backward});
  // At most one unit of reduce-scatters in flight: the previous unit's, which ran behind this
  // unit's backward, finish now (and this unit's at once without overlap_reduce_scatter). HSDP's
  // all-reduces over the replicas start there and stay in flight until finish_backward. Under HSDP
  // this unit's finish at once: its reduce-scatter is the shard group's (a node's, fast), and the
  // all-reduce that follows, over the slower link between replicas, then runs behind the next
  // unit's backward instead of the one after (bench/cluster at 1 Gbit/s: HSDP / flat 1.01 -> 0.88).
  for (std::size_t u : reducing_)
    for (std::size_t b : units_[u].buckets) buckets_.finish_reduce_scatter(b);
  reducing_.clear();
  for (std::size_t b : units_[unit].buckets) {
    if (sync) buckets_.begin_reduce_gradients(b);
    buckets_.reshard(b);
  }
  if (sync) {
    const std::optional<comm::any_communicator>& replicas = engine_.options().replica_group;
    const bool replicated = replicas.has_value() && replicas->size() > 1;
    if (engine_.options().overlap_reduce_scatter && !replicated) reducing_.push_back(unit);
    else for (std::size_t b : units_[unit].buckets) buckets_.finish_reduce_scatter(b);
  }
  state_[unit] = unit_state::backward_done;
}

template <class Scalar>
void unit_scheduler<Scalar>::reshard_all() {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (state_[u] == unit_state::backward)
      throw std::logic_error("kfsdp::fsdp: reshard_all() while unit " + describe(u) + " is in backward");
    for (std::size_t b : units_[u].buckets)
      if (buckets_.is_unsharded(b) || buckets_.is_gathering(b)) buckets_.reshard(b);
    state_[u] = unit_state::sharded;
  }
}

template <class Scalar>
std::size_t unit_scheduler<Scalar>::checked(std::size_t unit, const char* transition) const {
  if (unit >= units_.size())
    throw std::out_of_range("kfsdp::fsdp: " + std::string(transition) + "(unit " + std::to_string(unit) +
                            "): the model has units 0.." + std::to_string(units_.size() - 1));
  return unit;
}

template <class Scalar>
std::string unit_scheduler<Scalar>::describe(std::size_t unit) const {
  return std::to_string(unit) + " '" + units_[unit].name + "'";
}

template <class Scalar>
void unit_scheduler<Scalar>::expect(std::size_t unit, const char* transition, std::initializer_list<unit_state> allowed) const {
  checked(unit, transition);
  for (unit_state s : allowed)
    if (state_[unit] == s) return;
  std::string expected;
  for (unit_state s : allowed) expected += (expected.empty() ? "'" : " or '") + std::string(state_name(s)) + "'";
  throw std::logic_error("kfsdp::fsdp: " + std::string(transition) + "(unit " + describe(unit) + ") while the unit is '" +
                         std::string(state_name(state_[unit])) + "', expected " + expected);
}

template <class Scalar>
void unit_scheduler<Scalar>::gather(std::size_t unit, std::optional<std::size_t> next) {
  for (std::size_t b : units_[unit].buckets) buckets_.begin_unshard(b);
  if (next)  // overlaps this unit's compute
    for (std::size_t b : units_[checked(*next, "prefetch")].buckets) buckets_.begin_unshard(b);
  for (std::size_t b : units_[unit].buckets) buckets_.finish_unshard(b);
}

// The unit to prefetch after `unit` in this direction (never the root: it is gathered first).
template <class Scalar>
std::optional<std::size_t> unit_scheduler<Scalar>::next(std::size_t unit, int direction) const {
  const std::size_t u = direction > 0 ? unit + 1 : unit - 1;
  if (u == 0 || u >= units_.size()) return std::nullopt;
  return u;
}

template <class Scalar>
void unit_scheduler<Scalar>::region(std::string name) {
  if (engine_.trace()) region_.emplace(engine_.trace(), std::move(name), "compute", trace_recorder::compute_lane, -1, 0);
}

template class unit_scheduler<float>;
template class unit_scheduler<double>;

}  // namespace kfsdp
