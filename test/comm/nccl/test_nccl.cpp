// Tests for include/kfsdp/comm/nccl/nccl.hpp (linked with kfsdp_nccl), under mpirun.
// Without a GPU: construction throws on every rank, with a message naming the missing device.
// With one GPU per rank: an all_gather (blocking and non-blocking) of rank-dependent data, bf16
// and f16 sums, and a split group.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/nccl/nccl.hpp>

namespace comm = kfsdp::comm;

// Device memory only: a cudaMalloc'd buffer (nccl::device_memory); host memory is host()'s.
static_assert(comm::communicator_in<comm::nccl, comm::nccl::device_memory>);
static_assert(!comm::communicator<comm::nccl>);
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

using on_device = comm::nccl::device_memory;

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
  comm::span_in<T, on_device> span() const { return {data, count}; }
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
  CHECK_THROWS_WITH_AS(comm::broadcast(gpus, comm::span_in<float, on_device>(), gpus.size()),
                       doctest::Contains("kfsdp::comm::nccl::ibroadcast: root is"),
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
  comm::all_gather(gpus, comm::span_in<const float, on_device>(shard_on_device.span()), full_on_device.span());
  REQUIRE(cudaMemcpy(full.data(), full_on_device.data, full.size() * sizeof(float),
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(full == expected);

  REQUIRE(cudaMemset(full_on_device.data, 0, full.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  comm::request pending =
      gpus.iall_gather(comm::span_in<const float, on_device>(shard_on_device.span()), full_on_device.span());
  pending.wait();
  REQUIRE(cudaMemcpy(full.data(), full_on_device.data, full.size() * sizeof(float),
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(full == expected);

  CHECK_NOTHROW(comm::check_agreement(gpus, 7, "the plan"));  // through host()
  gpus.barrier();
}

TEST_CASE("nccl: a bucket's parts gathered and reduce-scattered as one group each (one GPU per rank)") {
  comm::mpi world;
  const int devices = devices_on_every_rank(world);
  if (devices == 0 || devices < world.size()) return;
  comm::nccl gpus(world);
  const auto ranks = static_cast<std::size_t>(gpus.size());
  // Two parts of 2 and 3 elements a rank; rank r's element i of part k is 100 r + 10 k + i.
  const std::size_t counts[2] = {2, 3};
  device_buffer<float> shards(5), full(5 * ranks), sums(5);
  std::vector<float> shard(5), gathered(5 * ranks), want_gathered(5 * ranks), summed(5), want_summed(5);
  for (std::size_t k = 0, at = 0; k < 2; at += counts[k], ++k)
    for (std::size_t i = 0; i < counts[k]; ++i) {
      shard[at + i] = static_cast<float>(100 * gpus.rank() + 10 * k + i);
      for (std::size_t r = 0; r < ranks; ++r) want_gathered[at * ranks + r * counts[k] + i] = float(100 * r + 10 * k + i);
    }
  REQUIRE(cudaMemcpy(shards.data, shard.data(), 5 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  const std::vector<comm::gather_part<float, on_device>> gathers = {
      {{shards.data, 2}, {full.data, 2 * ranks}}, {{shards.data + 2, 3}, {full.data + 2 * ranks, 3 * ranks}}};
  gpus.iall_gather_parts<float, on_device>(gathers).wait();
  REQUIRE(cudaMemcpy(gathered.data(), full.data, gathered.size() * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  CHECK(gathered == want_gathered);
  // Every rank reduce-scatters the gathered buffer: rank r's chunk of part k summed over the ranks.
  const std::vector<comm::reduce_scatter_part<float, on_device>> reductions = {
      {{full.data, 2 * ranks}, {sums.data, 2}}, {{full.data + 2 * ranks, 3 * ranks}, {sums.data + 2, 3}}};
  gpus.ireduce_scatter_sum_parts<float, on_device>(reductions).wait();
  REQUIRE(cudaMemcpy(summed.data(), sums.data, 5 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (std::size_t i = 0; i < 5; ++i) want_summed[i] = static_cast<float>(ranks) * shard[i];
  CHECK(summed == want_summed);
  const auto scaled = [&] { return gpus.ireduce_scatter_sum_parts<float, on_device>(reductions, 0.5f); };
  CHECK_THROWS_WITH_AS(scaled(),
                       doctest::Contains("factor is 0.5, expected 1 for device_memory buffers"), std::invalid_argument);
  gpus.barrier();
}

static_assert(comm::moves_elements_in<comm::nccl, kfsdp::bf16, on_device>);
static_assert(comm::moves_elements_in<comm::nccl, kfsdp::f16, on_device>);

TEST_CASE_TEMPLATE("nccl: bf16 and f16 sums, and a split group (one GPU per rank)", T, kfsdp::bf16,
                   kfsdp::f16) {
  comm::mpi world;
  const int devices = devices_on_every_rank(world);
  if (devices == 0 || devices < world.size()) return;
  comm::nccl gpus(world);
  const auto ranks = static_cast<std::size_t>(gpus.size());
  // Small integers: every partial sum is exact in both formats.
  std::vector<T> ones(2 * ranks, T(1.0F)), reduced(2);
  device_buffer<T> send_on_device(2 * ranks), recv_on_device(2);
  REQUIRE(cudaMemcpy(send_on_device.data, ones.data(), ones.size() * sizeof(T),
                     cudaMemcpyHostToDevice) == cudaSuccess);
  comm::reduce_scatter_sum(gpus, comm::span_in<const T, on_device>(send_on_device.span()), recv_on_device.span());
  REQUIRE(cudaMemcpy(reduced.data(), recv_on_device.data, 2 * sizeof(T), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  for (const T& x : reduced) CHECK(x.to_float() == float(ranks));

  // Groups of two ranks (one group at one rank): a sum inside each group.
  comm::nccl pair = gpus.split(gpus.rank() / 2, gpus.rank());
  CHECK(pair.rank() == gpus.rank() % 2);
  std::vector<T> mine{T(float(gpus.rank() + 1))};
  device_buffer<T> value_on_device(1);
  REQUIRE(cudaMemcpy(value_on_device.data, mine.data(), sizeof(T), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  comm::all_reduce_sum(pair, value_on_device.span());
  REQUIRE(cudaMemcpy(mine.data(), value_on_device.data, sizeof(T), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  float expected = 0;
  for (int r = 0; r < gpus.size(); ++r)
    if (r / 2 == gpus.rank() / 2) expected += float(r + 1);
  CHECK(mine[0].to_float() == expected);
  CHECK_NOTHROW(comm::check_agreement(pair, std::uint64_t(gpus.rank() / 2), "the pair"));
  gpus.barrier();
}
