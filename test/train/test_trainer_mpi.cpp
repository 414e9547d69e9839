// A user's own model, one descriptor, trained sharded with no schedule code: a 6-layer MLP with
// residual hidden layers and a user-written layer, at world size N against one process, for
// every sharding x bucketing x checkpointing (double, 1e-10). Run with 1, 2 and 3 ranks.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/scheduler.hpp>
#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/gradient_check.hpp>
#include <kfsdp/train/trainer.hpp>

#include "gradient_check.hpp"
#include "../support/messages.hpp"

namespace {

// The user's layer: y = x · factor, one learnable scalar (starts at 1). Its compute is a class of its own, not
// nested in scale<Name>: nvcc cannot name a kernel inside a class whose template arguments hold a string.
template <class S>
struct scale_op {
  template <class Layer>
  explicit scale_op(const Layer&) {}
  kfsdp::nn::const_matrix<S> input;

  void forward(const kfsdp::layer_params<const S>& p, kfsdp::nn::const_matrix<S> x, kfsdp::nn::matrix<S> y) {
    const auto factor = p.vector(0);
    Kokkos::parallel_for("scale::forward", Kokkos::RangePolicy<>(0, int(x.extent(0))), KOKKOS_LAMBDA(int r) {
      for (std::size_t c = 0; c < x.extent(1); ++c) y(r, c) = factor(0) * x(r, c);
    });
    input = x;
  }
  void backward(const kfsdp::layer_params<const S>& p, const kfsdp::layer_params<S>& g, kfsdp::nn::const_matrix<S> dy,
                kfsdp::nn::matrix<S> dx) {
    const auto factor = p.vector(0);
    const auto dfactor = g.vector(0);
    const auto x = input;
    // One thread sums in row order: the same bits every run.
    Kokkos::parallel_for("scale::backward_factor", Kokkos::RangePolicy<>(0, 1), KOKKOS_LAMBDA(int) {
      S sum = 0;
      for (std::size_t r = 0; r < x.extent(0); ++r)
        for (std::size_t c = 0; c < x.extent(1); ++c) sum += dy(r, c) * x(r, c);
      dfactor(0) += sum;
    });
    if (dx.data() == nullptr) return;  // no input gradient wanted
    Kokkos::parallel_for("scale::backward_dx", Kokkos::RangePolicy<>(0, int(dy.extent(0))), KOKKOS_LAMBDA(int r) {
      for (std::size_t c = 0; c < dy.extent(1); ++c) dx(r, c) = factor(0) * dy(r, c);
    });
  }
};

template <kfsdp::fixed_string Name>
struct scale {
  static constexpr auto name = Name;
  static constexpr kfsdp::layer_kind kind = kfsdp::layer_kind::layer;
  constexpr auto params() const { return std::array{kfsdp::param_decl{"factor", {1}, {kfsdp::init_rule::ones}}}; }
  template <class S>
  using compute = scale_op<S>;
};

constexpr std::size_t width = 24;
// 6 layers with parameters: input, 3 residual hidden layers (each an FSDP unit), scale, output.
using surrogate = kfsdp::sequential<"", kfsdp::linear<"input", 6, width>, kfsdp::tanh_layer<>,
                                    kfsdp::repeat<"hidden", 3, kfsdp::residual<"", kfsdp::linear<"fc", width, width>, kfsdp::gelu<>>>,
                                    scale<"scale">, kfsdp::linear<"output", width, 1>, kfsdp::mse<>>;

kfsdp::io::array_dataset samples() {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  constexpr std::size_t count = 96;
  std::vector<double> x(count * 6), y(count);
  for (std::size_t i = 0; i < count; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < 6; ++j) s += (j + 1) * (x[i * 6 + j] = u(rng));
    y[i] = std::sin(s / 4);
  }
  return kfsdp::io::array_dataset(x, 6, y, 1);
}

