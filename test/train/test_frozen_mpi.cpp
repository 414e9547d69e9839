// Frozen parameter groups (optim::param_group::frozen, fsdp_engine::set_frozen) on a 3-layer MLP
// whose middle layer is frozen: it is unchanged after 10 steps, AdamW allocates no moments for it,
// its reduce-scatter bytes are gone from every step, the other parameters' gradients are bit for
// bit those of an unfrozen run (the frozen layer still passes gradients to the layer below), the
// gradient norm leaves it out, and the optimizer's state round-trips through a checkpoint.
// Run with 1, 2 and 3 ranks (3 pads every layer).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/trainer.hpp>

#include "../support/host_values.hpp"

namespace {

using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 4, 8>, kfsdp::gelu<>, kfsdp::linear<"fc2", 8, 8>, kfsdp::gelu<>,
                              kfsdp::linear<"out", 8, 1>, kfsdp::mse<>>;
using trainer_type = kfsdp::trainer<mlp, double>;
const kfsdp::fsdp_options zero3_layer{.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                      .bucketing_strategy = kfsdp::bucketing::layer};
const kfsdp::optim::adamw_options adam_options{.lr = 1e-2, .weight_decay = 0.1};
const std::vector<kfsdp::optim::param_group> frozen_fc2{{.name_contains = "fc2.", .frozen = true}};

std::vector<double> values(std::size_t count, unsigned seed) {
  std::vector<double> v(count);
  unsigned state = seed * 2654435761u + 12345u;
  for (double& x : v) {
    state = state * 1664525u + 1013904223u;
    x = double(state >> 8) / double(1u << 23) - 1.0;
  }
  return v;
}

const kfsdp::io::array_dataset& data() {
  static const kfsdp::io::array_dataset d(values(4 * 64, 1), 4, values(64, 2), 1);
  return d;
}

trainer_type::batch batch_of(kfsdp::comm::mpi& world, std::size_t step) {
  auto [x, y] = data().rank_slice<double>(data().micro_batch(/*seed=*/0, step, /*batch=*/12),
                                         std::size_t(world.rank()), std::size_t(world.size()));
  return {x, y};
}

using kfsdp::test::host_values;

std::vector<double> chunk(trainer_type& t, const kfsdp::sharded_storage<double>& storage, const char* name) {
  return host_values(storage.chunk(t.engine().param_index(name)));
}

const char* const all_params[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "out.weight", "out.bias"};

bool frozen_name(std::string_view name) { return name.starts_with("fc2."); }

}  // namespace

TEST_CASE("a frozen group is unchanged after 10 steps, holds no optimizer state and reduce-scatters nothing") {
  kfsdp::comm::mpi world;
  trainer_type frozen(mlp{}, world, zero3_layer), plain(mlp{}, world, zero3_layer);
  frozen.initialize(7);
  plain.initialize(7);
  kfsdp::optim::adamw<double> frozen_adam(frozen, adam_options, frozen_fc2);
  kfsdp::optim::adamw<double> plain_adam(plain, adam_options);

  auto& engine = frozen.engine();
  CHECK(engine.is_frozen(engine.param_index("fc2.weight")));
  CHECK(engine.is_frozen(engine.param_index("fc2.bias")));
  CHECK_FALSE(engine.is_frozen(engine.param_index("fc1.weight")));
  // No moments for fc2's chunks: the state is the shard less them.
  std::size_t fc2_chunks = 0, fc2_padded = 0;
  for (const char* name : {"fc2.weight", "fc2.bias"}) {
    fc2_chunks += engine.mapping().chunk(engine.param_index(name)).count;
    fc2_padded += engine.mapping().padded(engine.param_index(name)).count;
  }
  CHECK(plain_adam.state_size() == plain.engine().plan().shard_numel);
  CHECK(frozen_adam.state_size() == engine.plan().shard_numel - fc2_chunks);
  CHECK(frozen_adam.exp_avg().extent(0) == frozen_adam.state_size());
  CHECK(frozen_adam.exp_avg_sq().extent(0) == frozen_adam.state_size());

  const auto fc2_before = chunk(frozen, engine.shards(), "fc2.weight");
  const auto fc2_bias_before = chunk(frozen, engine.shards(), "fc2.bias");
  const auto fc1_before = chunk(frozen, engine.shards(), "fc1.weight");
  for (std::size_t step = 0; step < 10; ++step) {
    const std::size_t frozen_start = engine.bytes_communicated(), plain_start = plain.engine().bytes_communicated();
    frozen.step({batch_of(world, step)}, frozen_adam, /*max_norm=*/1.0);
    plain.step({batch_of(world, step)}, plain_adam, /*max_norm=*/1.0);
    const std::size_t frozen_bytes = engine.bytes_communicated() - frozen_start;
    const std::size_t plain_bytes = plain.engine().bytes_communicated() - plain_start;
    CAPTURE(step);
    // fc2 is its own bucket (layer bucketing): its reduce-scatter, and only that, is gone.
    CHECK(plain_bytes - frozen_bytes == fc2_padded * sizeof(double));
    if (step == 0 && world.rank() == 0)
      MESSAGE("bytes communicated per step: ", plain_bytes, " unfrozen, ", frozen_bytes, " with fc2 frozen (",
              world.size(), " ranks)");
  }
  CHECK(chunk(frozen, engine.shards(), "fc2.weight") == fc2_before);
  CHECK(chunk(frozen, engine.shards(), "fc2.bias") == fc2_bias_before);
  CHECK(chunk(frozen, engine.shards(), "fc1.weight") != fc1_before);  // the others train
  // No gradient either: the frozen gradient shards stay zero.
  for (double g : chunk(frozen, engine.grads(), "fc2.weight")) CHECK(g == 0.0);
}

