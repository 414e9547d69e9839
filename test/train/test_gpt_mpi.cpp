// The example GPT, one descriptor trained by kfsdp::trainer: sharded training is the same
// training — losses at world size N equal those of one process. Run with 1, 2, 3 and 4 ranks; the
// one-process reference runs in the same program (self backend).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/comm/threaded/threaded.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/sgd.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/trainer.hpp>

#include "gradient_check.hpp"

using namespace kfsdp;

namespace {
const gpt_config config{.layers = 2, .dim = 16, .heads = 2, .seq = 8};
constexpr std::size_t global_batch = 12;  // divides over 1, 2, 3 and 4 ranks
constexpr std::size_t steps = 3;

io::text_windows sample_text() {
  const std::string line = "In the beginning God created the heaven and the earth. And the earth was without form. ";
  std::string text;
  for (int i = 0; i < 6; ++i) text += line + std::to_string(i * 7919) + "\n";
  return io::text_windows(std::vector<std::uint8_t>(text.begin(), text.end()), config.seq);
}

struct run_result {
  std::vector<double> losses;
  std::vector<double> norms;
  state_dict weights;
};

// Trains `steps` steps with `trainer`; every rank gets its slice of each batch.
template <class Scalar, class Trainer>
run_result run_steps(Trainer& trainer, std::size_t micro_batches = 1, std::size_t batch = global_batch,
                     grad_accumulation accumulation = grad_accumulation::unsharded, bool use_sgd = false,
                     double clip = 0.5) {
  const auto data = sample_text();
  auto& engine = trainer.engine();
  using batch_type = typename std::remove_reference_t<decltype(trainer)>::batch;
  const std::size_t ws = std::size_t(engine.world_size());
  trainer.initialize(1234, gpt2_init(config.layers));
  optim::adamw<Scalar> adam(engine.plan().shard_numel, {.lr = 3e-3, .weight_decay = 0.1});
  optim::sgd<Scalar> sgd(engine.plan().shard_numel, {.lr = 0.1, .momentum = 0.9});
  run_result out;
  for (std::size_t s = 0; s < steps; ++s) {
    std::vector<batch_type> batches;
    for (std::size_t k = 0; k < micro_batches; ++k) {
      std::vector<int> tokens, targets;
      data.rank_slice(data.micro_batch(io::window_sampling::sequential, 0, s * micro_batches + k, batch),
                      std::size_t(engine.rank()), ws, tokens, targets);
      batches.push_back({device_ids(tokens), device_ids(targets)});
    }
    const std::span<const batch_type> all(batches);
    const step_result r = use_sgd ? trainer.step(all, sgd, clip, accumulation) : trainer.step(all, adam, clip, accumulation);
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
  }
  out.weights = engine.original_state_dict();
  return out;
}

// Trains `steps` steps on `comm` with the given options (the run-time GPT, make_gpt's).
template <class Scalar>
run_result train(comm::any_communicator comm, fsdp_options options, std::size_t micro_batches = 1,
                 std::size_t batch = global_batch, grad_accumulation accumulation = grad_accumulation::unsharded,
                 bool use_sgd = false, double clip = 0.5, trainer_options topts = {}, bool tie = false) {
  gpt_config sizes = config;
  sizes.tie_weights = tie;
  const auto model = make_gpt(sizes);
  trainer<gpt_descriptor, Scalar> t(model, comm, options, topts);
  return run_steps<Scalar>(t, micro_batches, batch, accumulation, use_sgd, clip);
}

template <class Scalar>
void check_close(const run_result& got, const run_result& want, double tolerance) {
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= tolerance * std::abs(want.losses[s]));
    CHECK(std::abs(got.norms[s] - want.norms[s]) <= tolerance * std::abs(want.norms[s]) + 1e-300);
  }
  double worst = 0;
  for (const tensor& t : want.weights) {
    const auto a = got.weights.at(t.name).template values<Scalar>();
    const auto b = t.template values<Scalar>();
    for (std::size_t i = 0; i < b.size(); ++i)
      worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (std::abs(double(b[i])) + 1e-3));
  }
  CHECK(worst <= tolerance * 10);
}
}  // namespace