struct run {
  std::vector<double> losses;
  std::size_t peak_activations = 0;
  std::size_t bytes_communicated = 0;
  std::size_t bindings = 0;  // layers' parameter views bound over the run (kfsdp::detail::param_bindings_made)
};

constexpr std::size_t global_batch = 24;  // splits over 1, 2, 3 and 4 ranks

constexpr auto zero2 = kfsdp::sharding_strategy::zero2, zero3 = kfsdp::sharding_strategy::zero3;
constexpr auto no_buckets = kfsdp::bucketing::none, layer = kfsdp::bucketing::layer,
               block = kfsdp::bucketing::block;

run train(kfsdp::comm::any_communicator comm, kfsdp::sharding_strategy sharding, kfsdp::bucketing bucketing,
          bool checkpointing, std::size_t micro_batches = 1,
          kfsdp::grad_accumulation accumulation = kfsdp::grad_accumulation::unsharded,
          std::vector<std::pair<std::string, bool>> reshard_after_forward = {}) {
  const auto data = samples();
  kfsdp::trainer<surrogate, double> t(surrogate{}, comm,
                                      {.sharding_strategy = sharding,
                                       .bucketing_strategy = bucketing,
                                       .limit_all_gathers = 2,
                                       .reshard_after_forward = reshard_after_forward},
                                      {.checkpointing = checkpointing});
  t.initialize(42);
  kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-2});
  run out;
  const std::size_t bindings_before = kfsdp::detail::param_bindings_made;
  const std::size_t ws = std::size_t(t.engine().world_size()), rank = std::size_t(t.engine().rank());
  for (std::size_t step = 0; step < 4; ++step) {
    std::vector<typename decltype(t)::batch> batches;
    for (std::size_t k = 0; k < micro_batches; ++k) {
      auto [x, y] = data.rank_slice<double>(data.micro_batch(1, step * micro_batches + k, global_batch / micro_batches), rank, ws);
      batches.push_back({x, y});
    }
    out.losses.push_back(t.step(batches, adam, /*max_norm=*/1.0, accumulation).loss);
  }
  out.peak_activations = t.peak_activation_bytes();
  out.bytes_communicated = t.engine().bytes_communicated();
  out.bindings = kfsdp::detail::param_bindings_made - bindings_before;
  return out;
}

void check_same(const run& got, const run& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= 1e-10 * std::abs(want.losses[s]));
  }
}

}  // namespace

TEST_CASE("the MLP trains world-size invariantly: every sharding x bucketing x checkpointing") {
  kfsdp::comm::mpi world;
  kfsdp::comm::self one;
  const run reference = train(one, zero2, no_buckets, false);
  CHECK(reference.losses.back() < reference.losses.front());  // it learns
  for (bool checkpointing : {false, true})
    for (kfsdp::sharding_strategy sharding : {zero2, zero3})
      for (kfsdp::bucketing bucketing : {no_buckets, layer, block}) {
        CAPTURE(checkpointing);
        CAPTURE(kfsdp::to_string(sharding));
        CAPTURE(kfsdp::to_string(bucketing));
        check_same(train(world, sharding, bucketing, checkpointing), reference);
      }
}

TEST_CASE("reshard_after_forward per unit: the root freed, a block kept, a block of zero2 freed; the same losses bit for bit") {
  kfsdp::comm::mpi world;
  constexpr auto unsharded = kfsdp::grad_accumulation::unsharded;
  const run z3 = train(world, zero3, block, false);
  const run root_freed = train(world, zero3, block, false, 1, unsharded, {{"root", true}});
  const run block_kept = train(world, zero3, block, false, 1, unsharded, {{"hidden.1.fc", false}});
  const run z2 = train(world, zero2, block, false);
  const run z2_freed = train(world, zero2, block, false, 1, unsharded, {{"hidden.0.fc", true}});
  CHECK(root_freed.losses == z3.losses);
  CHECK(block_kept.losses == z3.losses);
  CHECK(z2_freed.losses == z2.losses);
  CHECK(root_freed.bytes_communicated > z3.bytes_communicated);  // the root gathered again for backward
  CHECK(block_kept.bytes_communicated < z3.bytes_communicated);
  CHECK(z2_freed.bytes_communicated > z2.bytes_communicated);
  CHECK_THROWS_WITH_AS(
      train(world, zero3, no_buckets, false, 1, unsharded, {{"hidden.9.fc", true}}),
      "kfsdp::fsdp: options.reshard_after_forward names unit 'hidden.9.fc', which the model does not have; "
      "its units are 'root', 'hidden.0.fc', 'hidden.1.fc', 'hidden.2.fc'",
      std::invalid_argument);
}

