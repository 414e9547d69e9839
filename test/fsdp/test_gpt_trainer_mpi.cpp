// Sharded training is the same training: losses at world size N equal those of one process.
// Run with 1, 2, 3 and 4 ranks; the one-process reference runs in the same program (self backend).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/comm/self.hpp>
#include <kfsdp/comm/threaded.hpp>
#include <kfsdp/fsdp/fsdp.hpp>
#include <kfsdp/fsdp/gpt_trainer.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/io/text_dataset.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/sgd.hpp>

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

// Trains `steps` steps on `comm` with the given options; every rank gets its slice of each batch.
template <class Scalar>
run_result train(comm::any_communicator comm, fsdp_options options, std::size_t micro_batches = 1,
                 std::size_t batch = global_batch, grad_accumulation accumulation = grad_accumulation::unsharded,
                 bool use_sgd = false, double clip = 0.5) {
  const auto data = sample_text();
  const auto model = make_gpt(config);
  return with_fsdp<Scalar>(model, comm, options, [&](auto& engine) {
    const std::size_t ws = std::size_t(engine.world_size());
    gpt_trainer trainer(engine, config, batch / ws);
    engine.initialize(1234, gpt2_init(config.layers));
    optim::adamw<Scalar> adam(engine.plan().shard_numel, {.lr = 3e-3, .weight_decay = 0.1});
    optim::sgd<Scalar> sgd(engine.plan().shard_numel, {.lr = 0.1, .momentum = 0.9});
    run_result out;
    for (std::size_t s = 0; s < steps; ++s) {
      std::vector<micro_batch> batches(micro_batches);
      for (std::size_t k = 0; k < micro_batches; ++k)
        data.rank_slice(data.micro_batch(io::window_sampling::sequential, 0, s * micro_batches + k, batch),
                        std::size_t(engine.rank()), ws, batches[k].tokens, batches[k].targets);
      const step_result r = use_sgd ? trainer.step(batches, sgd, clip, accumulation)
                                    : trainer.step(batches, adam, clip, accumulation);
      out.losses.push_back(r.loss);
      out.norms.push_back(r.grad_norm);
    }
    out.weights = engine.original_state_dict();
    return out;
  });
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

TEST_CASE("clipping: the norm the engine computes is the norm of the gathered full gradient") {
  comm::mpi world;
  const auto model = make_gpt(config);
  const auto data = sample_text();
  fsdp<decltype(model), double, zero3, layer_bucketing> engine(model, world);
  const std::size_t ws = std::size_t(world.size());
  gpt_trainer trainer(engine, config, global_batch / ws);
  engine.initialize(99, gpt2_init(config.layers));
  micro_batch batch;
  data.rank_slice(data.micro_batch(io::window_sampling::random, 5, 0, global_batch), std::size_t(world.rank()), ws,
                  batch.tokens, batch.targets);
  engine.zero_grad();
  trainer.forward_backward(batch, 1.0 / double(trainer.local_batch() * config.seq), true);
  const double norm = trainer.global_grad_norm();
  double squared = 0;
  for (const tensor& t : engine.original_grad_dict())
    for (double g : t.values<double>()) squared += g * g;
  CHECK(norm == doctest::Approx(std::sqrt(squared)).epsilon(1e-12));
  CHECK(norm > 0);
}