TEST_CASE("losses at world size N equal world size 1, every sharding x bucketing (double 1e-10)") {
  comm::mpi world;
  comm::self one;
  const run_result reference = train<double>(one, {});
  CHECK(reference.losses.back() < reference.losses.front());  // it learns
  for (auto s : {sharding_strategy::zero2, sharding_strategy::zero3})
    for (auto b : {bucketing::none, bucketing::layer, bucketing::block}) {
      CAPTURE(to_string(s));
      CAPTURE(to_string(b));
      check_close<double>(train<double>(world, {.sharding_strategy = s, .bucketing_strategy = b}), reference, 1e-10);
    }
}

TEST_CASE("overlap on a communication thread with a limit on all-gathers in flight: the same training") {
  comm::mpi world;
  comm::self one;
  comm::threaded overlapped(world);
  const run_result reference = train<double>(one, {});
  for (std::size_t limit : {1u, 2u}) {
    CAPTURE(limit);
    check_close<double>(train<double>(overlapped, {.sharding_strategy = sharding_strategy::zero3,
                                                   .bucketing_strategy = bucketing::layer, .limit_all_gathers = limit}),
                        reference, 1e-10);
  }
}

TEST_CASE("polls between kernels (overlap without a thread): the same training to the bit, every sharding x bucketing") {
  // The ranks poll at moments of their own (their kernels take their own time): nothing a poll
  // runs may start a collective, or the ranks would start them in different orders.
  comm::mpi world;
  const auto model = make_gpt(config);
  for (auto s : {sharding_strategy::zero2, sharding_strategy::zero3})
    for (auto b : {bucketing::none, bucketing::layer, bucketing::block}) {
      CAPTURE(to_string(s));
      CAPTURE(to_string(b));
      const fsdp_options options{.sharding_strategy = s, .bucketing_strategy = b};
      trainer<gpt_descriptor, double> polled(model, world, options);
      polled.engine().set_progress_between_kernels(true);
      const run_result got = run_steps<double>(polled);
      polled.engine().set_progress_between_kernels(false);
      CHECK(kfsdp::detail::current_kernel_boundary.target == nullptr);
      trainer<gpt_descriptor, double> plain(model, world, options);
      const run_result want = run_steps<double>(plain);
      CHECK(got.losses == want.losses);
      CHECK(got.norms == want.norms);
      check_close<double>(got, want, 0.0);
    }
}

TEST_CASE("float: the same within 1e-4; SGD with momentum too") {
  comm::mpi world;
  comm::self one;
  check_close<float>(train<float>(world, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block}),
                     train<float>(one, {}), 1e-4);
  check_close<double>(train<double>(world, {.bucketing_strategy = bucketing::layer}, 1, global_batch,
                                    grad_accumulation::unsharded, true),
                      train<double>(one, {}, 1, global_batch, grad_accumulation::unsharded, true), 1e-10);
}

TEST_CASE("gradient accumulation of K micro-batches equals one batch K times larger, both modes") {
  comm::mpi world;
  const std::size_t ws = std::size_t(world.size());
  // K = 3 micro-batches of 4·ws windows against one batch of 12·ws windows (same windows in order).
  const run_result big = train<double>(world, {.bucketing_strategy = bucketing::block}, 1, 12 * ws);
  for (auto mode : {grad_accumulation::unsharded, grad_accumulation::sharded}) {
    for (auto s : {sharding_strategy::zero2, sharding_strategy::zero3}) {
      CAPTURE(int(mode));
      check_close<double>(train<double>(world, {.sharding_strategy = s, .bucketing_strategy = bucketing::block}, 3, 4 * ws,
                                        mode),
                          big, 1e-10);
    }
  }
}

TEST_CASE("activation checkpointing per block: the same training") {
  comm::mpi world;
  comm::self one;
  const run_result reference = train<double>(one, {});
  for (auto sharding : {sharding_strategy::zero2, sharding_strategy::zero3}) {
    CAPTURE(to_string(sharding));
    check_close<double>(train<double>(world, {.sharding_strategy = sharding, .bucketing_strategy = bucketing::block}, 1,
                                      global_batch, grad_accumulation::unsharded, false, 0.5, {.checkpointing = true}),
                        reference, 1e-10);
  }
}

