#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::trainer<Model, Scalar> — trains any model descriptor with FSDP: it owns the
// engine (fsdp_engine<Scalar>), its schedule (unit_scheduler) and the model's compute (network),
// each built from one graph of the model; it runs forward unit by unit through the schedule
// (the root first, each unit gathered with the next one prefetched, ZeRO2 or ZeRO3),
// backward in reverse (reduce-scatters behind the next unit's backward), and owns the order of a
// step: zero_grad, every micro-batch, finishing the reductions, clipping, the optimizer. The
// options select the schedule at run time (one trainer type per model and scalar type).
//
//   using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 4, 64>, kfsdp::gelu<>,
//                                 kfsdp::linear<"fc2", 64, 1>, kfsdp::mse<>>;
//   kfsdp::trainer<mlp, double> t(mlp{}, world, {.sharding_strategy = kfsdp::sharding_strategy::zero3,
//                                                 .bucketing_strategy = kfsdp::bucketing::layer});
//   t.initialize(/*seed=*/0);                               // nn.Linear's defaults
//   kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-3});
//   auto [loss, grad_norm] = t.step({{x, y}}, adam);        // x [rows, 4], y [rows, 1] of this rank
//
// Inputs are what the model's first layer takes (a features matrix, or token ids), targets what
// its loss layer compares against (values or class ids); each rank passes its own rows.

#include <fmt/format.h>

#include <kfsdp/compute/network.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/fsdp/scheduler.hpp>
#include <kfsdp/fsdp/trace.hpp>
#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/meta/enum_names.hpp>
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/model/unit_assignment.hpp>
#include <kfsdp/optim/clip.hpp>
#include <kfsdp/train/activation_meter.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace kfsdp {

// How gradients of K micro-batches accumulate.
KFSDP_EXPORT enum class grad_accumulation {
  unsharded,  // Thunder's no_sync: keep full gradients, reduce-scatter once (less traffic, more memory)
  sharded,    // reduce-scatter every micro-batch into the gradient shards (more traffic, less memory)
};

inline constexpr enum_names<grad_accumulation, 2> grad_accumulation_names = {
    {grad_accumulation::unsharded, "unsharded"}, {grad_accumulation::sharded, "sharded"}};

// A name of grad_accumulation_names, or "no_sync" (Thunder's name) for unsharded.
KFSDP_EXPORT inline grad_accumulation parse_grad_accumulation(const std::string& text) {
  if (text == "no_sync") return grad_accumulation::unsharded;
  return parse_named(text, grad_accumulation_names, "grad accumulation");
}

KFSDP_EXPORT struct trainer_options {
  // Activation checkpointing per unit: forward keeps only each unit's input, backward recomputes.
  bool checkpointing = false;
  // A step whose loss or gradient norm is NaN or infinite throws non_finite_loss before the
  // optimizer touches the weights: a diverged run stops instead of training (and saving) NaNs.
  bool stop_on_non_finite = true;
};

// A diverged step (trainer_options::stop_on_non_finite): thrown on every rank alike, the weights
// and the optimizer's state as they were before the step.
KFSDP_EXPORT class non_finite_loss : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct step_result {
  double loss = 0;       // mean over every row (every element for mse) of the global batch
  double grad_norm = 0;  // global norm of the averaged gradient, before clipping
};

namespace detail {
template <class Target, class S>
struct target_value;
template <class S>
struct target_value<class_ids, S> {
  using type = nn::const_index_vector;
};
template <class S>
struct target_value<values, S> {
  using type = nn::const_matrix<S>;
};
// The loss layer's target kind: the last child's, down the tree.
template <class D>
struct target_of {
  using type = typename D::target;
};
// (Told by members, as network's nodes are: nvcc deduces no fixed_string in a partial specialization.)
template <class D>
  requires requires { typename D::children_type; }
struct target_of<D> {
  using children = typename D::children_type;
  using type = typename target_of<std::tuple_element_t<std::tuple_size_v<children> - 1, children>>::type;
};
template <class D>
  requires requires { typename D::element_type; }
struct target_of<D> {
  using type = typename target_of<typename D::element_type>::type;
};
}  // namespace detail

// Compiled once per model and scalar type, whatever the options. It owns the engine, the schedule
// and the network as members, built in that order from one graph.
KFSDP_EXPORT template <descriptor Model, class Scalar>
class trainer {
  static_assert(std::is_same_v<output_t<Model>, loss>, "kfsdp::trainer: the model must end in a loss layer (cross_entropy, mse)");

