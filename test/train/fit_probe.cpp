// A small fit for test_fit_preemption.py: an f64 MLP on synthetic data, 2 ranks, checkpoints every
// K steps into DIR (keeping 3), resuming there on its own. Each step waits DELAY_MS (in its
// schedule) so that a signal or a kill lands mid-run.
//   mpirun -np 2 fit_probe DIR STEPS EVERY DELAY_MS
#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <kfsdp/session.hpp>
#include <kfsdp/train/fit.hpp>

namespace {

using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 4, 32>, kfsdp::gelu<>, kfsdp::linear<"fc2", 32, 32>,
                              kfsdp::gelu<>, kfsdp::linear<"fc3", 32, 1>, kfsdp::mse<>>;

kfsdp::io::array_dataset samples() {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  constexpr std::size_t count = 96;
  std::vector<double> x(count * 4), y(count);
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < 4; ++j) x[i * 4 + j] = u(rng);
    y[i] = std::sin(2 * x[i * 4]) + x[i * 4 + 1] * x[i * 4 + 2] - 0.5 * x[i * 4 + 3];
  }
  return kfsdp::io::array_dataset(x, 4, y, 1);
}

std::size_t count_argument(const char* text, const char* name) {
  const std::string value(text);
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument("fit_probe: " + std::string(name) + " is '" + value + "', expected a count");
  return std::stoull(value);
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::session job(argc, argv);
  return job.run([&] {
    if (argc != 5) throw std::invalid_argument("fit_probe: expected DIR STEPS EVERY DELAY_MS");
    const std::size_t steps = count_argument(argv[2], "STEPS"), every = count_argument(argv[3], "EVERY");
    const auto delay = std::chrono::milliseconds(count_argument(argv[4], "DELAY_MS"));
    auto data = samples();
    const auto stats = data.normalize();
    kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                      job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                                .bucketing_strategy = kfsdp::bucketing::layer}));
    model.initialize(3);
    kfsdp::optim::adamw<double> adam(model, {.weight_decay = 0.01});
    const kfsdp::optim::cosine cosine(1e-2, steps, 1e-4);
    // A slow step, so that the test's signal arrives mid-run.
    const auto slow = [&](std::size_t step) {
      std::this_thread::sleep_for(delay);
      return cosine(step);
    };
    const kfsdp::fit_result result = kfsdp::fit(model, adam, slow, data,
                                                {.steps = steps,
                                                 .global_batch = 24,
                                                 .seed = 5,
                                                 .max_norm = 1.0,
                                                 .log_every = 50,
                                                 .checkpoint_dir = argv[1],
                                                 .checkpoint_every = every,
                                                 .metadata = kfsdp::io::stats_metadata(stats)});
    if (job.is_root())
      fmt::print("probe: step {} preempted {} resumed_from {} loss {}\n", result.step, result.preempted,
                 result.resumed_from, result.loss);
  });
}