TEST_CASE("clipping: the norm the trainer computes is the norm of the gathered full gradient") {
  comm::mpi world;
  const auto model = make_gpt(config);
  const auto data = sample_text();
  trainer<std::remove_cvref_t<decltype(model)>, double> t(
      model, world, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::layer});
  const std::size_t ws = std::size_t(world.size());
  t.initialize(99, gpt2_init(config.layers));
  std::vector<int> tokens, targets;
  data.rank_slice(data.micro_batch(io::window_sampling::random, 5, 0, global_batch), std::size_t(world.rank()), ws, tokens,
                  targets);
  optim::sgd<double> frozen(t.engine().plan().shard_numel, {.lr = 0.0});
  const double norm = t.step({{device_ids(tokens), device_ids(targets)}}, frozen).grad_norm;
  double squared = 0;
  for (const tensor& g : t.engine().original_grad_dict())
    for (double x : g.values<double>()) squared += x * x;
  CHECK(norm == doctest::Approx(std::sqrt(squared)).epsilon(1e-12));
  CHECK(norm > 0);
}

TEST_CASE("generate: the prompt continued, the same on every rank; printable shows only what a terminal can") {
  comm::mpi world;
  const auto model = make_gpt(config);
  trainer<std::remove_cvref_t<decltype(model)>, double> t(
      model, world, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::layer});
  t.initialize(3, gpt2_init(config.layers));  // untrained: any byte comes out
  const std::string raw = generate(t, config, "And", 64, {.temperature = 2.0, .seed = 5});
  const std::string shown = generate(t, config, "And", 64, {.temperature = 2.0, .seed = 5, .printable = true});
  REQUIRE(raw.size() == 3 + 64);
  REQUIRE(shown.size() == raw.size());
  CHECK(raw.starts_with("And"));
  bool replaced = false;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const auto byte = static_cast<unsigned char>(raw[i]);
    const bool visible = (byte >= 0x20 && byte < 0x7f) || byte == '\n';
    CHECK(shown[i] == (visible ? raw[i] : '?'));
    replaced = replaced || !visible;
  }
  CHECK(replaced);  // at temperature 2 an untrained byte model emits control and high bytes
  std::vector<std::uint64_t> first{std::uint64_t(static_cast<unsigned char>(raw.back()))}, on_root = first;
  comm::broadcast(world, std::span<std::uint64_t>(on_root), 0);
  CHECK(on_root == first);
}

TEST_CASE("tied weights (lm_head.weight is transformer.wte.weight): world-size invariant, one shard") {
  comm::mpi world;
  comm::self one;
  const run_result reference = train<double>(one, {}, 1, global_batch, grad_accumulation::unsharded, false, 0.5, {}, true);
  CHECK(reference.weights.find("lm_head.weight") == nullptr);  // stored once, under its owner's name
  CHECK(reference.weights.size() + 1 == train<double>(one, {}).weights.size());
  CHECK(reference.losses.back() < reference.losses.front());
  for (auto sharding : {sharding_strategy::zero2, sharding_strategy::zero3}) {
    CAPTURE(to_string(sharding));
    check_close<double>(train<double>(world, {.sharding_strategy = sharding, .bucketing_strategy = bucketing::block}, 1,
                                      global_batch, grad_accumulation::unsharded, false, 0.5, {}, true),
                        reference, 1e-10);
  }
}