 public:
  using scalar_type = Scalar;
  using input_type = value_t<input_t<Model>, Scalar>;
  using target_type = typename detail::target_value<typename detail::target_of<std::remove_cv_t<Model>>::type, Scalar>::type;
  // One micro-batch of this rank: inputs [rows, ...] and their targets.
  struct batch {
    input_type inputs;
    target_type targets;
  };

  // The plan is make_shard_plan's for the communicator, or `plan` where one is given, say
  // to_dynamic(static_shard_plan<Model, 8, bucketing::block>): a communicator of another size, or
  // a plan of another bucketing than options', throws std::invalid_argument.
  trainer(const Model& model, comm::any_communicator comm, const fsdp_options& options = {}, trainer_options t = {},
          std::optional<shard_plan> plan = std::nullopt)
      : trainer(make_model_graph(model), model, std::move(comm), options, t, std::move(plan)) {}

  // The schedule and the pass hold the engine by reference.
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  // The engine: the shards, the gradients, state dicts (its per-bucket collectives are the schedule's alone).
  [[nodiscard]] fsdp_engine<Scalar>& engine() noexcept { return engine_; }
  [[nodiscard]] const fsdp_engine<Scalar>& engine() const noexcept { return engine_; }
  [[nodiscard]] const std::vector<fsdp_unit>& units() const noexcept { return schedule_.units(); }
  [[nodiscard]] trainer_options& options() noexcept { return options_; }

  // Every parameter from its layer's default (param_info::init), or from choose(info).
  void initialize(std::uint64_t seed) { engine_.initialize(seed); }
  void initialize(std::uint64_t seed, const typename fsdp_engine<Scalar>::initializer& choose) {
    engine_.initialize(seed, choose);
  }

  // One optimizer step over K = micro_batches.size() micro-batches of this rank: the gradient of
  // the mean loss over every rank's rows, clipped to max_norm (0: no clipping), then optimizer.step
  // on the local shards. Every rank must call it (collective).
  template <class Optimizer>
  step_result step(std::span<const batch> micro_batches, Optimizer& optimizer, double max_norm = 0,
                   grad_accumulation accumulation = grad_accumulation::unsharded) {
    if (micro_batches.empty()) throw std::invalid_argument("kfsdp::trainer::step: no micro-batch given");
    engine_.zero_grad();
    activation_meter::reset_peak();
    double rows[1] = {0};  // this rank's, then every rank's
    for (const batch& b : micro_batches) rows[0] += double(rows_of(b.inputs));
    engine_.sum_over_ranks(std::span<double>(rows));
    const double global_rows = rows[0];
    if (global_rows == 0) throw std::invalid_argument("kfsdp::trainer::step: the global batch has no rows");
    // Each rank's loss gradient is scaled so that the engine's average over ranks is the gradient of the global mean.
    pass_.grad_scale = Scalar(1) / Scalar(global_rows / double(engine_.data_parallel_size()));
    double loss_sum = 0;
    for (std::size_t k = 0; k < micro_batches.size(); ++k) {
      const batch& b = micro_batches[k];
      const bool sync = accumulation == grad_accumulation::sharded || k + 1 == micro_batches.size();
      const double mean = double(forward(b.inputs, b.targets));
      backward(sync);
      schedule_.finish_backward();  // the next micro-batch accumulates into the buffers these reduce
      loss_sum += mean * double(rows_of(b.inputs));
    }
    step_result result;
    // Under HSDP every replica holds the same gradient shards: each adds 1/replicas of its norm.
    double sums[2] = {loss_sum, engine_.grad_squared_norm() / double(engine_.replica_count())};
    engine_.sum_over_ranks(std::span<double>(sums));
    result.loss = sums[0] / global_rows;
    result.grad_norm = std::sqrt(sums[1]);
    // Both are sums over every rank: every rank decides alike.
    if (options_.stop_on_non_finite && !(std::isfinite(result.loss) && std::isfinite(result.grad_norm)))
      throw non_finite_loss(fmt::format(
          "kfsdp::trainer::step: the loss is {}, the gradient norm {}, expected finite values{}: the run diverged "
          "(a lower learning rate or gradient clipping may help); the weights are left as they were before this step",
          result.loss, result.grad_norm, where_non_finite(micro_batches, std::isfinite(result.loss))));
    const double scale = max_norm > 0 ? optim::clip_scale(result.grad_norm, max_norm) : 1.0;
    {
      const trace_recorder::scope region(engine_.trace(), "optimizer", "compute", trace_recorder::compute_lane, -1, 0);
      // Clipping inside the optimizer's pass where it takes the factor (kfsdp's do); the gradients stay unclipped.
      if constexpr (requires { optimizer.step(engine_.shards().flat(), engine_.grads().flat(), scale); }) {
        optimizer.step(engine_.shards().flat(), engine_.grads().flat(), scale);
      } else {
        if (scale < 1) optim::scale_in_place(engine_.grads().flat(), scale);
        optimizer.step(engine_.shards().flat(), engine_.grads().flat());
      }
    }
    return result;
  }
  template <class Optimizer>
  step_result step(std::initializer_list<batch> micro_batches, Optimizer& optimizer, double max_norm = 0,
                   grad_accumulation accumulation = grad_accumulation::unsharded) {
    return step(std::span<const batch>(micro_batches.begin(), micro_batches.size()), optimizer, max_norm, accumulation);
  }