TEST_CASE("the other parameters' gradients are bit for bit an unfrozen run's; the norm leaves the frozen out") {
  kfsdp::comm::mpi world;
  trainer_type frozen(mlp{}, world, zero3_layer), plain(mlp{}, world, zero3_layer);
  frozen.initialize(11);
  plain.initialize(11);
  kfsdp::optim::adamw<double> frozen_adam(frozen, adam_options, frozen_fc2);
  kfsdp::optim::adamw<double> plain_adam(plain, adam_options);
  // Same weights: one step each from the same start, no clipping.
  const auto frozen_result = frozen.step({batch_of(world, 0)}, frozen_adam);
  const auto plain_result = plain.step({batch_of(world, 0)}, plain_adam);
  CHECK(frozen_result.loss == plain_result.loss);
  double unfrozen_squares = 0;
  for (const char* name : all_params) {
    CAPTURE(name);
    const auto g = chunk(frozen, frozen.engine().grads(), name);
    const auto reference = chunk(plain, plain.engine().grads(), name);
    if (frozen_name(name)) {
      for (double x : g) CHECK(x == 0.0);
      CHECK(reference != g);  // an unfrozen run does have a gradient there
    } else {
      CHECK(g == reference);  // fc1's gradient passed through the frozen fc2
      for (double x : reference) unfrozen_squares += x * x;
    }
  }
  kfsdp::comm::all_reduce_sum(world, std::span<double>(&unfrozen_squares, 1));
  CHECK(frozen_result.grad_norm == doctest::Approx(std::sqrt(unfrozen_squares)).epsilon(1e-12));
  CHECK(frozen_result.grad_norm < plain_result.grad_norm);
}

TEST_CASE("a frozen optimizer's state round-trips through a checkpoint, with no tensor for the frozen group") {
  kfsdp::comm::mpi world;
  const std::string path = "test_train_frozen_mpi_np" + std::to_string(world.size()) + ".safetensors";
  std::vector<double> exp_avg, exp_avg_sq, weights;
  {
    trainer_type t(mlp{}, world, zero3_layer);
    t.initialize(3);
    kfsdp::optim::adamw<double> adam(t, adam_options, frozen_fc2);
    for (std::size_t step = 0; step < 3; ++step) t.step({batch_of(world, step)}, adam, 1.0);
    kfsdp::io::checkpoint_state<double> state;
    adam.add_state(state);
    kfsdp::io::save_checkpoint(path, t.engine(), state);
    exp_avg = host_values(adam.exp_avg());
    exp_avg_sq = host_values(adam.exp_avg_sq());
    weights = host_values(t.engine().shards().flat());
  }
  trainer_type resumed(mlp{}, world, zero3_layer);
  kfsdp::optim::adamw<double> adam(resumed, adam_options, frozen_fc2);
  kfsdp::io::checkpoint_state<double> state;
  adam.add_state(state);
  kfsdp::io::load_checkpoint(path, resumed.engine(), state);
  adam.restore_state(state.metadata);
  CHECK(adam.step_count() == 3);
  CHECK(host_values(adam.exp_avg()) == exp_avg);
  CHECK(host_values(adam.exp_avg_sq()) == exp_avg_sq);
  CHECK(host_values(resumed.engine().shards().flat()) == weights);

  // An unfrozen optimizer needs fc2's moments, which the file does not hold: refused, naming the tensor.
  trainer_type other(mlp{}, world, zero3_layer);
  kfsdp::optim::adamw<double> unfrozen(other, adam_options);
  kfsdp::io::checkpoint_state<double> wanted;
  unfrozen.add_state(wanted);
  std::string message;
  try {
    kfsdp::io::load_checkpoint(path, other.engine(), wanted);
  } catch (const std::exception& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("optimizer.exp_avg.fc2.weight") != std::string::npos);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove(path);
}

