// Tests for include/kfsdp/optim/param_groups.hpp and adamw's groups: the layout over a 3-rank plan
// (padding in its parameter's group), the default rule under zero gradients (2-D decays, 1-D not),
// a group by name with lr scale 0 frozen, one all-decaying group equal to the ungrouped optimizer bit
// for bit, padding kept zero, bad groups; and the snippet of docs/training.md on a trainer.
#include <doctest/doctest.h>

#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/any_optimizer.hpp>
#include <kfsdp/optim/param_groups.hpp>
#include <kfsdp/optim/schedule.hpp>
#include <kfsdp/train/trainer.hpp>

#include "optim_test_support.hpp"

#include <string>
#include <vector>

using namespace kfsdp::optim;
using namespace kfsdp::optim::test;

namespace {

using model = kfsdp::sequential<"", kfsdp::linear<"fc", 4, 5>, kfsdp::layer_norm<"ln", 5>,
                                kfsdp::linear<"out", 5, 1>, kfsdp::mse<>>;

// The elements of parameter `name` in the engine's flat shard.
template <class Engine>
std::vector<double> param_values(Engine& engine, const std::vector<double>& shard, std::string_view name) {
  const auto range = engine.mapping().chunk(engine.param_index(name));
  return {shard.begin() + std::ptrdiff_t(range.first), shard.begin() + std::ptrdiff_t(range.last())};
}

std::vector<double> scaled(std::vector<double> values, double factor) {
  for (double& v : values) v = v * factor;
  return values;
}

}  // namespace

TEST_CASE("the layout puts each parameter's local chunk, padding included, in its group (3 ranks)") {
  const auto table = kfsdp::make_param_table(model{});
  const auto plan = kfsdp::make_shard_plan(table, 3, kfsdp::bucketing::layer);
  const std::vector<param_group> groups{{.name_contains = "out.", .lr_scale = 0.5}};
  const auto layout = make_param_groups(table, plan, 0.1, groups);
  // fc.weight, out.weight decay; fc.bias, ln.* do not; out.* share the lr scale 0.5 and keep the rule.
  REQUIRE(layout.group_of_param.size() == 6);
  const auto& id = layout.group_of_param;
  CHECK(layout.weight_decay[id[0]] == 0.1);  // fc.weight
  CHECK(layout.lr_scale[id[0]] == 1.0);
  CHECK(layout.weight_decay[id[1]] == 0.0);  // fc.bias
  CHECK(id[2] == id[1]);                     // ln.weight
  CHECK(id[3] == id[1]);                     // ln.bias
  CHECK(layout.lr_scale[id[4]] == 0.5);      // out.weight
  CHECK(layout.weight_decay[id[4]] == 0.1);
  CHECK(layout.lr_scale[id[5]] == 0.5);      // out.bias
  CHECK(layout.weight_decay[id[5]] == 0.0);
  CHECK(layout.lr_scale.size() == 4);
  const auto group_of = to_vector(layout.group_of);
  REQUIRE(group_of.size() == plan.shard_numel);
  for (std::size_t p = 0; p < table.size(); ++p) {
    CAPTURE(table[p].name.view());
    for (std::size_t i = 0; i < plan.params[p].chunk_numel(); ++i)
      CHECK(group_of[plan.params[p].storage_offset + i] == id[p]);
  }
}

TEST_CASE("zero gradients: 2-D weights decay by default, biases and norm gains do not; lr scale 0 freezes") {
  kfsdp::comm::self one;
  kfsdp::fsdp_engine<double> engine(kfsdp::make_param_table(model{}), one, {});
  engine.initialize(/*seed=*/3);
  engine.initialize(3, [](const kfsdp::param_info& p) {  // nonzero everywhere, biases and gains too
    return kfsdp::param_init{kfsdp::param_init::normal, p.rank >= 2 ? 0.5 : 1.0};
  });
  const auto before = to_vector(engine.shards().flat());
  const adamw_options options{.lr = 0.1, .weight_decay = 0.5};
  kfsdp::optim::adamw<double> optimizer(engine, options, {{.name_contains = "out.weight", .lr_scale = 0.0}});
  const Kokkos::View<double*> zero("zero grads", engine.plan().shard_numel);
  for (int step = 0; step < 3; ++step) optimizer.step(engine.shards().flat(), zero);
  const auto after = to_vector(engine.shards().flat());
  // Zero gradients leave the moments at 0 and the update at 0/eps = 0: only the decay moves a weight.
  const double factor = 1.0 - options.lr * options.weight_decay;
  CHECK(param_values(engine, after, "fc.weight") == scaled(scaled(scaled(param_values(engine, before, "fc.weight"), factor), factor), factor));
  CHECK(param_values(engine, after, "fc.weight") != param_values(engine, before, "fc.weight"));
  for (const char* name : {"fc.bias", "ln.weight", "ln.bias", "out.bias", "out.weight"}) {
    CAPTURE(name);
    CHECK(param_values(engine, after, name) == param_values(engine, before, name));
  }
}

