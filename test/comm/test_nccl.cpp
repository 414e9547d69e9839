// Tests for include/kfsdp/comm/nccl.hpp (linked with kfsdp_nccl), under mpirun.
// Without a GPU: construction throws on every rank, with a message naming the missing device.
// With one GPU per rank: an all_gather (blocking and non-blocking) of rank-dependent data.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/comm/nccl.hpp>

namespace comm = kfsdp::comm;

static_assert(comm::communicator<comm::nccl>);
static_assert(comm::has_host_channel<comm::nccl>);
// The header's forward-declared handle types are the CUDA runtime's own.
static_assert(std::is_same_v<comm::nccl::cuda_stream, cudaStream_t>);
static_assert(std::is_same_v<comm::nccl::cuda_event, cudaEvent_t>);

namespace {

// Device count agreed over ranks (the minimum), so every rank takes the same branch.
int devices_on_every_rank(comm::mpi& world) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  std::int64_t fewest[1] = {count};
  world.all_reduce_min(std::span<std::int64_t>(fewest));
  return static_cast<int>(fewest[0]);
}

// A device buffer freed at scope exit.
template <class T>
struct device_buffer {
  T* data = nullptr;
  std::size_t count = 0;
  explicit device_buffer(std::size_t n) : count(n) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T)) == cudaSuccess);
  }
  ~device_buffer() { cudaFree(data); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  std::span<T> span() const { return {data, count}; }
};

}  // namespace

TEST_CASE("nccl: without a GPU, construction fails clearly on every rank") {
  comm::mpi world;
  if (devices_on_every_rank(world) > 0) return;  // covered by the GPU test below
  CHECK_THROWS_WITH_AS(comm::nccl{world},
                       doctest::Contains("kfsdp::comm::nccl: no CUDA device is visible "
                                         "(cudaGetDeviceCount: "),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(comm::nccl{world},
                       doctest::Contains("the NCCL backend needs one GPU per rank — use "
                                         "kfsdp::comm::mpi on CPU machines"),
                       std::runtime_error);
  CHECK_THROWS_AS(comm::nccl(world, 0), std::runtime_error);
  world.barrier();  // nobody was left waiting in a bootstrap collective
}

TEST_CASE("nccl: all_gather of rank-dependent data (one GPU per rank)") {
  comm::mpi world;
  const int devices = devices_on_every_rank(world);
  if (devices == 0) return;
  if (devices < world.size()) {  // NCCL refuses two ranks on one GPU
    MESSAGE("skipped: " << world.size() << " ranks but " << devices << " GPUs");
    return;
  }
  comm::nccl gpus(world);
  CHECK(gpus.rank() == world.rank());
  CHECK(gpus.size() == world.size());
  CHECK_THROWS_WITH_AS(gpus.broadcast(std::span<float>(), gpus.size()),
                       doctest::Contains("kfsdp::comm::nccl::broadcast: root is"),
                       std::invalid_argument);

  constexpr std::size_t count = 5;
  const auto ranks = static_cast<std::size_t>(gpus.size());
  std::vector<float> shard(count), expected(count * ranks), full(count * ranks, -1.0f);
  for (std::size_t i = 0; i < count; ++i) shard[i] = static_cast<float>(100 * gpus.rank() + i);
  for (std::size_t r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      expected[r * count + i] = static_cast<float>(100 * r + i);
    }
  }

  device_buffer<float> shard_on_device(count), full_on_device(count * ranks);
  REQUIRE(cudaMemcpy(shard_on_device.data, shard.data(), count * sizeof(float),
                     cudaMemcpyHostToDevice) == cudaSuccess);
  gpus.all_gather(std::span<const float>(shard_on_device.span()), full_on_device.span());
  REQUIRE(cudaMemcpy(full.data(), full_on_device.data, full.size() * sizeof(float),
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(full == expected);

  REQUIRE(cudaMemset(full_on_device.data, 0, full.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  comm::request pending =
      gpus.iall_gather(std::span<const float>(shard_on_device.span()), full_on_device.span());
  pending.wait();
  REQUIRE(cudaMemcpy(full.data(), full_on_device.data, full.size() * sizeof(float),
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(full == expected);

  CHECK_NOTHROW(comm::check_agreement(gpus, 7, "the plan"));  // through host()
  gpus.barrier();
}
