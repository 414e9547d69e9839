// fit_surrogate — the README's whole user program: an MLP surrogate of the 2-D steady heat
// equation (finite-difference solutions for random Gaussian sources), trained with FSDP.
//   mpirun -np 2 build/examples/fit_surrogate        (examples/train_surrogate: the same with flags)
#include <cmath>
#include <numbers>
#include <fmt/format.h>
#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/environment.hpp>
#include <kfsdp/io/array_dataset.hpp>
#include <kfsdp/io/checkpoint.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/trainer.hpp>
#include "heat_problem.hpp"

using namespace kfsdp;
// u(x, y; x0, y0, amplitude, width): 6 features in, 1 out, 4 residual hidden layers (each an FSDP unit).
using surrogate = sequential<"", linear<"input", 6, 64>, gelu<>,
                             repeat<"hidden", 4, residual<"", linear<"fc", 64, 64>, gelu<>>>,
                             linear<"output", 64, 1>, mse<>>;

int main(int argc, char** argv) {
  comm::mpi::environment mpi_up(argc, argv);
  environment kokkos_up(argc, argv);
  comm::mpi world;
  const auto rank = std::size_t(world.rank()), ranks = std::size_t(world.size());

  const auto train = examples::heat_samples(examples::random_sources(512, /*seed=*/1), /*grid=*/10);
  const auto test = examples::heat_samples(examples::random_sources(32, /*seed=*/1000), 10);
  io::array_dataset data(train.features, 6, train.targets, 1), held_out(test.features, 6, test.targets, 1);
  const auto x_stats = data.feature_stats(), u_stats = data.target_stats();
  data.normalize(x_stats, u_stats);
  held_out.normalize(x_stats, u_stats);

  trainer<surrogate, double, zero3, layer_bucketing> model(surrogate{}, world);
  model.initialize(/*seed=*/1);
  optim::adamw<double> adam(model.engine().plan().shard_numel, {.lr = 3e-3, .weight_decay = 0.0});
  const std::size_t steps = 4000;
  for (std::size_t step = 0; step < steps; ++step) {
    adam.set_lr(1.5e-3 * (1 + std::cos(std::numbers::pi * double(step) / double(steps))));  // cosine decay
    auto [x, u] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, step, /*global batch=*/256), rank, ranks);
    model.step({{x, u}}, adam, /*max_norm=*/1.0);
  }
  // Each rank evaluates its slice of the held-out problems; evaluate() averages over all of them.
  const std::size_t first = held_out.count() * rank / ranks, last = held_out.count() * (rank + 1) / ranks;
  auto [x, u] = held_out.rows<double>(first, last - first);
  const double test_mse = model.evaluate({{x, u}});
  io::save_model("surrogate.safetensors", model.engine(), world);
  if (rank == 0) fmt::print("test mse {:.3g} (in units of the training set's variance)\n", test_mse);
}