TEST_CASE("a layer's parameter views are bound once per gathering of its unit, not on every call") {
  kfsdp::comm::mpi world;
  // 6 layers with parameters, each called twice a step (forward, backward), over 4 steps: 48 calls.
  // The root's 3 are gathered once a step; the 3 hidden blocks once for forward and once for backward.
  CHECK(train(world, zero3, block, false).bindings == 4 * (3 + 2 * 3));
  CHECK(train(world, zero3, block, false, 1, kfsdp::grad_accumulation::unsharded, {{"root", true}}).bindings == 4 * 2 * 6);
  CHECK(train(world, zero2, block, false).bindings == 4 * 6);  // zero2 keeps every unit gathered through the step
  // Checkpointing recomputes a block's forward in its backward, with the views its gathering bound.
  CHECK(train(world, zero3, block, true).bindings == 4 * (3 + 2 * 3));
}

TEST_CASE("checkpointing keeps less activation memory, measured") {
  kfsdp::comm::mpi world;
  const run plain = train(world, zero3, block, false);
  const run checkpointed = train(world, zero3, block, true);
  MESSAGE("peak activation bytes: ", plain.peak_activations, " without, ", checkpointed.peak_activations, " with checkpointing");
  CHECK(plain.peak_activations > 0);
  CHECK(checkpointed.peak_activations < plain.peak_activations);
}

TEST_CASE("gradient accumulation over 2 micro-batches equals one batch, both modes") {
  kfsdp::comm::mpi world;
  kfsdp::comm::self one;
  const run reference = train(one, zero2, no_buckets, false);
  for (auto mode : {kfsdp::grad_accumulation::unsharded, kfsdp::grad_accumulation::sharded}) {
    CAPTURE(int(mode));
    check_same(train(world, zero3, layer, false, 2, mode), reference);
    check_same(train(world, zero2, block, true, 2, mode), reference);
  }
}

// What trainer.engine() gives a user: no per-bucket collective (the trainer's schedule alone issues them).
template <class E>
concept exposes_bucket_collectives =
    requires(E& e) { e.begin_unshard(0); } || requires(E& e) { e.finish_unshard(0); } || requires(E& e) { e.unshard(0); } ||
    requires(E& e) { e.reshard(0); } || requires(E& e) { e.begin_reduce_gradients(0); } ||
    requires(E& e) { e.finish_reduce_gradients(0); } || requires(E& e) { e.reduce_gradients(0); };
using surrogate_trainer = kfsdp::trainer<surrogate, double>;
static_assert(!exposes_bucket_collectives<std::remove_reference_t<decltype(std::declval<surrogate_trainer&>().engine())>>);
static_assert(exposes_bucket_collectives<kfsdp::detail::bucket_collectives<double>>);  // the check sees them where they are

TEST_CASE("a trainer builds its model's graph once and assigns its units once") {
  kfsdp::comm::mpi world;
  const std::size_t graphs = kfsdp::detail::model_graphs_built, assignments = kfsdp::detail::unit_assignments_made;
  surrogate_trainer t(surrogate{}, world, {.sharding_strategy = zero3, .bucketing_strategy = block});
  CHECK(kfsdp::detail::model_graphs_built - graphs == 1);
  CHECK(kfsdp::detail::unit_assignments_made - assignments == 1);
  CHECK(t.units().size() == 4);  // the schedule's units and the network's are the one assignment's
}

