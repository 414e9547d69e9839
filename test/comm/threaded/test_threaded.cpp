// threaded<mpi>: the same results as the backend, in issue order, with real overlap; run at 1-4 ranks.
#include <doctest/doctest.h>

#include <chrono>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/threaded/threaded.hpp>

#include "../../support/gather_parts.hpp"

using kfsdp::comm::mpi;
using kfsdp::comm::threaded;
namespace comm = kfsdp::comm;

static_assert(kfsdp::comm::communicator<threaded<mpi>>);

namespace {

// A backend whose sums fail, to see the worker's exception come back through the request (the test
// calls nothing else of it, so it has nothing else: nvcc warns about members never called).
struct failing_sums {
  template <class T>
  comm::request iall_reduce_sum(std::span<T> /*data*/) {
    throw std::runtime_error("link down");
  }
};

// A backend that notes whether the thread running its sum has its waits yield the CPU.
struct yield_probe {
  bool seen = false;
  template <class T>
  comm::request iall_reduce_sum(std::span<T> /*data*/) {
    seen = comm::detail::waits_yield_on_this_thread;
    return {};
  }
};

// A backend of `ranks` ranks that notes the thread running its sum.
struct thread_probe {
  int ranks = 1;
  std::thread::id seen;
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return ranks; }
  template <class T>
  comm::request iall_reduce_sum(std::span<T> /*data*/) {
    seen = std::this_thread::get_id();
    return {};
  }
};

// Values as double, so that vectors of bf16 and f16 compare.
template <class T>
std::vector<double> values_of(const std::vector<T>& elements) {
  return std::vector<double>(elements.begin(), elements.end());
}

}  // namespace

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

TEST_CASE_TEMPLATE("bf16 and f16 through the worker: exact sums of small integers", T, kfsdp::bf16,
                   kfsdp::f16) {
  mpi world;
  threaded overlapped(world);
  const int n = overlapped.size(), r = overlapped.rank();
  const auto ranks = std::size_t(n);
  // Integers up to 64 with sums up to 4*64: exact in bf16 (8 bits) and f16 (11 bits).
  std::vector<T> shard(3), full(3 * ranks);
  for (std::size_t i = 0; i < 3; ++i) shard[i] = T(float(16 * r + int(i) + 1));
  comm::all_gather(overlapped, shard, std::span(full));
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 3; ++i) CHECK(full[std::size_t(q * 3 + i)].to_float() == float(16 * q + i + 1));

  std::vector<T> ones(2 * ranks, T(1.0F)), mine(2);
  comm::reduce_scatter_sum(overlapped, ones, std::span(mine));
  CHECK(values_of(mine) == std::vector<double>(2, double(n)));

  std::vector<T> from_last(4, T(float(r)));
  overlapped.ibroadcast(std::span(from_last), n - 1).wait();
  CHECK(values_of(from_last) == std::vector<double>(4, double(n - 1)));

  std::vector<T> total{T(float(r + 1))};
  overlapped.iall_reduce_sum(std::span(total)).wait();
  CHECK(total[0].to_float() == float(n * (n + 1) / 2));
}

TEST_CASE("an exception on the worker comes back from the request's wait (and test)") {
  failing_sums backend;
  threaded overlapped(backend);
  std::vector<double> data(2);
  CHECK_THROWS_WITH_AS(overlapped.iall_reduce_sum(std::span(data)).wait(), "link down",
                       std::runtime_error);
  comm::request polled = overlapped.iall_reduce_sum(std::span(data));
  bool threw = false;
  try {
    while (!polled.test()) std::this_thread::yield();
  } catch (const std::runtime_error& error) {
    threw = std::string(error.what()) == "link down";
  }
  CHECK(threw);
  CHECK_FALSE(polled.in_flight());
}

TEST_CASE("the worker's waits yield its CPU (the caller computes meanwhile); the caller's do not") {
  yield_probe backend;
  threaded overlapped(backend);
  std::vector<double> data(2);
  overlapped.iall_reduce_sum(std::span(data)).wait();
  CHECK(backend.seen);
  CHECK_FALSE(comm::detail::waits_yield_on_this_thread);
}

TEST_CASE("with one rank a collective runs on the caller (nothing to overlap); with two on the worker") {
  std::vector<double> data(2);
  thread_probe one{1, {}};
  threaded alone(one);
  alone.iall_reduce_sum(std::span(data)).wait();
  CHECK(one.seen == std::this_thread::get_id());
  thread_probe two{2, {}};
  threaded pair(two);
  pair.iall_reduce_sum(std::span(data)).wait();
  CHECK(two.seen != std::thread::id{});
  CHECK(two.seen != std::this_thread::get_id());
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

TEST_CASE_TEMPLATE("a gather batch runs on the worker as the backend's batch", T, float, kfsdp::bf16) {
  mpi world;
  threaded overlapped(world);
  kfsdp::test::gather_parts_case<T> batch(overlapped.rank(), overlapped.size());
  static_assert(comm::gathers_parts<threaded<mpi>, T, Kokkos::HostSpace>);
  comm::iall_gather_parts<T, Kokkos::HostSpace>(overlapped, batch.parts).wait();
  batch.check();
  // Checked on the caller's thread: parts[3]'s recv moved onto parts[2]'s.
  batch.parts[3].recv = batch.parts[2].recv.subspan(0, batch.parts[3].recv.size());
  const auto gather = [&] { return overlapped.template iall_gather_parts<T, Kokkos::HostSpace>(batch.parts); };
  CHECK_THROWS_WITH_AS((void)gather(),
                       doctest::Contains("kfsdp::comm::threaded::iall_gather_parts: parts["), std::invalid_argument);
}

TEST_CASE("shared memory is made and freed on the worker, and a batch in it is read in place there") {
  mpi world;
  threaded overlapped(world);
  static_assert(comm::shares_memory<threaded<mpi>>);
  static_assert(!comm::shares_memory<threaded<failing_sums>>);
  comm::shared_bytes memory = overlapped.allocate_shared(16 * sizeof(double));
  CHECK(memory.empty() == (world.size() == 1));
  if (memory.empty()) return;
  kfsdp::test::gather_parts_case<double> batch(world.rank(), world.size(), {6, 0, 9, 0});
  batch.send_from(std::span<double>(reinterpret_cast<double*>(memory.bytes.data()), 16));
  CHECK(world.reads_in_place<double, Kokkos::HostSpace>(batch.parts));
  overlapped.iall_gather_parts<double, Kokkos::HostSpace>(batch.parts).wait();
  batch.check();
  memory = {};  // freed by the worker, collectively
  CHECK_FALSE(world.reads_in_place<double, Kokkos::HostSpace>(batch.parts));
}

TEST_CASE("all_to_all through the worker: rank r gets block r of every rank's send; bad sizes throw at the call") {
  mpi world;
  threaded overlapped(world);
  const int n = overlapped.size(), r = overlapped.rank();
  std::vector<double> send, recv(2 * std::size_t(n), -1.0);
  for (int to = 0; to < n; ++to) send.insert(send.end(), {100.0 * r + to, 100.0 * r + to + 0.5});
  overlapped.iall_to_all<double>(send, std::span(recv)).wait();
  for (int from = 0; from < n; ++from) {
    CHECK(recv[2 * std::size_t(from)] == 100.0 * from + r);
    CHECK(recv[2 * std::size_t(from) + 1] == 100.0 * from + r + 0.5);
  }
  std::vector<double> wrong(recv.size() + 1);
  CHECK_THROWS_AS((void)overlapped.iall_to_all<double>(send, std::span(wrong)), std::invalid_argument);
}
