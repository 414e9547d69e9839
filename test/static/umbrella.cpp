// kfsdp/kfsdp.hpp alone is enough for the common case, and brings in no backend: this program
// includes nothing else of kfsdp, is built without MPI, NCCL or HDF5, and trains two steps of a
// small MLP on one rank (comm::self); it fails unless the loss is finite and falls.
#include <kfsdp/kfsdp.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#if defined(MPI_VERSION) || defined(OMPI_MPI_H) || defined(NCCL_MAJOR) || defined(H5_VERS_MAJOR)
#error "kfsdp/kfsdp.hpp included a backend (MPI, NCCL or HDF5); it must stay backend-free"
#endif

using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 4, 16>, kfsdp::gelu<>, kfsdp::linear<"out", 16, 1>, kfsdp::mse<>>;

int main(int argc, char** argv) {
  kfsdp::environment kokkos_up(argc, argv);
  kfsdp::comm::self one;
  std::vector<double> x, y;
  for (std::size_t i = 0; i < 32; ++i) {
    const double v[4] = {double(i % 4) / 3, double(i / 4 % 4) / 3, double(i / 16) / 3, double(i % 7) / 6};
    x.insert(x.end(), v, v + 4);
    y.push_back(std::sin(v[0] + 2 * v[1] - v[2] + v[3] / 2));
  }
  kfsdp::io::array_dataset data(x, 4, y, 1);
  auto [xs, ys] = data.rank_slice<double>(data.micro_batch(/*seed=*/1, 0, /*global batch=*/32), 0, 1);

  kfsdp::trainer<mlp, double> model(
      mlp{}, one,
      {.sharding_strategy = kfsdp::sharding_strategy::zero3, .bucketing_strategy = kfsdp::bucketing::layer});
  model.initialize(/*seed=*/1);
  kfsdp::optim::adamw<double> adam(model, {.lr = 1e-3});
  const double first = model.step({{xs, ys}}, adam).loss;
  const double second = model.step({{xs, ys}}, adam).loss;
  const bool ok = std::isfinite(first) && second < first;
  std::printf("umbrella: loss %.6f -> %.6f%s\n", first, second, ok ? "" : " (FAILED: expected a finite loss that falls)");
  return ok ? 0 : 1;
}
