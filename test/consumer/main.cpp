// An outside program using an installed kfsdp (scripts/test-consumer builds it with Meson, CMake and
// as a Meson subproject): two FSDP steps of a small MLP on every rank's slice of one batch, then a
// checkpoint saved and loaded back. Exits nonzero unless the loss is finite and falls and the
// reloaded model gives the same loss.
//   mpirun -np 2 ./consumer [checkpoint.safetensors]
#include <cmath>
#include <cstdio>
#include <vector>

#include <fmt/format.h>
#include <kfsdp/kfsdp.hpp>                      // the common case: models, trainer, optimizers, datasets
#include <kfsdp/comm/mpi/mpi.hpp>               // and the backends, by name
#include <kfsdp/io/checkpoint/checkpoint.hpp>

using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 4, 16>, kfsdp::gelu<>,
                              kfsdp::repeat<"hidden", 2, kfsdp::residual<"", kfsdp::linear<"fc", 16, 16>, kfsdp::gelu<>>>,
                              kfsdp::linear<"out", 16, 1>, kfsdp::mse<>>;
using mlp_trainer = kfsdp::trainer<mlp, double>;
const kfsdp::fsdp_options zero3_layer{.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                      .bucketing_strategy = kfsdp::bucketing::layer};

int main(int argc, char** argv) {
  kfsdp::comm::mpi::environment mpi_up(argc, argv);
  kfsdp::environment kokkos_up(argc, argv);
  kfsdp::comm::mpi world;
  const auto rank = std::size_t(world.rank()), ranks = std::size_t(world.size());
  const char* checkpoint = argc > 1 ? argv[1] : "consumer.safetensors";

  // y = sin(x0 + 2 x1 - x2 + x3 / 2) at 64 points of a grid, the same on every rank.
  std::vector<double> x, y;
  for (std::size_t i = 0; i < 64; ++i) {
    const double v[4] = {double(i % 4) / 3, double(i / 4 % 4) / 3, double(i / 16) / 3, double(i % 7) / 6};
    x.insert(x.end(), v, v + 4);
    y.push_back(std::sin(v[0] + 2 * v[1] - v[2] + v[3] / 2));
  }
  kfsdp::io::array_dataset data(x, 4, y, 1);
  // The same global batch twice: a small step down the gradient must lower its loss.
  auto [xs, ys] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, 0, /*global batch=*/32), rank, ranks);

  mlp_trainer model(mlp{}, world, zero3_layer);
  model.initialize(/*seed=*/1);
  kfsdp::optim::adamw<double> adam(model.engine().plan().shard_numel, {.lr = 1e-3});
  const double first = model.step({{xs, ys}}, adam).loss;
  const double second = model.step({{xs, ys}}, adam).loss;
  const double trained = model.evaluate({{xs, ys}});

  kfsdp::io::save_model(checkpoint, model.engine());
  mlp_trainer reloaded(mlp{}, world, zero3_layer);
  kfsdp::io::load_model(checkpoint, reloaded.engine());
  const double reloaded_loss = reloaded.evaluate({{xs, ys}});

  // Every rank sees the same all-reduced losses, so every rank reaches the same verdict.
  const bool ok = std::isfinite(first) && std::isfinite(second) && second < first && trained < second &&
                  reloaded_loss == trained;
  if (rank == 0) {
    fmt::print("consumer: {} ranks, loss {:.6f} -> {:.6f} -> {:.6f}, reloaded from {}: {:.6f}{}\n", ranks, first,
               second, trained, checkpoint, reloaded_loss,
               ok ? "" : " (FAILED: expected a finite loss that falls and reloads exactly)");
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}