TEST_CASE("the units come from the tree; a hook out of order names the unit and its state") {
  kfsdp::comm::mpi world;
  // The schedule as the trainer builds it: the engine from the model's table, the units from its graph.
  const kfsdp::model_graph graph = kfsdp::make_model_graph(surrogate{});
  kfsdp::fsdp_engine<double> engine(graph.params, world,
                                    {.sharding_strategy = zero3, .bucketing_strategy = block});
  kfsdp::unit_scheduler<double> schedule(engine,
                                         kfsdp::make_units(graph, engine.plan(), engine.options().wrap));
  REQUIRE(schedule.units().size() == 4);
  CHECK(schedule.units()[0].name == "root");
  CHECK(schedule.units()[0].params.size() == 5);  // input.{weight,bias}, scale.factor, output.{weight,bias}
  CHECK(schedule.units()[1].name == "hidden.0.fc");  // the dotted prefix its parameters share
  CHECK(schedule.units()[3].name == "hidden.2.fc");
  try {
    schedule.after_backward(2);
    FAIL("after_backward before before_backward must throw");
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()) ==
          "kfsdp::fsdp: after_backward(unit 2 'hidden.1.fc') while the unit is 'sharded', expected 'backward'");
  }
  schedule.before_forward(1, 2);
  CHECK_THROWS_WITH_AS(schedule.before_backward(1),
                       doctest::Contains("while the unit is 'forward', expected 'forward done'"),
                       std::logic_error);
  // Every layer its own unit: a block's bucket spanning two of them is refused, naming it.
  using two_layer_block = kfsdp::sequential<"", kfsdp::block<"b", kfsdp::linear<"l1", 2, 2>, kfsdp::linear<"l2", 2, 2>>, kfsdp::mse<>>;
  CHECK_THROWS_WITH_AS(
      (kfsdp::trainer<two_layer_block, double>(
          two_layer_block{}, world,
          {.bucketing_strategy = kfsdp::bucketing::block, .wrap = {.policy = kfsdp::wrap_policy::layers}})),
      doctest::Contains("choose a bucketing whose buckets lie in one unit"), std::invalid_argument);
}

TEST_CASE("a model without blocks: a unit per layer by default, so ZeRO3 frees its parameters; it trains the same") {
  using plain_mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 6, width>, kfsdp::gelu<>, kfsdp::linear<"fc2", width, width>,
                                      kfsdp::gelu<>, kfsdp::linear<"fc3", width, 1>, kfsdp::mse<>>;
  kfsdp::comm::mpi world;
  kfsdp::trainer<plain_mlp, double> by_default(
      plain_mlp{}, world,
      {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer});
  kfsdp::trainer<plain_mlp, double> in_root(plain_mlp{}, world,
                                            {.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                             .bucketing_strategy = kfsdp::bucketing::layer,
                                             .wrap = {.policy = kfsdp::wrap_policy::blocks}});
  REQUIRE(by_default.units().size() == 4);
  CHECK(by_default.units()[0].params.empty());
  CHECK(by_default.units()[1].name == "fc1");
  CHECK(by_default.units()[2].name == "fc2");
  CHECK(by_default.units()[3].name == "fc3");
  CHECK(in_root.units().size() == 1);  // blocks, asked for: everything in the root, as before
  const auto data = samples();
  const std::size_t ws = std::size_t(world.size()), rank = std::size_t(world.rank());
  std::vector<double> losses[2];
  std::size_t peaks[2] = {0, 0};
  for (int which = 0; which < 2; ++which) {
    auto& t = which == 0 ? by_default : in_root;
    t.initialize(5);
    kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-2});
    for (std::size_t step = 0; step < 3; ++step) {
      auto [x, y] = data.rank_slice<double>(data.micro_batch(/*seed=*/3, step, global_batch), rank, ws);
      t.engine().reset_peak_memory();
      losses[which].push_back(t.step({{x, y}}, adam).loss);
      peaks[which] = std::max(peaks[which], t.engine().memory().unsharded_peak);
    }
  }
  CHECK(losses[0] == losses[1]);
  CHECK(peaks[0] < peaks[1]);  // one layer gathered at a time (and the next prefetched), not the whole model
}