TEST_CASE("set_frozen names the parameter; make_param_groups checks the frozen mask's length") {
  kfsdp::comm::mpi world;
  trainer_type t(mlp{}, world, zero3_layer);
  std::string message;
  try {
    t.engine().set_frozen(99);
  } catch (const std::out_of_range& e) {
    message = e.what();
  }
  CHECK(message == "kfsdp::fsdp::set_frozen: param is 99, expected less than 6");
  const std::vector<std::uint8_t> short_mask(2, 0);
  CHECK_THROWS_WITH_AS((void)kfsdp::optim::make_param_groups(t.engine().params(), t.engine().plan(), 0.1, {}, short_mask),
                       "make_param_groups: frozen has 2 entries, expected one per parameter (6)", std::invalid_argument);
  // Frozen in the engine first, then an optimizer built from it: no state there either.
  t.engine().set_frozen(t.engine().param_index("out.weight"));
  kfsdp::optim::adamw<double> adam(t, adam_options);
  CHECK(adam.state_size() ==
        t.engine().plan().shard_numel - t.engine().mapping().chunk(t.engine().param_index("out.weight")).count);
}

TEST_CASE("a bucket with some parameters frozen reduce-scatters only the others (sharded accumulation, bf16 too)") {
  kfsdp::comm::mpi world;
  for (const kfsdp::wire_precision reduce_dtype : {kfsdp::wire_precision::scalar, kfsdp::wire_precision::bf16}) {
    CAPTURE(int(reduce_dtype));
    const kfsdp::fsdp_options options{.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                      .bucketing_strategy = kfsdp::bucketing::layer,
                                      .reduce_dtype = reduce_dtype};
    trainer_type frozen(mlp{}, world, options), plain(mlp{}, world, options);
    frozen.initialize(5);
    plain.initialize(5);
    // fc2.weight frozen, fc2.bias in the same bucket (layer bucketing) not.
    kfsdp::optim::adamw<double> frozen_adam(frozen, adam_options, {{.name_contains = "fc2.weight", .frozen = true}});
    kfsdp::optim::adamw<double> plain_adam(plain, adam_options);
    auto& engine = frozen.engine();
    const std::size_t weight = engine.param_index("fc2.weight");
    CHECK(engine.plan().params[weight].bucket == engine.plan().params[engine.param_index("fc2.bias")].bucket);
    const auto before = chunk(frozen, engine.shards(), "fc2.weight");
    // Two micro-batches reduced one by one: the second adds into the gradient shards.
    const std::vector<trainer_type::batch> batches{batch_of(world, 0), batch_of(world, 1)};
    const std::size_t frozen_start = engine.bytes_communicated(), plain_start = plain.engine().bytes_communicated();
    const auto frozen_result = frozen.step(batches, frozen_adam, 0, kfsdp::grad_accumulation::sharded);
    const auto plain_result = plain.step(batches, plain_adam, 0, kfsdp::grad_accumulation::sharded);
    const std::size_t wire = reduce_dtype == kfsdp::wire_precision::scalar ? sizeof(double) : 2;
    CHECK((plain.engine().bytes_communicated() - plain_start) - (engine.bytes_communicated() - frozen_start) ==
          2 * engine.mapping().padded(weight).count * wire);  // fc2.weight's reduce-scatter, twice
    CHECK(frozen_result.loss == plain_result.loss);
    CHECK(chunk(frozen, engine.shards(), "fc2.weight") == before);
    for (const char* name : all_params) {
      CAPTURE(name);
      const auto g = chunk(frozen, engine.grads(), name);
      if (std::string_view(name) == "fc2.weight")
        for (double x : g) CHECK(x == 0.0);
      else
        CHECK(g == chunk(plain, plain.engine().grads(), name));
    }
  }
}

TEST_CASE("sgd with momentum and weight decay: the frozen group is unchanged, the momentum round-trips") {
  kfsdp::comm::mpi world;
  const std::string path = "test_train_frozen_sgd_mpi_np" + std::to_string(world.size()) + ".safetensors";
  const kfsdp::optim::sgd_options options{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1};
  std::vector<double> momentum;
  {
    trainer_type t(mlp{}, world, zero3_layer);
    t.initialize(9);
    kfsdp::optim::sgd<double> sgd(t, options, frozen_fc2);
    const auto before = chunk(t, t.engine().shards(), "fc2.weight");
    for (std::size_t step = 0; step < 10; ++step) t.step({batch_of(world, step)}, sgd, 1.0);
    CHECK(chunk(t, t.engine().shards(), "fc2.weight") == before);
    kfsdp::io::checkpoint_state<double> state;
    sgd.add_state(state);
    kfsdp::io::save_checkpoint(path, t.engine(), state);
    momentum = host_values(sgd.momentum_buffer());
  }
  trainer_type resumed(mlp{}, world, zero3_layer);
  kfsdp::optim::sgd<double> sgd(resumed, options, frozen_fc2);
  kfsdp::io::checkpoint_state<double> state;
  sgd.add_state(state);
  kfsdp::io::load_checkpoint(path, resumed.engine(), state);
  sgd.restore_state(state.metadata);
  CHECK(host_values(sgd.momentum_buffer()) == momentum);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove(path);
}
