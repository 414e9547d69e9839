// LoRA adapters (kfsdp::lora_linear) fine-tuning a frozen base, sharded: after 20 steps the base is
// bit for bit as it was, only the adapters hold optimizer state, no weight-gradient product runs for
// the base, its bytes leave the reduce-scatters, and the loss falls. Run with 1, 2 and 3 ranks.
#include <doctest/doctest.h>

#include <cstddef>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/trainer.hpp>

#include "../support/host_values.hpp"

namespace {

// A pretrained MLP's shape with adapters of rank 4 (alpha 8) on both of its layers.
using model = kfsdp::sequential<"", kfsdp::lora_linear<"fc1", 6, 32>, kfsdp::gelu<>, kfsdp::lora_linear<"fc2", 32, 1>,
                                kfsdp::mse<>>;
const model adapted{{4, 8.0}, {}, {4, 8.0}, {}};  // as docs/training.md writes it

kfsdp::io::array_dataset samples() {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-1, 1);
  constexpr std::size_t count = 96;
  std::vector<double> x(count * 6), y(count);
  for (std::size_t i = 0; i < count; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < 6; ++j) s += (j % 3 + 1) * (x[i * 6 + j] = u(rng));
    y[i] = std::sin(s / 3);
  }
  return kfsdp::io::array_dataset(x, 6, y, 1);
}

bool is_base(std::string_view name) { return name.find("lora_") == std::string_view::npos; }

using kfsdp::test::host_values;

}  // namespace

TEST_CASE("a LoRA fine-tune: the base bit for bit unchanged after 20 steps, the adapters alone trained and stateful") {
  kfsdp::comm::mpi world;
  kfsdp::trainer<model, double> t(adapted, world,
                                  {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer});
  t.initialize(3);
  auto& e = t.engine();
  CHECK(e.params().size() == 8);  // weight, bias, lora_A.weight, lora_B.weight, twice
  CHECK(e.param_index("fc1.lora_A.weight") < e.params().size());
  CHECK(host_values(e.shards().chunk(e.param_index("fc2.lora_B.weight"))) == std::vector<double>(e.mapping().chunk(e.param_index("fc2.lora_B.weight")).count, 0.0));
  // The base frozen: every parameter but the adapters (its four tensors), as docs/training.md writes it.
  kfsdp::optim::adamw<double> adam(t, {.lr = 2e-2}, {kfsdp::optim::lora_frozen_base()});

  std::size_t adapter_chunks = 0, base_padded = 0;
  std::vector<std::vector<double>> base_before;
  for (std::size_t p = 0; p < e.params().size(); ++p) {
    if (is_base(e.params()[p].name.view())) {
      CHECK(e.is_frozen(p));
      base_padded += e.mapping().padded(p).count;
      base_before.push_back(host_values(e.shards().chunk(p)));
    } else {
      CHECK_FALSE(e.is_frozen(p));
      adapter_chunks += e.mapping().chunk(p).count;
    }
  }
  CHECK(adam.state_size() == adapter_chunks);  // the only optimizer state: the adapters'

  // The same model trained whole, in step: its reduce-scatters carry the base too.
  kfsdp::trainer<model, double> whole(adapted, world, t.engine().options());
  whole.initialize(3);
  kfsdp::optim::adamw<double> whole_adam(whole, {.lr = 2e-2});

  const auto data = samples();
  const auto ws = std::size_t(world.size()), rank = std::size_t(world.rank());
  std::vector<double> losses;
  for (std::size_t step = 0; step < 20; ++step) {
    CAPTURE(step);
    auto [x, y] = data.rank_slice<double>(data.micro_batch(1, step, 24), rank, ws);
    const std::size_t products = kfsdp::nn::detail::weight_gradient_products, bytes = e.bytes_communicated();
    losses.push_back(t.step({{x, y}}, adam).loss);
    CHECK(kfsdp::nn::detail::weight_gradient_products == products);  // no dW = dy^T x for the frozen base
    const std::size_t lora_bytes = e.bytes_communicated() - bytes, whole_start = whole.engine().bytes_communicated();
    (void)whole.step({{x, y}}, whole_adam);
    CHECK(whole.engine().bytes_communicated() - whole_start - lora_bytes == base_padded * sizeof(double));
  }
  MESSAGE("loss ", losses.front(), " -> ", losses.back(), " over 20 steps, ", ws, " ranks");
  CHECK(losses.back() < 0.8 * losses.front());  // the adapters learn
  std::size_t b = 0;
  for (std::size_t p = 0; p < e.params().size(); ++p)
    if (is_base(e.params()[p].name.view())) CHECK(host_values(e.shards().chunk(p)) == base_before[b++]);
  // B [32, 4] has rows on every rank (up to 3): each rank's moved off zero.
  const std::size_t b1 = e.param_index("fc1.lora_B.weight");
  CHECK(host_values(e.shards().chunk(b1)) != std::vector<double>(e.mapping().chunk(b1).count, 0.0));
}