TEST_CASE("a step whose loss is not finite throws non_finite_loss on every rank, the weights left as they were") {
  kfsdp::comm::mpi world;
  const auto data = samples();
  const std::size_t ws = std::size_t(world.size()), rank = std::size_t(world.rank());
  auto [x, y] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, 0, global_batch), rank, ws);
  kfsdp::nn::matrix<double> diverged("diverged", y.extent(0), 1);
  Kokkos::deep_copy(diverged, world.rank() == 0 ? std::numeric_limits<double>::infinity() : 0.5);  // one rank's rows
  kfsdp::trainer<surrogate, double> t(
      surrogate{}, world,
      {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer});
  t.initialize(42);
  kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-2});
  (void)t.step({{x, y}}, adam, 1.0);
  const kfsdp::state_dict before = t.engine().original_state_dict();
  CHECK_THROWS_WITH_AS((void)t.step({{x, diverged}}, adam, 1.0),
                       doctest::Contains("kfsdp::trainer::step: the loss is inf, the gradient norm "),
                       kfsdp::non_finite_loss);
  // Where: every layer's output is finite, the targets are not.
  CHECK_THROWS_WITH_AS((void)t.step({{x, diverged}}, adam, 1.0),
                       doctest::Contains("expected finite values, first in the loss layer (its input is finite): "),
                       kfsdp::non_finite_loss);
  const kfsdp::state_dict after = t.engine().original_state_dict();
  for (const kfsdp::tensor& p : before) {
    CAPTURE(p.name);
    CHECK(after.at(p.name).bytes == p.bytes);
  }
  // Asked not to stop, it steps unclipped (clipping refuses a NaN norm itself), and the weights take the NaNs.
  t.options().stop_on_non_finite = false;
  CHECK_FALSE(std::isfinite(t.step({{x, diverged}}, adam).loss));
  CHECK_FALSE(std::isfinite(t.step({{x, y}}, adam).loss));
}

TEST_CASE("a non-finite step names where it went non-finite: the first layer whose output is, or the gradient") {
  kfsdp::comm::mpi world;
  const auto data = samples();
  const std::size_t ws = std::size_t(world.size()), rank = std::size_t(world.rank());
  auto [x, y] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, 0, global_batch), rank, ws);
  kfsdp::trainer<surrogate, double> t(
      surrogate{}, world,
      {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer});
  t.initialize(42);
  kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-2});
  kfsdp::state_dict full = t.engine().original_state_dict();
  full.at("hidden.1.fc.weight").values<double>()[3] = std::numeric_limits<double>::quiet_NaN();
  t.engine().load_original_state_dict(full);
  // Two micro-batches: both forwards are checked again. Each layer is its own unit here (layer bucketing), so no
  // unit is named beside it.
  CHECK_THROWS_WITH_AS((void)t.step({{x, y}, {x, y}}, adam, 1.0),
                       doctest::Contains("expected finite values, first in the output of layer 'hidden.1.fc': "),
                       kfsdp::non_finite_loss);
  // A finite loss with a non-finite gradient: the scale layer's input is huge (1e307, from the last hidden layer's
  // bias) and its factor 0, so the prediction is the output's bias; d factor = sum of input · (output weights ·
  // d loss) overflows.
  full.at("hidden.1.fc.weight").values<double>()[3] = 0.1;
  for (double& b : full.at("hidden.2.fc.bias").values<double>()) b = 1e307;
  full.at("scale.factor").values<double>()[0] = 0.0;
  for (double& w : full.at("output.weight").values<double>()) w = 1e3;
  t.engine().load_original_state_dict(full);
  CHECK_THROWS_WITH_AS((void)t.step({{x, y}}, adam, 1.0),
                       doctest::Contains("expected finite values, first in the gradient of 'scale.factor': "),
                       kfsdp::non_finite_loss);
}

