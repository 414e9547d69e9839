// threaded<mpi>: the same results as the backend, in issue order, with real overlap; run at 1-4 ranks.
#include <doctest/doctest.h>

#include <chrono>
#include <numeric>
#include <stdexcept>
#include <vector>

#include <kfsdp/comm/mpi.hpp>
#include <kfsdp/comm/threaded.hpp>

using kfsdp::comm::mpi;
using kfsdp::comm::threaded;

static_assert(kfsdp::comm::communicator<threaded<mpi>>);

TEST_CASE("collectives through the worker give the backend's results, in issue order") {
  mpi world;
  threaded overlapped(world);
  const int n = overlapped.size(), r = overlapped.rank();
  std::vector<double> shard(5), full(5 * std::size_t(n));
  std::iota(shard.begin(), shard.end(), 10.0 * r);
  std::vector<kfsdp::comm::request> pending;
  pending.push_back(overlapped.iall_gather<double>(shard, std::span(full)));
  std::vector<double> sums(3 * std::size_t(n), double(r + 1)), mine(3);
  pending.push_back(overlapped.ireduce_scatter_sum<double>(sums, std::span(mine)));
  std::vector<float> root_data(4, float(r));
  pending.push_back(overlapped.ibroadcast(std::span(root_data), n - 1));
  for (auto& p : pending) p.wait();
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 5; ++i) CHECK(full[std::size_t(q * 5 + i)] == 10.0 * q + i);
  for (double x : mine) CHECK(x == double(n * (n + 1) / 2));
  for (float x : root_data) CHECK(x == float(n - 1));
  std::uint64_t m[1] = {std::uint64_t(r)};
  overlapped.all_reduce_max(std::span<std::uint64_t>(m));
  CHECK(m[0] == std::uint64_t(n - 1));
  kfsdp::comm::check_agreement(overlapped, 7, "a constant");
}

TEST_CASE("bad arguments throw at the call, before anything is queued") {
  mpi world;
  threaded overlapped(world);
  std::vector<float> send(3), recv(3 * std::size_t(overlapped.size()) + 1);
  CHECK_THROWS_AS((void)overlapped.iall_gather<float>(send, std::span(recv)), std::invalid_argument);
  CHECK_THROWS_AS((void)overlapped.ibroadcast(std::span(send), overlapped.size()), std::invalid_argument);
}

TEST_CASE("an all-gather in flight completes while the caller does something else") {
  mpi world;
  threaded overlapped(world);
  std::vector<float> shard(1 << 20, 1.0f), full((1 << 20) * std::size_t(overlapped.size()));
  auto pending = overlapped.iall_gather<float>(shard, std::span(full));
  // The caller never calls MPI; the worker alone finishes the collective.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!pending.test() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  CHECK(!pending.in_flight());
  CHECK(full.back() == 1.0f);
}