TEST_CASE_TEMPLATE("a group over every parameter at the options' weight decay is the ungrouped adamw, bit for bit",
                   Scalar, double, float) {
  kfsdp::comm::self one;
  kfsdp::fsdp_engine<Scalar> engine(kfsdp::make_param_table(model{}), one, {});
  const std::size_t n = engine.plan().shard_numel;
  const adamw_options options{.lr = 3e-3, .beta2 = 0.95, .weight_decay = 0.1};
  const auto everything = [](const kfsdp::param_info&) { return true; };
  kfsdp::optim::adamw<Scalar> grouped(engine, options, {{.select = everything, .weight_decay = options.weight_decay}});
  kfsdp::optim::adamw<Scalar> plain(n, options);
  auto grouped_params = to_view(test_values<Scalar>(n, 5), "grouped");
  auto plain_params = to_view(test_values<Scalar>(n, 5), "plain");
  for (unsigned step = 1; step <= 5; ++step) {
    const auto grads = to_view(test_values<Scalar>(n, 100 + step), "grads");
    grouped.step(grouped_params, grads);
    plain.step(plain_params, grads);
  }
  CHECK(to_vector(grouped_params) == to_vector(plain_params));
  CHECK(to_vector(grouped.exp_avg()) == to_vector(plain.exp_avg()));
  CHECK(to_vector(grouped.exp_avg_sq()) == to_vector(plain.exp_avg_sq()));
}

TEST_CASE("padding rows stay zero under groups (rank 2 of 3)") {
  const auto table = kfsdp::make_param_table(model{});
  const auto plan = kfsdp::make_shard_plan(table, 3, kfsdp::bucketing::none);
  const kfsdp::shard_mapping map(plan);
  std::vector<bool> padding(plan.shard_numel, false);
  for (std::size_t p = 0; p < table.size(); ++p)
    for (std::size_t i = map.elements(p, 2).count; i < plan.params[p].chunk_numel(); ++i)
      padding[plan.params[p].storage_offset + i] = true;
  auto values = test_values<double>(plan.shard_numel, 9);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (padding[i]) values[i] = 0;
  auto params = to_view(values, "params");
  kfsdp::optim::adamw<double> optimizer(make_param_groups(table, plan, 0.5), {.lr = 0.1, .weight_decay = 0.5});
  for (unsigned step = 1; step <= 3; ++step) {
    auto grads = test_values<double>(plan.shard_numel, 50 + step);
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (padding[i]) grads[i] = 0;
    optimizer.step(params, to_view(grads, "grads"));
  }
  const auto result = to_vector(params);
  std::size_t nonzero_padding = 0, padding_count = 0;
  for (std::size_t i = 0; i < result.size(); ++i) {
    padding_count += padding[i];
    nonzero_padding += padding[i] && result[i] != 0.0;
  }
  CHECK(padding_count > 0);  // the layout does pad at 3 ranks
  CHECK(nonzero_padding == 0);
}

TEST_CASE("bad groups name the group, the value seen and the expectation") {
  const auto table = kfsdp::make_param_table(model{});
  const auto plan = kfsdp::make_shard_plan(table, 1, kfsdp::bucketing::none);
  auto message = [&](std::vector<param_group> groups) {
    return invalid_argument_message([&] { (void)make_param_groups(table, plan, 0.1, groups); });
  };
  CHECK(message({{.name_contains = "attn"}}) ==
        "make_param_groups: group 0 (name_contains = 'attn') selects no parameter, expected at least one");
  CHECK(message({{.name_contains = "fc"}, {.lr_scale = 2}}) ==
        "make_param_groups: group 1: name_contains is empty and select is unset, expected one of them");
  CHECK(message({{.name_contains = "fc", .lr_scale = -1}}) ==
        "make_param_groups: group 0: lr_scale = -1, expected a finite lr_scale >= 0");
  CHECK(message({{.name_contains = "fc", .weight_decay = -0.5}}) ==
        "make_param_groups: group 0: weight_decay = -0.5, expected a finite weight_decay >= 0");
}

