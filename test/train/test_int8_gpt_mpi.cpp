// The example GPT trained with its parameters all-gathered in int8 (param_dtype = int8), and with its
// gradients reduced in int8 (reduce_dtype = int8, an all-to-all of quantized chunks): over 200 steps
// its loss stays within 2 % of the f32 run's after step 20 (issue 33's bound), on the same batches.
// Run with 1, 2 and 3 ranks.
// The bound is per step, on two trajectories that drift apart: at a learning rate of 3e-3 (weight
// decay 0.1), at the edge of this small batch's stability, single steps differ by up to 2.8 % while
// 10-step means stay within 0.5 %.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/trainer.hpp>

using namespace kfsdp;

namespace {
// Small enough for CI: about 0.1 M parameters.
const gpt_config config{.layers = 2, .dim = 64, .heads = 4, .seq = 32};
constexpr std::size_t global_batch = 12;  // divides over 1, 2 and 3 ranks
constexpr std::size_t steps = 200, settled = 20;

std::vector<double> losses(comm::mpi& world, wire_precision param_dtype, wire_precision reduce_dtype) {
  const auto data = io::text_windows::from_file(std::filesystem::path(KFSDP_SOURCE_ROOT) / "data" / "kjv-genesis-exodus.txt",
                                                config.seq);
  trainer<gpt_descriptor, float> trainer(make_gpt(config), world,
                                         {.sharding_strategy = sharding_strategy::zero3,
                                          .bucketing_strategy = bucketing::block,
                                          .param_dtype = param_dtype,
                                          .reduce_dtype = reduce_dtype});
  trainer.initialize(1234, gpt2_init(config.layers));
  auto& engine = trainer.engine();
  // train_gpt's defaults (--lr 0.002 --weight-decay 0.01 --clip 1.0).
  optim::adamw<float> adam(engine.plan().shard_numel, {.lr = 2e-3f, .weight_decay = 0.01f});
  std::vector<double> out;
  for (std::size_t s = 0; s < steps; ++s) {
    std::vector<int> tokens, targets;
    data.rank_slice(data.micro_batch(io::window_sampling::random, 7, s, global_batch),
                    std::size_t(engine.rank()), std::size_t(engine.world_size()), tokens, targets);
    out.push_back(trainer.step({{device_ids(tokens), device_ids(targets)}}, adam, 1.0).loss);
  }
  return out;
}
// The f32 run, once for both test cases.
const std::vector<double>& f32_losses(comm::mpi& world) {
  static const std::vector<double> f32 = losses(world, wire_precision::scalar, wire_precision::scalar);
  return f32;
}

// The worst relative gap to f32 after the settling steps, and its step.
std::pair<double, std::size_t> worst_gap(const std::vector<double>& f32, const std::vector<double>& other) {
  double worst = 0;
  std::size_t worst_step = 0;
  for (std::size_t s = settled; s < steps; ++s) {
    const double gap = std::abs(other[s] - f32[s]) / f32[s];
    if (gap > worst) worst = gap, worst_step = s;
  }
  return {worst, worst_step};
}

// The run with these wire precisions learns as f32's does: within 2 % of its loss after the settling steps.
void check_within_2_percent(comm::mpi& world, wire_precision param_dtype, wire_precision reduce_dtype, const std::string& what) {
  const std::vector<double>& f32 = f32_losses(world);
  const std::vector<double> int8 = losses(world, param_dtype, reduce_dtype);
  REQUIRE(f32.size() == steps);
  REQUIRE(int8.size() == steps);
  CHECK(f32.back() < 0.8 * f32.front());  // it learns: the comparison is not between two flat lines
  const auto [worst, worst_step] = worst_gap(f32, int8);
  MESSAGE(what, " vs f32 at ", world.size(), " ranks: loss ", f32.front(), " -> ", f32.back(), " (f32), ", int8.back(),
          " (int8); worst gap after step ", settled, ": ", 100 * worst, " % at step ", worst_step);
  CHECK(worst <= 0.02);
}

}  // namespace

TEST_CASE("int8 all-gather: the GPT's loss within 2 % of f32's after step 20, over 200 steps") {
  comm::mpi world;
  check_within_2_percent(world, wire_precision::int8, wire_precision::scalar, "int8");
}

TEST_CASE("int8 gradient reduction: the GPT's loss within 2 % of f32's after step 20, over 200 steps") {
  comm::mpi world;
  check_within_2_percent(world, wire_precision::scalar, wire_precision::int8, "int8 reduction");
}