TEST_CASE("tied weights: resuming from a checkpoint continues bit for bit") {
  comm::mpi world;
  gpt_config sizes = config;
  sizes.tie_weights = true;
  const auto model = make_gpt(sizes);
  using model_type = std::remove_cvref_t<decltype(model)>;
  const auto data = sample_text();
  const std::size_t ws = std::size_t(world.size());
  const std::string path = "test_train_gpt_mpi_tied_np" + std::to_string(ws) + ".safetensors";
  using batch_type = trainer<model_type, double>::batch;
  auto batch_of = [&](std::size_t step) {
    std::vector<int> tokens, targets;
    data.rank_slice(data.micro_batch(io::window_sampling::random, 3, step, global_batch), std::size_t(world.rank()), ws,
                    tokens, targets);
    return batch_type{device_ids(tokens), device_ids(targets)};
  };
  auto state_of = [](optim::adamw<double>& adam) {
    return io::checkpoint_state<double>{.metadata = {}, .shards = {{"optimizer.exp_avg", adam.exp_avg()},
                                                                    {"optimizer.exp_avg_sq", adam.exp_avg_sq()}}};
  };
  state_dict straight;
  {
    trainer<model_type, double> t(
        model, world,
        {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
    t.initialize(5, gpt2_init(sizes.layers));
    optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 3e-3});
    for (std::size_t step = 0; step < 4; ++step) t.step({batch_of(step)}, adam, 1.0);
    straight = t.engine().original_state_dict();
  }
  {
    trainer<model_type, double> t(
        model, world,
        {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
    t.initialize(5, gpt2_init(sizes.layers));
    optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 3e-3});
    for (std::size_t step = 0; step < 2; ++step) t.step({batch_of(step)}, adam, 1.0);
    auto state = state_of(adam);
    state.metadata = {{"step", "2"}, {"tied", "lm_head.weight=transformer.wte.weight"}};
    io::save_checkpoint(path, t.engine(), state);
  }
  trainer<model_type, double> resumed(
      model, world, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
  optim::adamw<double> adam(resumed.engine().plan().shard_numel, {.lr = 3e-3});
  auto state = state_of(adam);
  io::load_checkpoint(path, resumed.engine(), state);
  CHECK(state.metadata.at("tied") == "lm_head.weight=transformer.wte.weight");
  adam.set_step_count(std::stoll(state.metadata.at("step")));
  for (std::size_t step = 2; step < 4; ++step) resumed.step({batch_of(step)}, adam, 1.0);
  const state_dict after = resumed.engine().original_state_dict();
  for (const tensor& t : straight) {
    CAPTURE(t.name);
    const auto a = after.at(t.name).values<double>();
    const auto b = t.values<double>();
    CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));  // bit for bit
  }
  world.barrier();
  if (world.rank() == 0) std::remove(path.c_str());
}

TEST_CASE("the GPT's gradients, untied and tied, match central differences") {
  comm::self one;
  const auto data = sample_text();
  for (bool tie : {false, true}) {
    CAPTURE(tie);
    gpt_config sizes = config;
    sizes.tie_weights = tie;
    const auto model = make_gpt(sizes);
    trainer<std::remove_cvref_t<decltype(model)>, double> t(
        model, one, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
    t.initialize(17, gpt2_init(sizes.layers));
    std::vector<int> tokens, targets;
    data.rank_slice(data.micro_batch(io::window_sampling::random, 1, 0, 2), 0, 1, tokens, targets);
    kfsdp::testing::check_gradients(t, decltype(t)::batch{device_ids(tokens), device_ids(targets)});
  }
}

TEST_CASE(
    "a plan from the compiler (static_shard_plan at 2 ranks): the run-time plan's losses; another size "
    "refused") {
  comm::mpi world;
  using static_gpt = gpt<2, 16, 8, 256, 2>;  // config's sizes, every extent a compile-time constant
  constexpr const auto& static_plan = static_shard_plan<static_gpt, 2, bucketing::block>;
  static_assert(static_plan.world_size == 2);
  // The bound a user would write: parameters, gradients and AdamW's two states under 1 MiB per rank.
  static_assert(4 * static_plan.shard_numel * sizeof(double) < (std::size_t(1) << 20));
  const fsdp_options options{.sharding_strategy = sharding_strategy::zero3,
                             .bucketing_strategy = bucketing::block};
  if (world.size() != 2) {
    CHECK_THROWS_WITH_AS(
        (trainer<static_gpt, double>(static_gpt{}, world, options, {}, to_dynamic(static_plan))),
        fmt::format("kfsdp::fsdp: the communicator has {} ranks, expected 2 (the world size of the "
                    "plan given, static_shard_plan<Model, 2, ...>)",
                    world.size())
            .c_str(),
        std::invalid_argument);
    return;
  }
  trainer<static_gpt, double> fixed(static_gpt{}, world, options, {}, to_dynamic(static_plan));
  CHECK(fixed.engine().plan() == to_dynamic(static_plan));
  trainer<static_gpt, double> sized_at_run_time(static_gpt{}, world, options);
  const run_result a = run_steps<double>(fixed), b = run_steps<double>(sized_at_run_time);
  CHECK(a.losses == b.losses);
  CHECK(a.norms == b.norms);
  // ... and make_gpt's run-time descriptor of the same sizes trains the same.
  check_close<double>(a, train<double>(world, {.sharding_strategy = sharding_strategy::zero3,
                                               .bucketing_strategy = bucketing::block}), 1e-12);
}