TEST_CASE("docs/training.md: a schedule and parameter groups on a trainer") {
  kfsdp::comm::self world;
  kfsdp::trainer<model, double> trainer(
      model{}, world,
      {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer});
  trainer.initialize(/*seed=*/0);
  const std::size_t steps = 20, rank = 0, world_size = 1;
  kfsdp::io::array_dataset data(test_values<double>(4 * 32, 1), 4, test_values<double>(32, 2), 1);
  const auto before = to_vector(trainer.engine().shards().flat());
  // --- docs/training.md snippet
  kfsdp::optim::adamw<double> adam(trainer, {.lr = 1e-3, .weight_decay = 0.1},  // 1-D parameters: no decay
                                   {{.name_contains = "out.", .frozen = true}});    // the output layer frozen
  auto lr = kfsdp::optim::warmup_cosine(1e-3, /*warmup_steps=*/5, /*total_steps=*/steps, /*min_lr=*/1e-4);
  for (std::size_t step = 0; step < steps; ++step) {
    adam.set_lr(lr(step));
    auto [x, y] = data.rank_slice<double>(data.micro_batch(/*seed=*/0, step, /*batch=*/8), rank, world_size);
    trainer.step({{x, y}}, adam, /*max_norm=*/1.0);
  }
  // --- end of snippet
  const auto after = to_vector(trainer.engine().shards().flat());
  auto& engine = trainer.engine();
  CHECK(param_values(engine, after, "out.weight") == param_values(engine, before, "out.weight"));
  CHECK(param_values(engine, after, "out.bias") == param_values(engine, before, "out.bias"));
  CHECK(param_values(engine, after, "fc.weight") != param_values(engine, before, "fc.weight"));
  CHECK(adam.options().lr == lr(steps - 1));
}

TEST_CASE_TEMPLATE("a frozen group: no moments, its elements untouched, the others bit for bit an unfrozen adamw's",
                   Scalar, double, float) {
  kfsdp::comm::self one;
  kfsdp::fsdp_engine<Scalar> engine(kfsdp::make_param_table(model{}), one, {});
  kfsdp::fsdp_engine<Scalar> reference_engine(kfsdp::make_param_table(model{}), one, {});
  const std::size_t n = engine.plan().shard_numel;
  const adamw_options options{.lr = 3e-3, .weight_decay = 0.1};
  kfsdp::optim::adamw<Scalar> frozen(engine, options, {{.name_contains = "ln.", .frozen = true}});
  kfsdp::optim::adamw<Scalar> plain(reference_engine, options);
  // The optimizer froze them in the engine too: their gradients will not be reduced.
  CHECK(engine.is_frozen(engine.param_index("ln.weight")));
  CHECK(engine.is_frozen(engine.param_index("ln.bias")));
  CHECK_FALSE(engine.is_frozen(engine.param_index("fc.weight")));
  const auto ln_weight = engine.mapping().chunk(engine.param_index("ln.weight"));
  const auto ln_bias = engine.mapping().chunk(engine.param_index("ln.bias"));
  CHECK(frozen.state_size() == n - ln_weight.count - ln_bias.count);
  CHECK(frozen.exp_avg().extent(0) == frozen.state_size());
  CHECK(plain.state_size() == n);

  auto frozen_params = to_view(test_values<Scalar>(n, 5), "frozen");
  auto plain_params = to_view(test_values<Scalar>(n, 5), "plain");
  for (unsigned step = 1; step <= 10; ++step) {
    const auto grads = to_view(test_values<Scalar>(n, 100 + step), "grads");  // nonzero on the frozen too
    frozen.step(frozen_params, grads);
    plain.step(plain_params, grads);
  }
  const auto start = test_values<Scalar>(n, 5), after = to_vector(frozen_params), reference = to_vector(plain_params);
  for (std::size_t i = 0; i < n; ++i) {
    const bool is_frozen = (i >= ln_weight.first && i < ln_weight.last()) || (i >= ln_bias.first && i < ln_bias.last());
    CAPTURE(i);
    CHECK(after[i] == (is_frozen ? start[i] : reference[i]));
  }
}