TEST_CASE("a non-finite output names the unit the plan runs its layer in: a layer after the blocks is the root's") {
  kfsdp::comm::mpi world;
  const auto data = samples();
  const std::size_t ws = std::size_t(world.size()), rank = std::size_t(world.rank());
  auto [x, y] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, 0, global_batch), rank, ws);
  // Blocks: the hidden layers are units 1-3, input, scale and output the root's (unit 0, 'root').
  kfsdp::trainer<surrogate, double> t(surrogate{}, world,
                                      {.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                       .bucketing_strategy = kfsdp::bucketing::block,
                                       .wrap = {.policy = kfsdp::wrap_policy::blocks}});
  REQUIRE(t.units().size() == 4);
  REQUIRE(t.units()[0].name == "root");
  t.initialize(42);
  kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-2});
  const kfsdp::state_dict initial = t.engine().original_state_dict();
  const auto message = [&](const std::string& param) {
    kfsdp::state_dict full = initial;
    full.at(param).values<double>()[0] = std::numeric_limits<double>::quiet_NaN();
    t.engine().load_original_state_dict(full);
    return kfsdp::test::error_message<kfsdp::non_finite_loss>([&] { (void)t.step({{x, y}}, adam, 1.0); });
  };
  // 'scale' runs after the last hidden block, in the root: it was named as in the last unit entered, 'hidden.2'.
  CHECK_MESSAGE(message("scale.factor").find("first in the output of layer 'scale' (unit 'root'): ") != std::string::npos,
                message("scale.factor"));
  CHECK_MESSAGE(message("output.weight").find("first in the output of layer 'output' (unit 'root'): ") != std::string::npos,
                message("output.weight"));
  CHECK_MESSAGE(message("input.weight").find("first in the output of layer 'input' (unit 'root'): ") != std::string::npos,
                message("input.weight"));
  // A block's layer: its unit (named by its parameters' prefix, the layer's own name here, so not repeated).
  REQUIRE(t.units()[2].name == "hidden.1.fc");
  CHECK_MESSAGE(message("hidden.1.fc.weight").find("first in the output of layer 'hidden.1.fc': ") != std::string::npos,
                message("hidden.1.fc.weight"));
}

