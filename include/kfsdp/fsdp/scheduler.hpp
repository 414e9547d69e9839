#pragma once
// unit_scheduler<Scalar> — the one schedule of an FSDP pass over units (fsdp/units.hpp: each
// block, and the root), policy-independent and compiled once per scalar type (src/fsdp/). The
// network tells it which unit its layers run in (enter_forward / enter_backward); it gathers,
// prefetches, frees and reduces around them, and checks the order.
//
// A pass over the root (0) and units 1..3, as the trainer and its network drive it:
//   begin_forward()      gather 0, prefetch 1
//   enter_forward(1)     gather 1 (prefetched), prefetch 2          ... enter_forward(3)
//   end_forward()        zero3: free 3 and every block (the root stays); zero2: keep them all
//                        (the defaults of fsdp_options::reshard_after_forward, which names units otherwise)
//   begin_backward(sync) zero3: gather 0 again, prefetch 3
//   enter_backward(3)    zero3: gather 3, prefetch 2; zero2: nothing to issue
//   enter_backward(2)    issue 3's reduce-scatters (they run behind 2's backward), free 3 ...
//   end_backward()       issue the root's reduce-scatters, free it
//   finish_backward()    finish every reduce-scatter in flight, and under HSDP every all-reduce over the
//                        replicas (issued as each reduce-scatter finished): the gradients are ready
// Each unit walks sharded -> forward -> forward done -> backward -> backward done; a transition out
// of that order throws std::logic_error naming the unit and the state it was in.
//
// kfsdp::trainer owns and drives it, so a user's code cannot call a transition out of the
// trainer's schedule; it alone issues the engine's per-bucket collectives.

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/trace.hpp>
#include <kfsdp/fsdp/units.hpp>

namespace kfsdp {

template <class Scalar>
class unit_scheduler {
 public:
  enum class unit_state { sharded, forward, forward_done, backward, backward_done };

  unit_scheduler(fsdp_engine<Scalar>& engine, std::vector<fsdp_unit> units);
  unit_scheduler(const unit_scheduler&) = delete;  // it holds its engine by reference
  unit_scheduler& operator=(const unit_scheduler&) = delete;

  [[nodiscard]] const std::vector<fsdp_unit>& units() const noexcept { return units_; }
  [[nodiscard]] unit_state state(std::size_t unit) const;
  static constexpr std::string_view state_name(unit_state s) noexcept {
    constexpr std::string_view names[] = {"sharded", "forward", "forward done", "backward", "backward done"};
    return names[static_cast<int>(s)];
  }
  // The unit whose layers run now (0, the root, outside every block).
  [[nodiscard]] const fsdp_unit& current() const noexcept { return units_[current_]; }
  // Whether a unit's parameters are freed after its forward (fsdp_options::reshard_after_forward).
  [[nodiscard]] bool reshards_after_forward(std::size_t unit) const { return reshard_after_forward_[checked(unit, "reshards_after_forward")]; }

  // A pass, as the network drives it (see the worked example above).
  void begin_forward();
  void enter_forward(std::size_t unit);
  void end_forward();
  void begin_backward(bool sync);  // sync = false: gradient accumulation, no reduce-scatter
  void enter_backward(std::size_t unit);
  void end_backward();
  // Finishes every reduce-scatter in flight (before the optimizer reads the gradients).
  void finish_backward();
  // Frees every gathered unit (after an evaluation, which has no backward), except while the
  // whole model is held.
  void end_evaluation();

  // Every bucket gathered until release_full_model(): forward passes then gather nothing.
  void hold_full_model();
  void release_full_model();

  // The transitions a pass is made of (kfsdp's tests drive them directly).
  void before_forward(std::size_t unit, std::optional<std::size_t> next = std::nullopt);
  void after_forward(std::size_t unit);
  void before_backward(std::size_t unit, std::optional<std::size_t> next = std::nullopt);
  // sync = false (gradient accumulation, Thunder's no_sync): the full gradients are kept and
  // summed over micro-batches; the last micro-batch's after_backward(unit, true) reduces them.
  void after_backward(std::size_t unit, bool sync = true);
  void reshard_all();

 private:
  std::size_t checked(std::size_t unit, const char* transition) const;
  std::string describe(std::size_t unit) const;
  void expect(std::size_t unit, const char* transition, std::initializer_list<unit_state> allowed) const;
  void gather(std::size_t unit, std::optional<std::size_t> next);
  std::optional<std::size_t> next(std::size_t unit, int direction) const;
  void region(std::string name);

  fsdp_engine<Scalar>& engine_;
  detail::bucket_collectives<Scalar> buckets_{engine_};  // the engine's per-bucket collectives, issued here alone
  std::vector<fsdp_unit> units_;
  std::vector<unit_state> state_;
  std::vector<bool> reshard_after_forward_;  // per unit, resolved from the options
  std::vector<std::size_t> reducing_;  // units whose reduce-scatters are in flight
  std::size_t current_ = 0;            // the unit the pass is in
  bool sync_ = true;                   // this backward reduces its gradients
  bool full_model_ = false;            // hold_full_model(): every bucket stays gathered
  std::optional<trace_recorder::scope> region_;  // the current unit's compute, in the trace
};

extern template class unit_scheduler<float>;
extern template class unit_scheduler<double>;

}  // namespace kfsdp