  // The mean loss over every rank's rows of these batches (forward only; collective: every
  // rank passes as many batches, or calls it inside with_full_model).
  double evaluate(std::span<const batch> batches) {
    double sums[2] = {0, 0};
    for (const batch& b : batches) {
      sums[0] += forward_loss(b) * double(rows_of(b.inputs));
      sums[1] += double(rows_of(b.inputs));
    }
    engine_.sum_over_ranks(std::span<double>(sums));
    return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  }
  double evaluate(std::initializer_list<batch> batches) {
    return evaluate(std::span<const batch>(batches.begin(), batches.size()));
  }
  // This rank's mean loss on one batch (forward only; collective outside with_full_model).
  double forward_loss(const batch& b) {
    const double value = double(forward(b.inputs, b.targets));
    end_evaluation();
    return value;
  }

  // The model's output for these inputs (the loss layer's input: logits, predictions), a copy
  // on this rank (collective: the units are gathered as in training).
  nn::matrix<Scalar> predict(input_type inputs) {
    forward(inputs, target_type{});
    nn::matrix<Scalar> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::predictions"),
                           pass_.predictions.extent(0), pass_.predictions.extent(1));
    Kokkos::deep_copy(out, pass_.predictions);
    end_evaluation();
    return out;
  }

  // Runs f() with every parameter gathered once (many predictions: sampling text), then reshards.
  template <class F>
  decltype(auto) with_full_model(F&& f) {
    schedule_.hold_full_model();
    struct restore {
      unit_scheduler<Scalar>& schedule;
      ~restore() { schedule.release_full_model(); }
    } guard{schedule_};
    return f();
  }

  // Activation memory (the layers' outputs, caches and gradients) at its peak during the last
  // step, measured by activation_meter (all of this process's trainers together).
  [[nodiscard]] std::size_t peak_activation_bytes() const noexcept { return peak_activations_; }

 private:
  // One graph, its units assigned once: the engine takes its table, the schedule and the network its units.
  trainer(const model_graph& graph, const Model& model, comm::any_communicator comm, const fsdp_options& options,
          trainer_options t, std::optional<shard_plan> plan)
      : trainer(graph, assign_units(graph, options.wrap), model, std::move(comm), options, t, std::move(plan)) {}
  trainer(const model_graph& graph, const unit_assignment& units, const Model& model, comm::any_communicator comm,
          const fsdp_options& options, trainer_options t, std::optional<shard_plan> plan)
      : engine_(graph.params, std::move(comm), options, std::move(plan)),
        schedule_(engine_, make_units(graph, units, engine_.plan())),
        network_(model, graph, units),
        options_(t),
        pass_(engine_, schedule_) {
    activation_meter::install();
    engine_.set_grad_norm_with_reductions(true);  // step() reads the norm every time
  }

  static std::size_t rows_of(const input_type& x) { return x.extent(0); }

  // Where a step went non-finite, for its error: with a non-finite loss, the first layer (in forward
  // order) whose output is not finite on some rank, from a forward of the same micro-batches
  // again; with a finite loss, the first parameter in backward order (the last in the table) whose
  // gradient is not. Collective. A layer's unit is the one the plan runs it in (a layer after the
  // blocks, ln_f say, is the root's).
  //   ", first in the output of layer 'h.1.mlp.c_fc' (unit 'h.1')", ", first in the output of layer 'ln_f' (unit 'root')"
  //   or ", first in the gradient of 'fc1.weight'"
  std::string where_non_finite(std::span<const batch> micro_batches, bool loss_finite) {
    std::vector<std::string> places;
    std::vector<double> hit;  // per place: 1 where this rank saw a non-finite value, then summed over ranks
    if (!loss_finite) {
      pass_.checked.clear();
      pass_.checking_outputs = true;
      for (const batch& b : micro_batches) {
        forward(b.inputs, b.targets);
        end_evaluation();
      }
      pass_.checking_outputs = false;
      const std::size_t layers = pass_.checked.size() / micro_batches.size();  // the same layers each time
      hit.assign(layers, 0.0);
      for (std::size_t i = 0; i < pass_.checked.size(); ++i)
        if (!pass_.checked[i].finite) hit[i % layers] = 1.0;
      for (const auto& [layer, unit, finite] : std::span(pass_.checked).first(layers)) {  // the unit where it is not the layer
        const std::string& name = unit < schedule_.units().size() ? schedule_.units()[unit].name : layer;
        places.push_back(fmt::format("the output of layer '{}'{}", layer, name == layer ? "" : " (unit '" + name + "')"));
      }
      hit.push_back(1.0);  // every layer's output finite: the loss layer made it
      places.push_back("the loss layer (its input is finite)");
    } else {
      const auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), engine_.grad_shards().flat());
      for (std::size_t p = 0; p < engine_.params().size(); ++p) {
        const auto chunk = engine_.mapping().chunk(p);
        bool finite = true;
        for (std::size_t i = chunk.first; i < chunk.last(); ++i) finite = finite && std::isfinite(double(grads(i)));
        hit.push_back(finite ? 0.0 : 1.0);
        places.push_back(fmt::format("the gradient of '{}'", engine_.params()[p].name.view()));
      }
    }
    engine_.sum_over_ranks(std::span<double>(hit));
    if (loss_finite) {  // gradients are computed in backward order, from the last parameter to the first
      std::reverse(hit.begin(), hit.end());
      std::reverse(places.begin(), places.end());
    }
    for (std::size_t i = 0; i < hit.size(); ++i)
      if (hit[i] > 0) return ", first in " + places[i];
    return {};
  }

  Scalar forward(input_type inputs, target_type targets) {
    pass_.set_targets(targets);
    pass_.checkpointing = options_.checkpointing;
    schedule_.begin_forward();
    const Scalar loss_value = network_.forward(pass_, inputs);
    schedule_.end_forward();
    return loss_value;
  }
  void backward(bool sync) {
    schedule_.begin_backward(sync);
    network_.backward(pass_);
    schedule_.end_backward();
    peak_activations_ = activation_meter::peak();
  }
  void end_evaluation() {
    schedule_.end_evaluation();
  }

  // A pass's view of the engine: the full parameters and gradients the layers read and write, and
  // the schedule that gathers each unit as the network enters it.
  class training_pass final : public pass_context<Scalar> {
   public:
    training_pass(fsdp_engine<Scalar>& engine, unit_scheduler<Scalar>& schedule) : engine_(engine), schedule_(schedule) {}
    void enter_forward(std::size_t unit) override { schedule_.enter_forward(unit); }
    void enter_backward(std::size_t unit) override { schedule_.enter_backward(unit); }
    void set_targets(nn::const_index_vector ids) { this->target_ids = ids; }
    void set_targets(nn::const_matrix<Scalar> v) { this->target_values = v; }
    layer_params<Scalar> grads(std::span<const std::size_t> indices, bool skips_frozen) override {
      layer_params<Scalar> g;  // a tied parameter's uses all accumulate into its one full gradient
      for (std::size_t i : indices) {
        if (skips_frozen && engine_.is_frozen(i)) g.push_absent(engine_.params()[i]);  // no buffer, no product
        else g.push(engine_.full_grad(i), engine_.params()[i]);
      }
      return g;
    }

   private:
    layer_params<const Scalar> bind_params(std::span<const std::size_t> indices) override {
      layer_params<const Scalar> p;
      for (std::size_t i : indices) p.push(engine_.full_param(i), engine_.params()[i]);
      return p;
    }
    std::uint64_t params_version(std::span<const std::size_t> indices) const override {
      std::uint64_t sum = 0;  // each version only grows: the sum moves when any of them does
      for (std::size_t i : indices) sum += engine_.params_version(i);
      return sum;
    }

    fsdp_engine<Scalar>& engine_;
    unit_scheduler<Scalar>& schedule_;
  };

  fsdp_engine<Scalar> engine_;
  unit_scheduler<Scalar> schedule_;  // holds engine_ by reference: declared after it
  network<Model, Scalar> network_;
  trainer_options options_;
  training_pass pass_;
  std::size_t peak_activations_ = 0;
};

}  // namespace kfsdp