TEST_CASE("int8 collectives carry NaN through: a non-finite step is refused as with scalar ones, naming the place") {
  kfsdp::comm::mpi world;
  const auto data = samples();
  const std::size_t ws = std::size_t(world.size()), rank = std::size_t(world.rank());
  auto [x, y] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, 0, global_batch), rank, ws);
  using kfsdp::wire_precision;
  for (const auto& [param_dtype, reduce_dtype] : {std::pair{wire_precision::scalar, wire_precision::scalar},
                                                  std::pair{wire_precision::int8, wire_precision::scalar},
                                                  std::pair{wire_precision::scalar, wire_precision::int8},
                                                  std::pair{wire_precision::int8, wire_precision::int8}}) {
    const std::string wires = std::string(kfsdp::name_of(kfsdp::wire_precision_names, param_dtype)) + " all-gather, " +
                              std::string(kfsdp::name_of(kfsdp::wire_precision_names, reduce_dtype)) + " reduction";
    CAPTURE(wires);
    kfsdp::trainer<surrogate, double> t(surrogate{}, world,
                                        {.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                         .bucketing_strategy = kfsdp::bucketing::layer,
                                         .param_dtype = param_dtype,
                                         .reduce_dtype = reduce_dtype});
    t.initialize(42);
    kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-2});
    const kfsdp::state_dict initial = t.engine().original_state_dict();
    // A NaN weight: the all-gather (int8 or not) hands the layer a NaN, its output and the loss are NaN, and so is
    // every gradient behind it (an int8 reduction once summed them to numbers: "the gradient norm 0"). The text
    // before ", expected" is the gradient norm: "nan" (or "-nan").
    kfsdp::state_dict full = initial;
    full.at("hidden.1.fc.weight").values<double>()[3] = std::numeric_limits<double>::quiet_NaN();
    t.engine().load_original_state_dict(full);
    CHECK_THROWS_WITH_AS((void)t.step({{x, y}}, adam, 1.0),
                         doctest::Contains("nan, expected finite values, first in the output of layer 'hidden.1.fc': "),
                         kfsdp::non_finite_loss);
    if (param_dtype == wire_precision::int8) continue;  // 1e307 is beyond an f32 scale: the gather itself makes NaN
    // A finite loss with a NaN gradient: the scale layer's input is huge (1e307) and its factor 0, so the prediction
    // is the output's bias; d factor = sum of input · (output weights · d loss) meets +inf and -inf (the output
    // weights alternate in sign) and is NaN on every rank. An int8 reduction once passed it on as a number.
    full = initial;
    for (double& b : full.at("hidden.2.fc.bias").values<double>()) b = 1e307;
    full.at("scale.factor").values<double>()[0] = 0.0;
    double sign = 1;
    for (double& w : full.at("output.weight").values<double>()) w = (sign = -sign) * 1e6;
    t.engine().load_original_state_dict(full);
    CHECK_THROWS_WITH_AS((void)t.step({{x, y}}, adam, 1.0),
                         doctest::Contains("nan, expected finite values, first in the gradient of 'scale.factor': "),
                         kfsdp::non_finite_loss);
    const kfsdp::state_dict after = t.engine().original_state_dict();
    CHECK(after.at("scale.factor").values<double>()[0] == 0.0);  // not stepped
  }
}

TEST_CASE("the MLP's gradients, the user's layer's included, match central differences") {
  kfsdp::comm::self one;
  const auto data = samples();
  for (bool checkpointing : {false, true}) {
    kfsdp::trainer<surrogate, double> t(
        surrogate{}, one,
        {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer},
        {.checkpointing = checkpointing});
    t.initialize(3);
    auto [x, y] = data.rows<double>(0, 16);
    kfsdp::testing::check_gradients(t, decltype(t)::batch{x, y});
  }
}

TEST_CASE("default initialisation is nn.Linear's: U(±1/sqrt(in)) for weights and biases; the user's factor is one") {
  kfsdp::comm::self one;
  kfsdp::trainer<surrogate, double> t(surrogate{}, one);
  t.initialize(11);
  for (const kfsdp::tensor& p : t.engine().original_state_dict()) {
    CAPTURE(p.name);
    const auto v = p.values<double>();
    const double bound = p.name.starts_with("input") ? 1 / std::sqrt(6.0) : p.name == "scale.factor" ? 1.0 : 1 / std::sqrt(double(width));
    if (p.name == "scale.factor") {
      CHECK(v[0] == 1.0);
      continue;
    }
    double largest = 0;
    for (double e : v) largest = std::max(largest, std::abs(e));
    CHECK(largest <= bound);
    CHECK(largest > 0.5 * bound);
  }
}

TEST_CASE("the README's hand-written layer passes the public gradient checker") {
  const kfsdp::gradient_check_report report = kfsdp::check_gradients(scale<"scale">{}, {.in_features = 64});
  INFO(report.worst, ": analytic ", report.analytic, ", numeric ", report.numeric);
  CHECK(report.checked == 6 * 64 + 1);
  CHECK(report.max_relative_error < 1e-8);
}