TEST_CASE("sgd from an engine: a frozen group holds no momentum and is untouched, the others are plain sgd's") {
  kfsdp::comm::self one;
  kfsdp::fsdp_engine<double> engine(kfsdp::make_param_table(model{}), one, {});
  const std::size_t n = engine.plan().shard_numel;
  const sgd_options options{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true};
  kfsdp::optim::sgd<double> frozen(engine, options, {{.name_contains = "fc.", .frozen = true}});
  kfsdp::optim::sgd<double> plain(n, options);
  CHECK(engine.is_frozen(engine.param_index("fc.weight")));
  const auto fc_weight = engine.mapping().chunk(engine.param_index("fc.weight"));
  const auto fc_bias = engine.mapping().chunk(engine.param_index("fc.bias"));
  CHECK(frozen.momentum_buffer().extent(0) == n - fc_weight.count - fc_bias.count);
  auto frozen_params = to_view(test_values<double>(n, 7), "frozen");
  auto plain_params = to_view(test_values<double>(n, 7), "plain");
  for (unsigned step = 1; step <= 10; ++step) {
    const auto grads = to_view(test_values<double>(n, 200 + step), "grads");
    frozen.step(frozen_params, grads);
    plain.step(plain_params, grads);
  }
  const auto start = test_values<double>(n, 7), after = to_vector(frozen_params), reference = to_vector(plain_params);
  for (std::size_t i = 0; i < n; ++i) {
    const bool is_frozen = (i >= fc_weight.first && i < fc_weight.last()) || (i >= fc_bias.first && i < fc_bias.last());
    CAPTURE(i);
    CHECK(after[i] == (is_frozen ? start[i] : reference[i]));
  }
  // SGD has one lr and weight decay: a group may only freeze.
  CHECK(invalid_argument_message([&] { kfsdp::optim::sgd<double> bad(engine, options, {{.name_contains = "ln.", .lr_scale = 0.5}}); }) ==
        "sgd: group 0 sets lr_scale = 0.5, expected 1 (SGD's groups may only freeze)");
}

TEST_CASE("any_optimizer: the chosen kind steps bit for bit as itself, holds its state and checkpoints as it") {
  kfsdp::comm::self one;
  kfsdp::fsdp_engine<double> engine(kfsdp::make_param_table(model{}), one, {});
  const std::size_t n = engine.plan().shard_numel;
  kfsdp::optim::any_optimizer<double> chosen_adam(engine, {.kind = "adamw", .lr = 3e-3, .weight_decay = 0.1});
  kfsdp::optim::adamw<double> adam(engine, {.lr = 3e-3, .weight_decay = 0.1});
  kfsdp::optim::any_optimizer<double> chosen_sgd(engine, {.kind = "sgd", .lr = 0.05, .momentum = 0.9});
  kfsdp::optim::sgd<double> plain_sgd(engine, {.lr = 0.05, .momentum = 0.9});
  CHECK(chosen_adam.kind() == "adamw");
  CHECK(chosen_sgd.kind() == "sgd");
  CHECK(chosen_adam.state_bytes() == 2 * n * sizeof(double));
  CHECK(chosen_sgd.state_bytes() == n * sizeof(double));
  CHECK(kfsdp::optim::any_optimizer<double>(engine, {.kind = "sgd"}).state_bytes() == 0);  // no momentum
  auto params = to_view(test_values<double>(n, 5), "p"), reference = to_view(test_values<double>(n, 5), "r");
  auto sgd_params = to_view(test_values<double>(n, 5), "s"), sgd_reference = to_view(test_values<double>(n, 5), "t");
  for (unsigned step = 1; step <= 3; ++step) {
    const auto grads = to_view(test_values<double>(n, 100 + step), "grads");
    chosen_adam.set_lr(1e-3 * step);
    adam.set_lr(1e-3 * step);
    chosen_adam.step(params, grads);
    adam.step(reference, grads);
    chosen_sgd.step(sgd_params, grads);
    plain_sgd.step(sgd_reference, grads);
  }
  CHECK(to_vector(params) == to_vector(reference));
  CHECK(to_vector(sgd_params) == to_vector(sgd_reference));
  kfsdp::io::checkpoint_state<double> state;
  chosen_adam.add_state(state);
  CHECK(state.metadata.at("optimizer") == "adamw");
  CHECK(state.metadata.at("optimizer.step_count") == "3");
  REQUIRE(state.shards.size() == 2);
  CHECK(state.shards[0].name == "optimizer.exp_avg");
  CHECK_THROWS_WITH_AS(chosen_sgd.restore_state(state.metadata),
                       "checkpoint metadata: 'optimizer' is 'adamw', expected 'sgd' (this run's)", std::invalid_argument);
  CHECK(invalid_argument_message([&] { kfsdp::optim::any_optimizer<double> bad(engine, {.kind = "adam"}); }) ==
        "any_optimizer: kind is 'adam', expected adamw or sgd");
}
