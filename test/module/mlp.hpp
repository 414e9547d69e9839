#pragma once
// Three AdamW steps of a small MLP on one rank: the same source compiled through `import kfsdp;`
// (test_module.cpp) and through the headers (header_mlp.cpp) must give the same losses.
#include <cmath>
#include <vector>

namespace kfsdp_module_test {

using mlp = kfsdp::sequential<"", kfsdp::linear<"input", 3, 16>, kfsdp::tanh_layer<>,
                              kfsdp::repeat<"hidden", 2, kfsdp::residual<"", kfsdp::linear<"fc", 16, 16>, kfsdp::gelu<>>>,
                              kfsdp::linear<"output", 16, 1>, kfsdp::mse<>>;

inline std::vector<double> train_mlp() {
  std::vector<double> features, targets;
  for (int i = 0; i < 32; ++i) {
    const double x = i / 32.0;
    features.insert(features.end(), {x, x * x, std::sin(3 * x)});
    targets.push_back(std::cos(2 * x));
  }
  kfsdp::comm::self one;
  kfsdp::trainer<mlp, double> trainer(
      mlp{}, one,
      {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer},
      {});
  trainer.initialize(/*seed=*/5);
  kfsdp::optim::adamw<double> adam(trainer.engine().plan().shard_numel, {.lr = 1e-2});
  kfsdp::io::array_dataset data(features, 3, targets, 1);
  std::vector<double> losses;
  for (std::size_t step = 0; step < 3; ++step) {
    auto [x, y] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, step, 8), 0, 1);
    losses.push_back(trainer.step({{x, y}}, adam, 1.0).loss);
  }
  return losses;
}

}  // namespace kfsdp_module_test
