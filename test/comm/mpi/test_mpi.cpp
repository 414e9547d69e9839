// Tests for include/kfsdp/comm/mpi/mpi.hpp; run under mpirun at 1, 2, 3 and 4 ranks (mpi_test_dep's
// main). Every rank makes the same collective calls in the same order, so a failing CHECK on one
// rank never leaves the others waiting.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sched.h>

#include <fmt/format.h>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/mpi/mpi.hpp>

#include "../../support/gather_parts.hpp"
#include "../../support/rank_values.hpp"

namespace comm = kfsdp::comm;
using kfsdp::test::contribution;
using kfsdp::test::contributions;
using kfsdp::test::values_of;

static_assert(comm::communicator<comm::mpi>);

namespace {

// a + b, in float and rounded once for the 16-bit types (exact for the values above).
template <class T>
T plus(T a, T b) {
  if constexpr (comm::half_element<T>) return T(a.to_float() + b.to_float());
  else return a + b;
}

// What all_gather must produce: [rank 0's | rank 1's | ...].
template <class T>
std::vector<T> gathered(int ranks, std::size_t count) {
  std::vector<T> values;
  for (int rank = 0; rank < ranks; ++rank) {
    const auto part = contributions<T>(rank, count);
    values.insert(values.end(), part.begin(), part.end());
  }
  return values;
}

// What rank `rank` must get from reduce_scatter_sum of contributions(q, ranks*count) over q.
template <class T>
std::vector<T> scattered_sum(int rank, int ranks, std::size_t count) {
  std::vector<T> values(count, T(0));
  for (int q = 0; q < ranks; ++q) {
    for (std::size_t i = 0; i < count; ++i) {
      values[i] = plus(values[i], contribution<T>(q, static_cast<std::size_t>(rank) * count + i));
    }
  }
  return values;
}

}  // namespace

TEST_CASE("mpi: wraps a duplicate of MPI_COMM_WORLD") {
  int world_rank = -1, world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  comm::mpi world;
  CHECK(world.rank() == world_rank);
  CHECK(world.size() == world_size);
  int relation = MPI_UNEQUAL;
  MPI_Comm_compare(world.native(), MPI_COMM_WORLD, &relation);
  CHECK(relation == MPI_CONGRUENT);  // same group, different context: no message can cross
}

TEST_CASE("mpi: wraps a user communicator (ranks split in two halves)") {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const int half = world_rank < (world_size + 1) / 2 ? 0 : 1;
  MPI_Comm user_half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, half, world_rank, &user_half);
  {
    comm::mpi halves(user_half);
    const int expected_size = half == 0 ? (world_size + 1) / 2 : world_size / 2;
    CHECK(halves.size() == expected_size);
    std::vector<std::int64_t> total{world_rank};
    comm::all_reduce_sum(halves, std::span(total));
    std::int64_t expected = 0;
    for (int r = 0; r < world_size; ++r) {
      if ((r < (world_size + 1) / 2 ? 0 : 1) == half) expected += r;
    }
    CHECK(total[0] == expected);
  }
  int still_valid = MPI_UNEQUAL;  // the user's communicator is untouched by kfsdp's free
  CHECK(MPI_Comm_compare(user_half, user_half, &still_valid) == MPI_SUCCESS);
  CHECK(still_valid == MPI_IDENT);
  MPI_Comm_free(&user_half);
}

TEST_CASE("mpi: MPI_COMM_NULL is rejected; a moved-from communicator is empty") {
  CHECK_THROWS_WITH_AS(comm::mpi(MPI_COMM_NULL),
                       "kfsdp::comm::mpi::mpi: user_comm is MPI_COMM_NULL",
                       std::invalid_argument);
  comm::mpi first;
  const MPI_Comm native = first.native();
  comm::mpi second(std::move(first));
  CHECK(second.native() == native);
  CHECK(first.native() == MPI_COMM_NULL);  // NOLINT(bugprone-use-after-move)
  comm::mpi third;
  third = std::move(second);  // frees third's own duplicate
  CHECK(third.native() == native);
}

TEST_CASE_TEMPLATE("mpi: all_gather of rank-dependent data", T, float, double, std::int64_t,
                   std::uint64_t, kfsdp::bf16, kfsdp::f16) {
  comm::mpi world;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{40}}) {
    CAPTURE(count);
    const auto shard = contributions<T>(world.rank(), count);
    std::vector<T> full(count * static_cast<std::size_t>(world.size()), T(-1));
    comm::all_gather(world, shard, std::span(full));
    CHECK(values_of(full) == values_of(gathered<T>(world.size(), count)));

    std::fill(full.begin(), full.end(), T(-1));
    comm::request pending = world.iall_gather(shard, std::span(full));
    pending.wait();
    CHECK(values_of(full) == values_of(gathered<T>(world.size(), count)));
  }
}

TEST_CASE("mpi: in-place all_gather (send is this rank's slot of recv)") {
  comm::mpi world;
  constexpr std::size_t count = 3;
  std::vector<double> full(count * static_cast<std::size_t>(world.size()), -1.0);
  const auto slot = std::span(full).subspan(static_cast<std::size_t>(world.rank()) * count, count);
  const auto mine = contributions<double>(world.rank(), count);
  std::copy(mine.begin(), mine.end(), slot.begin());
  comm::all_gather(world, std::span<const double>(slot), std::span(full));
  CHECK(full == gathered<double>(world.size(), count));

  std::fill(full.begin(), full.end(), -1.0);
  std::copy(mine.begin(), mine.end(), slot.begin());
  world.iall_gather(std::span<const double>(slot), std::span(full)).wait();
  CHECK(full == gathered<double>(world.size(), count));
}

TEST_CASE_TEMPLATE("mpi: reduce_scatter_sum gives each rank the sum of its chunk", T, float, double,
                   std::int64_t, std::uint64_t, kfsdp::bf16, kfsdp::f16) {
  comm::mpi world;
  constexpr std::size_t count = 4;
  const auto full_gradient =
      contributions<T>(world.rank(), count * static_cast<std::size_t>(world.size()));
  std::vector<T> shard(count, T(-1));
  comm::reduce_scatter_sum(world, full_gradient, std::span(shard));
  CHECK(values_of(shard) == values_of(scattered_sum<T>(world.rank(), world.size(), count)));

  std::fill(shard.begin(), shard.end(), T(-1));
  comm::request pending = world.ireduce_scatter_sum(full_gradient, std::span(shard));
  while (!pending.test()) {
  }
  CHECK_FALSE(pending.in_flight());
  CHECK(values_of(shard) == values_of(scattered_sum<T>(world.rank(), world.size(), count)));
}

// Chunk sizes around the ring's segments: one element, one segment, and several with a partial
// last one (ring_segment_bytes is 256 KiB); every sum stays an exact integer in float.
template <class T>
std::vector<std::size_t> ring_test_counts() {
  const std::size_t segment = 256 * 1024 / sizeof(T);
  return {1, 7, segment, 2 * segment + 3};
}

TEST_CASE_TEMPLATE("mpi: reduce_scatter_sum is exact through both paths, blocking and not", T,
                   float, double, std::int64_t, std::uint64_t, kfsdp::bf16, kfsdp::f16) {
  comm::mpi world;
  const auto ranks = static_cast<std::size_t>(world.size());
  for (const bool ring : {false, true}) {
    CAPTURE(ring);
    world.set_reduce_scatter_ring_min_bytes(ring ? 1 : SIZE_MAX);
    for (const std::size_t count : ring_test_counts<T>()) {
      CAPTURE(count);
      const auto full_gradient = contributions<T>(world.rank(), count * ranks);
      const auto expected = scattered_sum<T>(world.rank(), world.size(), count);
      std::vector<T> shard(count, T(-1));
      comm::reduce_scatter_sum(world, full_gradient, std::span(shard));
      CHECK(values_of(shard) == values_of(expected));

      std::fill(shard.begin(), shard.end(), T(-1));
      comm::request polled = world.ireduce_scatter_sum(full_gradient, std::span(shard));
      while (!polled.test()) {
      }
      CHECK(values_of(shard) == values_of(expected));

      std::fill(shard.begin(), shard.end(), T(-1));
      world.ireduce_scatter_sum(full_gradient, std::span(shard)).wait();
      CHECK(values_of(shard) == values_of(expected));
    }
  }
}

TEST_CASE("mpi: the default threshold sends big chunks through the ring and small through MPI") {
  comm::mpi world;
  const std::size_t threshold = world.reduce_scatter_ring_min_bytes();
  CHECK(threshold == comm::mpi::default_reduce_scatter_ring_min_bytes);
  const auto ranks = static_cast<std::size_t>(world.size());
  for (const std::size_t count : {threshold / sizeof(float) - 1, threshold / sizeof(float) + 5}) {
    CAPTURE(count);
    const auto full_gradient = contributions<float>(world.rank(), count * ranks);
    std::vector<float> shard(count, -1.0F);
    comm::reduce_scatter_sum(world, full_gradient, std::span(shard));
    CHECK(shard == scattered_sum<float>(world.rank(), world.size(), count));
  }
}

TEST_CASE("mpi: ring reduce-scatters in flight together, waited in any order, never cross") {
  comm::mpi world;
  world.set_reduce_scatter_ring_min_bytes(1);
  const auto ranks = static_cast<std::size_t>(world.size());
  const std::size_t big = 2 * 256 * 1024 / sizeof(double) + 1;  // three segments per round
  const auto gradient_a = contributions<double>(world.rank(), big * ranks);
  auto gradient_b = contributions<double>(world.rank(), 5 * ranks);
  for (double& value : gradient_b) value *= 2;
  const auto shard = contributions<float>(world.rank(), 3);
  std::vector<double> reduced_a(big), reduced_b(5);
  std::vector<float> full(3 * ranks);

  comm::request a = world.ireduce_scatter_sum(gradient_a, std::span(reduced_a));
  comm::request gather = world.iall_gather(shard, std::span(full));
  comm::request b = world.ireduce_scatter_sum(gradient_b, std::span(reduced_b));
  // Ranks advance the operations in different orders: the last rank polls a first.
  if (world.rank() == world.size() - 1) (void)a.test();
  b.wait();
  gather.wait();
  a.wait();

  CHECK(reduced_a == scattered_sum<double>(world.rank(), world.size(), big));
  auto expected_b = scattered_sum<double>(world.rank(), world.size(), 5);
  for (double& value : expected_b) value *= 2;
  CHECK(reduced_b == expected_b);
  CHECK(full == gathered<float>(world.size(), 3));
}

TEST_CASE("mpi: the ring sums block b in the documented order ((x[b+1] + x[b+2]) + ...) + x[b]") {
  comm::mpi world;
  world.set_reduce_scatter_ring_min_bytes(1);
  const int ranks = world.size();
  const std::size_t count = 256 * 1024 / sizeof(float) + 9;  // two segments per round
  // Values whose float sums round, so another association would show in the last bits.
  const auto inexact = [](int rank, std::size_t index) {
    return 1.0F / static_cast<float>(3 + 7 * rank + static_cast<int>(index % 1013));
  };
  std::vector<float> full_gradient(count * static_cast<std::size_t>(ranks));
  for (std::size_t i = 0; i < full_gradient.size(); ++i) full_gradient[i] = inexact(world.rank(), i);

  std::vector<float> first(count), second(count);
  comm::reduce_scatter_sum(world, std::span<const float>(full_gradient), std::span(first));
  world.ireduce_scatter_sum(std::span<const float>(full_gradient), std::span(second)).wait();
  CHECK(first == second);  // bit for bit: the order is fixed

  const int block = world.rank();
  std::vector<float> expected(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t index = static_cast<std::size_t>(block) * count + i;
    float sum = inexact((block + 1) % ranks, index);
    for (int step = 2; step <= ranks; ++step) sum += inexact((block + step) % ranks, index);
    expected[i] = sum;
  }
  CHECK(first == expected);
}

TEST_CASE("mpi: the ring threshold moves with the communicator") {
  comm::mpi first;
  first.set_reduce_scatter_ring_min_bytes(12345);
  comm::mpi second(std::move(first));
  CHECK(second.reduce_scatter_ring_min_bytes() == 12345);
  comm::mpi third;
  third = std::move(second);
  CHECK(third.reduce_scatter_ring_min_bytes() == 12345);
}

TEST_CASE_TEMPLATE("mpi: broadcast from every root", T, float, double, std::int64_t,
                   std::uint64_t, kfsdp::bf16, kfsdp::f16) {
  comm::mpi world;
  for (int root = 0; root < world.size(); ++root) {
    CAPTURE(root);
    auto data = contributions<T>(world.rank(), 6);
    comm::broadcast(world, std::span(data), root);
    CHECK(values_of(data) == values_of(contributions<T>(root, 6)));

    data = contributions<T>(world.rank(), 6);
    world.ibroadcast(std::span(data), root).wait();
    CHECK(values_of(data) == values_of(contributions<T>(root, 6)));
  }
}

TEST_CASE_TEMPLATE("mpi: all_reduce sum, max and min", T, float, double, std::int64_t,
                   std::uint64_t) {
  comm::mpi world;
  const int ranks = world.size();
  // Element 0 grows with the rank, element 1 shrinks: max and min come from different ranks.
  const std::vector<T> mine{T(world.rank() + 1), T(ranks - world.rank())};
  T sum_of_ranks_plus_one = T(0);
  for (int r = 0; r < ranks; ++r) sum_of_ranks_plus_one += T(r + 1);

  auto data = mine;
  comm::all_reduce_sum(world, std::span(data));
  CHECK(data == std::vector<T>{sum_of_ranks_plus_one, sum_of_ranks_plus_one});

  data = mine;
  world.iall_reduce_sum(std::span(data)).wait();
  CHECK(data == std::vector<T>{sum_of_ranks_plus_one, sum_of_ranks_plus_one});

  data = mine;
  world.all_reduce_max(std::span(data));
  CHECK(data == std::vector<T>{T(ranks), T(ranks)});

  data = mine;
  world.all_reduce_min(std::span(data));
  CHECK(data == std::vector<T>{T(1), T(1)});
}

TEST_CASE_TEMPLATE("mpi: all_reduce_sum of bf16 and f16 is exact for small integers", T,
                   kfsdp::bf16, kfsdp::f16) {
  comm::mpi world;
  const auto mine = contributions<T>(world.rank(), 40);
  std::vector<T> expected(40, T(0.0F));
  for (int q = 0; q < world.size(); ++q)
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = plus(expected[i], contribution<T>(q, i));

  auto data = mine;
  comm::all_reduce_sum(world, std::span(data));
  CHECK(values_of(data) == values_of(expected));
  data = mine;
  world.iall_reduce_sum(std::span(data)).wait();
  CHECK(values_of(data) == values_of(expected));
}

// The ring's order is documented, so its 16-bit rounding can be checked bit for bit: block b's
// sum starts with x[b+1] = 1 and each other rank adds half an ulp of 1, a tie that rounds back to
// the even 1 every time; the exact sum rounded once would be 1 + 1 ulp at 3 ranks, 1 + 2 at 4.
TEST_CASE_TEMPLATE("mpi: 16-bit sums add in float and round once per addition (the ring)", T,
                   kfsdp::bf16, kfsdp::f16) {
  comm::mpi world;
  world.set_reduce_scatter_ring_min_bytes(1);
  const int ranks = world.size();
  const float ulp_of_one = std::is_same_v<T, kfsdp::bf16> ? 0x1p-7F : 0x1p-10F;
  const auto value = [&](int rank, int block) {
    return T(rank == (block + 1) % ranks ? 1.0F : ulp_of_one / 2);
  };
  constexpr std::size_t count = 3;
  std::vector<T> full_gradient(count * static_cast<std::size_t>(ranks));
  for (std::size_t i = 0; i < full_gradient.size(); ++i)
    full_gradient[i] = value(world.rank(), static_cast<int>(i / count));
  std::vector<T> shard(count);
  comm::reduce_scatter_sum(world, std::span<const T>(full_gradient), std::span(shard));

  const int block = world.rank();
  T rounded_each_time = value((block + 1) % ranks, block);
  float exact = rounded_each_time.to_float();
  for (int step = 2; step <= ranks; ++step) {
    const T addend = value((block + step) % ranks, block);
    rounded_each_time = plus(rounded_each_time, addend);
    exact += addend.to_float();
  }
  for (const T& element : shard) CHECK(element.bits == rounded_each_time.bits);
  if (ranks >= 2) CHECK(rounded_each_time.to_float() == 1.0F);  // every tie went back to 1
  if (ranks >= 3) CHECK(T(exact).bits != rounded_each_time.bits);  // rounding once would not
}

TEST_CASE("mpi: several non-blocking collectives in flight at once") {
  comm::mpi world;
  const auto ranks = static_cast<std::size_t>(world.size());
  const auto shard_a = contributions<float>(world.rank(), 7);
  const auto shard_b = contributions<double>(world.rank(), 2);
  const auto gradient = contributions<double>(world.rank(), 3 * ranks);
  std::vector<float> full_a(7 * ranks);
  std::vector<double> full_b(2 * ranks), gradient_shard(3);
  std::vector<std::int64_t> counter{1};
  std::vector<double> from_last = contributions<double>(world.rank(), 2);

  std::vector<comm::request> in_flight;
  in_flight.push_back(world.iall_gather(shard_a, std::span(full_a)));
  in_flight.push_back(world.iall_gather(shard_b, std::span(full_b)));
  in_flight.push_back(world.ireduce_scatter_sum(gradient, std::span(gradient_shard)));
  in_flight.push_back(world.iall_reduce_sum(std::span(counter)));
  in_flight.push_back(world.ibroadcast(std::span(from_last), world.size() - 1));
  comm::wait_all(in_flight);

  CHECK(full_a == gathered<float>(world.size(), 7));
  CHECK(full_b == gathered<double>(world.size(), 2));
  CHECK(gradient_shard == scattered_sum<double>(world.rank(), world.size(), 3));
  CHECK(counter[0] == world.size());
  CHECK(from_last == contributions<double>(world.size() - 1, 2));
}

TEST_CASE("mpi: a request that goes out of scope waits, leaving no buffer in flight") {
  comm::mpi world;
  std::vector<double> total{1.0};
  { comm::request forgotten = world.iall_reduce_sum(std::span(total)); }
  CHECK(total[0] == doctest::Approx(world.size()));
}

TEST_CASE("mpi: bad arguments throw std::invalid_argument on every rank, before communicating") {
  comm::mpi world;
  const int n = world.size();
  std::vector<float> four(4), wrong(static_cast<std::size_t>(4 * n + 1));
  CHECK_THROWS_WITH_AS(comm::all_gather(world, four, std::span(wrong)),
                       fmt::format("kfsdp::comm::mpi::iall_gather: recv has {} elements, expected "
                                   "size()*send.size() = {}*4 = {}",
                                   4 * n + 1, n, 4 * n)
                           .c_str(),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)world.iall_gather(four, std::span(wrong)),
                       fmt::format("kfsdp::comm::mpi::iall_gather: recv has {} elements, expected "
                                   "size()*send.size() = {}*4 = {}",
                                   4 * n + 1, n, 4 * n)
                           .c_str(),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(comm::reduce_scatter_sum(world, wrong, std::span(four)),
                       fmt::format("kfsdp::comm::mpi::ireduce_scatter_sum: send has {} elements, "
                                   "expected size()*recv.size() = {}*4 = {}",
                                   4 * n + 1, n, 4 * n)
                           .c_str(),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)world.ireduce_scatter_sum(wrong, std::span(four)),
                       fmt::format("kfsdp::comm::mpi::ireduce_scatter_sum: send has {} elements, "
                                   "expected size()*recv.size() = {}*4 = {}",
                                   4 * n + 1, n, 4 * n)
                           .c_str(),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(comm::broadcast(world, std::span(four), n),
                       fmt::format("kfsdp::comm::mpi::ibroadcast: root is {0}, expected 0 <= root "
                                   "< size() = {0}",
                                   n)
                           .c_str(),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)world.ibroadcast(std::span(four), -1),
                       fmt::format("kfsdp::comm::mpi::ibroadcast: root is -1, expected 0 <= root "
                                   "< size() = {}",
                                   n)
                           .c_str(),
                       std::invalid_argument);

  std::vector<float> buffer(static_cast<std::size_t>(8 * n));
  const auto whole = std::span(buffer);
  CHECK_THROWS_WITH_AS(
      comm::all_gather(world, std::span<const float>(whole.subspan(1, 8)), whole),
      doctest::Contains("kfsdp::comm::mpi::iall_gather: send and recv overlap; the only overlap "
                        "allowed is in place"),
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(comm::reduce_scatter_sum(world, std::span<const float>(whole), whole.subspan(0, 8)),
                       "kfsdp::comm::mpi::ireduce_scatter_sum: send and recv overlap; "
                       "reduce_scatter_sum needs separate buffers",
                       std::invalid_argument);
  world.barrier();  // every rank got here without communicating: no collective was left half-made
}

TEST_CASE_TEMPLATE("mpi: iall_gather_parts lands every part as its own all_gather would", T, float, double,
                   kfsdp::bf16, kfsdp::f16) {
  using path = comm::mpi_options::device_memory_path;
  // One message a peer; checked and timed; staged (part by part).
  for (const comm::mpi_options options :
       {comm::mpi_options{}, comm::mpi_options{.check_collectives = true, .timeout = std::chrono::seconds(60)},
        comm::mpi_options{.device_memory = path::staged}}) {
    comm::mpi world(MPI_COMM_WORLD, options);
    comm::any_communicator erased(world);
    kfsdp::test::gather_parts_case<T> direct(world.rank(), world.size()), free(world.rank(), world.size()),
        through_any(world.rank(), world.size());
    comm::request pending = world.iall_gather_parts<T>(direct.parts);
    while (!pending.test()) {}
    direct.check();
    comm::iall_gather_parts<T, Kokkos::HostSpace>(world, free.parts).wait();
    free.check();
    erased.iall_gather_parts<T, Kokkos::HostSpace>(through_any.parts).wait();
    through_any.check();
  }
}

TEST_CASE_TEMPLATE("mpi: iall_gather_parts mixes small parts in one message with big parts on their own", T, float,
                   double, kfsdp::bf16) {
  constexpr std::size_t alone = comm::mpi::gather_alone_min_bytes / sizeof(T);  // the smallest part sent alone
  // Small and big interleaved, one exactly at the threshold, one just under, an empty one, a big
  // one in place; then only big parts (no typed message); then one big part (iall_gather).
  const std::vector<std::vector<std::size_t>> batches = {
      {3, alone + 5, alone - 1, alone, 0, 2 * alone}, {alone, 2 * alone + 3, alone}, {alone + 1}};
  for (const comm::mpi_options options :
       {comm::mpi_options{}, comm::mpi_options{.check_collectives = true, .timeout = std::chrono::seconds(60)}}) {
    comm::mpi world(MPI_COMM_WORLD, options);
    for (const std::vector<std::size_t>& counts : batches) {
      CAPTURE(counts.size());
      kfsdp::test::gather_parts_case<T> batch(world.rank(), world.size(), counts);
      comm::request pending = world.iall_gather_parts<T>(batch.parts);
      while (!pending.test()) {}
      batch.check();
    }
  }
}

TEST_CASE_TEMPLATE("mpi: a gather batch whose sends lie in allocate_shared's memory is read in place", T, float,
                   double, kfsdp::bf16) {
  constexpr std::size_t alone = comm::mpi::gather_alone_min_bytes / sizeof(T);
  // Small, empty and big parts, the last in place (its send in its recv, not in shared memory);
  // then none in place; then a single part.
  const std::vector<std::vector<std::size_t>> batches = {{3, 0, alone + 5, 2}, {4, alone, 1, 0}, {alone + 1, 0}};
  for (const comm::mpi_options options :
       {comm::mpi_options{}, comm::mpi_options{.check_collectives = true, .timeout = std::chrono::seconds(60)}}) {
    comm::mpi world(MPI_COMM_WORLD, options);
    comm::shared_bytes memory = world.allocate_shared(4 * alone * sizeof(T));
    CHECK(memory.empty() == (world.size() == 1));  // the tests' ranks share a node
    if (memory.empty()) continue;
    CHECK(reinterpret_cast<std::uintptr_t>(memory.bytes.data()) % comm::detail::shared_alignment == 0);
    CHECK(std::all_of(memory.bytes.begin(), memory.bytes.end(), [](std::byte b) { return b == std::byte{0}; }));
    const std::span<T> shards(reinterpret_cast<T*>(memory.bytes.data()), memory.bytes.size() / sizeof(T));
    for (const std::vector<std::size_t>& counts : batches) {
      CAPTURE(counts);
      kfsdp::test::gather_parts_case<T> batch(world.rank(), world.size(), counts);
      CHECK_FALSE(world.reads_in_place<T, Kokkos::HostSpace>(batch.parts));  // sends in a vector
      batch.send_from(shards);
      const bool last_in_place = counts.back() > 0;  // its send is its recv's slot
      CHECK(world.reads_in_place<T, Kokkos::HostSpace>(batch.parts) == !last_in_place);
      comm::request pending = world.iall_gather_parts<T>(batch.parts);
      while (!pending.test()) {}
      batch.check();
    }
    // Through any_communicator, and the memory it hands out.
    comm::any_communicator erased(world);
    comm::shared_bytes more = erased.allocate_shared(16 * sizeof(T));
    REQUIRE(more.bytes.size() == 16 * sizeof(T));
    kfsdp::test::gather_parts_case<T> batch(world.rank(), world.size(), {2, 3, 0});
    batch.send_from(std::span<T>(reinterpret_cast<T*>(more.bytes.data()), 16));
    CHECK(world.reads_in_place<T, Kokkos::HostSpace>(batch.parts));
    erased.iall_gather_parts<T, Kokkos::HostSpace>(batch.parts).wait();
    batch.check();
  }
}

TEST_CASE("mpi: shared memory is freed with its last owner, and a batch reading it waits for every rank's copy") {
  comm::mpi world;
  if (world.size() == 1) {
    CHECK(world.allocate_shared(64).empty());  // nobody to share with
    return;
  }
  kfsdp::test::gather_parts_case<double> batch(world.rank(), world.size(), {5, 7, 0});
  {
    comm::shared_bytes memory = world.allocate_shared(12 * sizeof(double));
    batch.send_from(std::span<double>(reinterpret_cast<double*>(memory.bytes.data()), 12));
    REQUIRE(world.reads_in_place<double, Kokkos::HostSpace>(batch.parts));
    comm::request pending = world.iall_gather_parts<double>(batch.parts);
    pending.wait();
    // Every peer has its copy now: overwriting the sends changes nothing already gathered.
    std::fill_n(reinterpret_cast<double*>(memory.bytes.data()), 12, -1.0);
    world.barrier();
    batch.check();
    comm::shared_bytes copy = memory;  // the owner is shared: still alive after `memory` goes
    memory = {};
    CHECK(world.reads_in_place<double, Kokkos::HostSpace>(batch.parts));
  }
  CHECK_FALSE(world.reads_in_place<double, Kokkos::HostSpace>(batch.parts));  // freed on every rank
}

TEST_CASE("mpi: a gather read in place may be tested at any moment on any rank: its tests start no collective") {
  // One rank tests gather A while the others do not, then every rank starts gather B and waits for
  // both: were a test to start a collective (as a barrier once ended a gather), that rank would
  // start A's before B's and the others after it, and MPI would match A's with B's.
  comm::mpi world;
  if (world.size() == 1) return;
  comm::shared_bytes memory = world.allocate_shared(12 * sizeof(double));
  const std::span<double> shards(reinterpret_cast<double*>(memory.bytes.data()), 12);
  kfsdp::test::gather_parts_case<double> first(world.rank(), world.size(), {5, 7, 0});
  kfsdp::test::gather_parts_case<double> second(world.rank(), world.size(), {5, 7, 0});
  first.send_from(shards);
  second.send_from(shards);
  REQUIRE(world.reads_in_place<double, Kokkos::HostSpace>(first.parts));
  for (int round = 0; round < 3 * world.size(); ++round) {
    CAPTURE(round);
    comm::request a = world.iall_gather_parts<double>(first.parts);
    if (world.rank() == round % world.size())
      for (int i = 0; i < 2000 && a.in_flight(); ++i) (void)a.test();
    comm::request b = world.iall_gather_parts<double>(second.parts);
    b.wait();
    a.wait();
    first.check();
    second.check();
  }
}

TEST_CASE("mpi: no shared memory where it is switched off or /dev/shm has no room; gathers then send messages") {
  CHECK(comm::detail::shared_memory_room(0, 4));
  CHECK(comm::detail::shared_memory_room(4096, 2));
  CHECK_FALSE(comm::detail::shared_memory_room(std::uint64_t{1} << 62, 1));  // 4 EiB: no /dev/shm is that big
  CHECK_FALSE(comm::detail::shared_memory_room(std::uint64_t{1} << 62, 64));  // and no overflow to a small sum
  comm::mpi off(MPI_COMM_WORLD, {.shared_memory = false});
  CHECK(off.allocate_shared(64).empty());
  CHECK(off.split(0, off.rank()).allocate_shared(64).empty());  // a split keeps the options
  comm::mpi world;
  CHECK(world.allocate_shared(std::size_t{1} << 62).empty());  // more than the node's shared memory holds
  kfsdp::test::gather_parts_case<float> batch(world.rank(), world.size());
  CHECK_FALSE(world.reads_in_place<float, Kokkos::HostSpace>(batch.parts));
  world.iall_gather_parts<float>(batch.parts).wait();
  batch.check();
}

TEST_CASE("mpi: shared memory dropped while one rank unwinds an exception: no rank hangs in the free") {
  comm::mpi world(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(2)});
  try {
    comm::shared_bytes memory = world.allocate_shared(64);
    if (world.rank() == 0) throw std::runtime_error("rank 0 fails while holding shared memory");
  } catch (const std::runtime_error&) {
    // Rank 0 left its window to MPI_Finalize at once; the others' free gave up after the timeout.
  }
  comm::mpi after;  // the default timeout: rank 0 waits here while the others give up on the free
  std::vector<double> one{1.0};
  comm::all_reduce_sum(after, std::span(one));  // every rank goes on
  CHECK(one[0] == double(world.size()));
}

TEST_CASE("mpi: a rank reading in place against one sending throws collective_mismatch on every rank") {
  comm::mpi world(MPI_COMM_WORLD, {.check_collectives = true, .timeout = std::chrono::seconds(60)});
  comm::shared_bytes memory = world.allocate_shared(8 * sizeof(float));
  if (memory.empty()) return;
  kfsdp::test::gather_parts_case<float> batch(world.rank(), world.size(), {3, 4, 0});
  if (world.rank() == 0) batch.send_from(std::span<float>(reinterpret_cast<float*>(memory.bytes.data()), 8));
  try {
    world.iall_gather_parts<float>(batch.parts).wait();
    FAIL("expected collective_mismatch");
  } catch (const comm::mpi::collective_mismatch& e) {
    CHECK(std::string(e.what()).find("all_gather_parts (in shared memory)") != std::string::npos);
  }
}

TEST_CASE("mpi: gather batches in flight with ring reduce-scatters never cross") {
  comm::mpi world;
  world.set_reduce_scatter_ring_min_bytes(0);  // every reduce-scatter point-to-point, as the batches
  const auto n = static_cast<std::size_t>(world.size());
  kfsdp::test::gather_parts_case<double> first(world.rank(), world.size()), second(world.rank(), world.size());
  const auto send = contributions<double>(world.rank(), 6 * n);
  std::vector<double> summed(6);
  std::vector<comm::request> pending;
  pending.push_back(world.iall_gather_parts<double>(first.parts));
  pending.push_back(world.ireduce_scatter_sum(std::span<const double>(send), std::span(summed)));
  pending.push_back(world.iall_gather_parts<double>(second.parts));
  for (std::size_t i = pending.size(); i-- > 0;) pending[i].wait();  // the last first
  first.check();
  second.check();
  CHECK(summed == scattered_sum<double>(world.rank(), world.size(), 6));
}

TEST_CASE("mpi: bad gather parts throw std::invalid_argument naming the part, before communicating") {
  comm::mpi world;
  const int n = world.size();
  std::vector<float> shard(4), buffer(static_cast<std::size_t>(8 * n + 1));
  const auto all = std::span(buffer);
  using part = comm::gather_part<float, Kokkos::HostSpace>;
  const auto host = [](auto elements) { return comm::host_span<typename decltype(elements)::element_type>(elements); };
  const std::span<const float> two = std::span<const float>(shard).subspan(0, 2), other_two = std::span<const float>(shard).subspan(2, 2);
  // parts[1]'s recv one element long.
  std::vector<part> parts = {{host(two), host(all.subspan(0, 2 * n))}, {host(other_two), host(all.subspan(2 * n, 2 * n + 1))}};
  const std::string wrong_size = fmt::format("kfsdp::comm::mpi::iall_gather_parts: recv has {} elements, expected "
                                             "size()*send.size() = {}*2 = {} (parts[1])", 2 * n + 1, n, 2 * n);
  CHECK_THROWS_WITH_AS((void)world.iall_gather_parts<float>(parts), wrong_size.c_str(), std::invalid_argument);
  // parts[1]'s recv starts inside parts[0]'s.
  parts[1].recv = host(all.subspan(2 * n - 1, 2 * n));
  CHECK_THROWS_WITH_AS((void)world.iall_gather_parts<float>(parts),
                       "kfsdp::comm::mpi::iall_gather_parts: parts[1].recv overlaps parts[0].recv; each part "
                       "needs a recv of its own",
                       std::invalid_argument);
  // parts[1]'s send lies in parts[0]'s recv.
  parts[1] = {host(std::span<const float>(all.subspan(1, 2))), host(all.subspan(4 * n, 2 * n))};
  CHECK_THROWS_WITH_AS((void)world.iall_gather_parts<float>(parts),
                       "kfsdp::comm::mpi::iall_gather_parts: parts[1].send overlaps parts[0].recv; each part "
                       "needs a recv of its own",
                       std::invalid_argument);
  // The same checks on the part-by-part path.
  comm::mpi staged(MPI_COMM_WORLD, {.device_memory = comm::mpi_options::device_memory_path::staged});
  CHECK_THROWS_WITH_AS((void)staged.iall_gather_parts<float>(parts),
                       doctest::Contains("parts[1].send overlaps parts[0].recv"), std::invalid_argument);
  world.barrier();  // every rank got here without communicating
}

namespace {
// A bucket's gradients as ireduce_scatter_sum_parts takes them: part k's send is its own buffer of
// n*counts[k] elements, its recv a slice of one shard (the parts adjacent, as in a gradient shard).
template <class T>
struct reduce_parts_case {
  std::vector<std::size_t> counts;
  std::vector<std::vector<T>> sends;
  std::vector<T> shard;
  std::vector<comm::reduce_scatter_part<T, Kokkos::HostSpace>> parts;

  reduce_parts_case(int rank, int ranks, std::vector<std::size_t> part_counts, bool inexact = false)
      : counts(std::move(part_counts)) {
    const auto n = static_cast<std::size_t>(ranks);
    shard.assign(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), T(-1));
    std::size_t at = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) {
      std::vector<T> send = contributions<T>(rank, n * counts[k]);
      if constexpr (std::is_floating_point_v<T>)  // values whose sums round: the association shows
        if (inexact)
          for (std::size_t i = 0; i < send.size(); ++i) send[i] = T(1) / T(3 + 7 * rank + int((i + k) % 1013));
      sends.push_back(std::move(send));
      parts.push_back({comm::host_span<const T>(std::span<const T>(sends.back())),
                       comm::host_span<T>(std::span(shard).subspan(at, counts[k]))});
      at += counts[k];
    }
  }
  // What one ireduce_scatter_sum a part gives, with the same factor.
  std::vector<T> part_by_part(comm::mpi& world, comm::scale_type<T> factor) const {
    std::vector<T> want(shard.size(), T(-1));
    std::size_t at = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) {
      comm::ireduce_scatter_sum<T, Kokkos::HostSpace>(world, parts[k].send,
                                                      comm::host_span<T>(std::span(want).subspan(at, counts[k])), factor)
          .wait();
      at += counts[k];
    }
    return want;
  }
};
}  // namespace

TEST_CASE_TEMPLATE("mpi: ireduce_scatter_sum_parts gives every part what its own ireduce_scatter_sum gives", T, float,
                   double, kfsdp::bf16, kfsdp::f16) {
  const std::size_t segment = 256 * 1024 / sizeof(T);
  using path = comm::mpi_options::device_memory_path;
  for (const comm::mpi_options options :
       {comm::mpi_options{}, comm::mpi_options{.check_collectives = true, .timeout = std::chrono::seconds(60)},
        comm::mpi_options{.device_memory = path::staged}}) {
    comm::mpi world(MPI_COMM_WORLD, options);
    comm::any_communicator erased(world);
    // The ring (a part across a segment boundary, an empty part, segments of one part each: sent
    // contiguous) and the packed path.
    for (const std::size_t ring_min_bytes : {std::size_t{1}, SIZE_MAX}) {
      CAPTURE(ring_min_bytes);
      world.set_reduce_scatter_ring_min_bytes(ring_min_bytes);
      for (const auto& counts : {std::vector<std::size_t>{3, 0, 5, 1}, std::vector<std::size_t>{2, segment + 5, 7},
                                 std::vector<std::size_t>{segment, segment, 3}})
        for (const comm::scale_type<T> factor : {comm::scale_type<T>(1), comm::scale_type<T>(0.5)}) {
          CAPTURE(counts.size());
          CAPTURE(double(factor));
          reduce_parts_case<T> direct(world.rank(), world.size(), counts), through_any(world.rank(), world.size(), counts);
          const std::vector<T> want = direct.part_by_part(world, factor);
          comm::request pending = world.ireduce_scatter_sum_parts<T>(direct.parts, factor);
          while (!pending.test()) {}
          CHECK(values_of(direct.shard) == values_of(want));
          erased.ireduce_scatter_sum_parts<T, Kokkos::HostSpace>(through_any.parts, factor).wait();
          CHECK(values_of(through_any.shard) == values_of(want));
        }
    }
  }
}

TEST_CASE("mpi: the ring over parts sums in the order of ireduce_scatter_sum's ring, bit for bit") {
  comm::mpi world;
  world.set_reduce_scatter_ring_min_bytes(1);
  const std::size_t segment = 256 * 1024 / sizeof(float);
  reduce_parts_case<float> batch(world.rank(), world.size(), {segment - 3, 11, segment + 2}, /*inexact=*/true);
  const std::vector<float> want = batch.part_by_part(world, 0.25f);
  world.ireduce_scatter_sum_parts<float>(batch.parts, 0.25f).wait();
  CHECK(batch.shard == want);
}

TEST_CASE("mpi: bad reduce-scatter parts throw std::invalid_argument naming the part, before communicating") {
  comm::mpi world;
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<float> send(4 * n), shard(4);
  using part = comm::reduce_scatter_part<float, Kokkos::HostSpace>;
  const auto sends = std::span<const float>(send);
  const auto recvs = std::span(shard);
  std::vector<part> parts = {{comm::host_span<const float>(sends.subspan(0, 2 * n)), comm::host_span<float>(recvs.subspan(0, 2))},
                             {comm::host_span<const float>(sends.subspan(2 * n, 2 * n)), comm::host_span<float>(recvs.subspan(2, 1))}};
  const std::string wrong_size = fmt::format("kfsdp::comm::mpi::ireduce_scatter_sum_parts: send has {} elements, "
                                             "expected size()*recv.size() = {}*1 = {} (parts[1])", 2 * n, n, n);
  CHECK_THROWS_WITH_AS((void)world.ireduce_scatter_sum_parts<float>(parts), wrong_size.c_str(), std::invalid_argument);
  // parts[1]'s recv is parts[0]'s.
  parts[1].recv = comm::host_span<float>(recvs.subspan(1, 2));
  CHECK_THROWS_WITH_AS((void)world.ireduce_scatter_sum_parts<float>(parts),
                       "kfsdp::comm::mpi::ireduce_scatter_sum_parts: parts[1].recv overlaps parts[0].recv; each "
                       "part needs a recv of its own",
                       std::invalid_argument);
  // parts[1]'s send is parts[0]'s recv.
  parts[1] = {comm::host_span<const float>(std::span<const float>(shard).subspan(0, n)), comm::host_span<float>(recvs.subspan(3, 1))};
  if (n <= 2)
    CHECK_THROWS_WITH_AS((void)world.ireduce_scatter_sum_parts<float>(parts),
                         "kfsdp::comm::mpi::ireduce_scatter_sum_parts: parts[1].send overlaps parts[0].recv; each "
                         "part needs a recv of its own",
                         std::invalid_argument);
  world.barrier();  // every rank got here without communicating
}

TEST_CASE("mpi: a count above INT_MAX is an error, not a silent overflow") {
  comm::mpi world;
  std::vector<float> small(1);
  // The span is never read: the count is checked before MPI is called.
  const std::span<float> too_long(small.data(), std::size_t{INT_MAX} + 1);
  CHECK_THROWS_WITH_AS(comm::broadcast(world, too_long, 0),
                       doctest::Contains("kfsdp::comm::mpi::ibroadcast: data has 2147483648 "
                                         "elements, expected at most INT_MAX = 2147483647"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)world.iall_reduce_sum(too_long),
                       doctest::Contains("kfsdp::comm::mpi::iall_reduce_sum: data has 2147483648 "
                                         "elements"),
                       std::invalid_argument);
  if (world.size() == 1) {  // size()*send.size() only matches the long recv at one rank
    CHECK_THROWS_WITH_AS(comm::all_gather(world, std::span<const float>(too_long), too_long),
                         doctest::Contains("kfsdp::comm::mpi::iall_gather: send has 2147483648 "
                                           "elements, expected at most INT_MAX"),
                         std::invalid_argument);
  }
}

TEST_CASE("mpi: MPI error codes become exceptions carrying MPI_Error_string") {
  try {
    comm::mpi::check(MPI_ERR_COUNT, "kfsdp::comm::mpi::all_gather", "MPI_Allgather");
    FAIL("check(MPI_ERR_COUNT) did not throw");
  } catch (const comm::mpi::error& error) {
    CHECK(error.code() == MPI_ERR_COUNT);
    const std::string text = error.what();
    CHECK(text.find("kfsdp::comm::mpi::all_gather: MPI_Allgather failed: ") == 0);
    CHECK(text.find(comm::detail::mpi_error_text(MPI_ERR_COUNT)) != std::string::npos);
  }
  CHECK_NOTHROW(comm::mpi::check(MPI_SUCCESS, "f", "MPI_Foo"));

  // The duplicate returns errors instead of aborting: a raw MPI call with a bad root comes back.
  comm::mpi world;
  int value = 0;
  const int code = MPI_Bcast(&value, 1, MPI_INT, world.size() + 7, world.native());
  CHECK(code != MPI_SUCCESS);
}

TEST_CASE("mpi: check_agreement passes when ranks agree") {
  comm::mpi world;
  CHECK_NOTHROW(comm::check_agreement(world, 0x5eedULL, "the shard plan"));
  CHECK_NOTHROW(comm::check_agreement(world, 0, "zero"));
  CHECK_NOTHROW(comm::check_agreement(world, ~0ULL, "all ones"));
}

TEST_CASE("mpi: check_agreement throws on EVERY rank when ranks disagree, without hanging") {
  comm::mpi world;
  if (world.size() == 1) return;  // one rank cannot disagree with itself
  // Only the last rank differs: the others must learn of it too.
  const std::uint64_t fingerprint = world.rank() == world.size() - 1 ? 0x2aULL : 0x1fULL;
  CHECK_THROWS_WITH_AS(comm::check_agreement(world, fingerprint, "the shard plan"),
                       fmt::format("ranks disagree on the shard plan: fingerprints range from 0x1f "
                                   "to 0x2a; this rank ({} of {}) has {:#x}",
                                   world.rank(), world.size(), fingerprint)
                           .c_str(),
                       std::runtime_error);
  // Extremes of the range still compare correctly (max and ~min in one reduction).
  const std::uint64_t extreme = world.rank() == 0 ? 0ULL : ~0ULL;
  CHECK_THROWS_WITH_AS(comm::check_agreement(world, extreme, "bucket sizes"),
                       doctest::Contains("ranks disagree on bucket sizes: fingerprints range from "
                                         "0x0 to 0xffffffffffffffff"),
                       std::runtime_error);
  world.barrier();
}

TEST_CASE("mpi: with check_collectives, every collective works as without (and with a timeout)") {
  for (const comm::mpi_options options :
       {comm::mpi_options{.check_collectives = true, .timeout = std::chrono::seconds(0)},
        comm::mpi_options{.check_collectives = true, .timeout = std::chrono::seconds(60)},
        comm::mpi_options{.check_collectives = false, .timeout = std::chrono::seconds(60)}}) {
    comm::mpi world(MPI_COMM_WORLD, options);
    const int ranks = world.size();
    const auto mine = contributions<double>(world.rank(), 3);
    std::vector<double> all(3 * static_cast<std::size_t>(ranks));
    comm::all_gather(world, std::span<const double>(mine), std::span(all));
    CHECK(all == gathered<double>(ranks, 3));
    world.iall_gather(std::span<const double>(mine), std::span(all)).wait();
    CHECK(all == gathered<double>(ranks, 3));
    for (const std::size_t ring_min : {std::size_t{0}, std::size_t{1} << 30}) {  // ring, then MPI's
      world.set_reduce_scatter_ring_min_bytes(ring_min);
      const auto send = contributions<double>(world.rank(), 5 * static_cast<std::size_t>(ranks));
      std::vector<double> recv(5);
      comm::reduce_scatter_sum(world, std::span<const double>(send), std::span(recv));
      CHECK(recv == scattered_sum<double>(world.rank(), ranks, 5));
      std::fill(recv.begin(), recv.end(), 0.0);
      world.ireduce_scatter_sum(std::span<const double>(send), std::span(recv)).wait();
      CHECK(recv == scattered_sum<double>(world.rank(), ranks, 5));
    }
    std::vector<float> value{float(world.rank() == ranks - 1 ? 7 : 0)};
    comm::broadcast(world, std::span(value), ranks - 1);
    CHECK(value[0] == 7.0f);
    std::vector<std::int64_t> extreme{world.rank()};
    world.all_reduce_max(std::span(extreme));
    CHECK(extreme[0] == ranks - 1);
    world.all_reduce_min(std::span(extreme));
    CHECK(extreme[0] == ranks - 1);
    std::vector<double> sum{1.0};
    world.iall_reduce_sum(std::span(sum)).wait();
    CHECK(sum[0] == double(ranks));
    world.barrier();
  }
}

TEST_CASE("mpi: ranks calling different collectives throw collective_mismatch on every rank, naming each call") {
  comm::mpi world(MPI_COMM_WORLD, {.check_collectives = true});
  if (world.size() == 1) return;  // one rank always agrees with itself
  const std::string this_rank = fmt::format("this is rank {} of {}", world.rank(), world.size());
  const std::string others = world.size() == 2 ? "rank 1" : fmt::format("ranks 1, {}", world.size() == 3 ? "2" : "2, 3");
  std::vector<float> shard(2), full(2 * static_cast<std::size_t>(world.size()));
  std::vector<double> data(3);
  const auto mismatched = [&] {
    if (world.rank() == 0) comm::all_gather(world, std::span<const float>(shard), std::span(full));
    else comm::broadcast(world, std::span(data), 0);
  };
  CHECK_THROWS_WITH_AS(mismatched(),
      doctest::Contains(fmt::format("the ranks called different collectives (checked call 1 on this "
                                    "communicator): all_gather(2 elements of 4 bytes per rank) on "
                                    "rank 0; broadcast(3 elements of 8 bytes, root 0) on {}; {}",
                                    others, this_rank).c_str()),
      comm::mpi::collective_mismatch);
  // The same collective with other sizes (a rank-dependent count): found too, nothing sent.
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world.rank() == 0 ? 1 : 2));
  CHECK_THROWS_WITH_AS(comm::all_reduce_sum(world, std::span(counts)),
      doctest::Contains(fmt::format("all_reduce_sum(1 elements of 8 bytes) on rank 0; "
                                    "all_reduce_sum(2 elements of 8 bytes) on {}", others).c_str()),
      comm::mpi::collective_mismatch);
  CHECK_THROWS_AS((void)world.iall_reduce_sum(std::span(counts)), comm::mpi::collective_mismatch);
  // Two element types of the same size: bf16 on rank 0, f16 elsewhere.
  std::vector<kfsdp::bf16> brain(2, kfsdp::bf16(1.0f));
  std::vector<kfsdp::f16> half(2, kfsdp::f16(1.0f));
  const auto mixed_halves = [&] {
    if (world.rank() == 0) comm::all_reduce_sum(world, std::span(brain));
    else comm::all_reduce_sum(world, std::span(half));
  };
  CHECK_THROWS_WITH_AS(mixed_halves(),
      doctest::Contains(fmt::format("all_reduce_sum(2 elements of 2 bytes (bf16)) on rank 0; "
                                    "all_reduce_sum(2 elements of 2 bytes (f16)) on {}", others).c_str()),
      comm::mpi::collective_mismatch);
  // A gather batch against one all-gather of the same elements.
  kfsdp::test::gather_parts_case<float> batch(world.rank(), world.size());
  std::vector<float> nine(9), all_nine(9 * static_cast<std::size_t>(world.size()));
  const auto batch_or_one = [&] {
    if (world.rank() == 0) (void)world.iall_gather_parts<float>(batch.parts);
    else comm::all_gather(world, std::span<const float>(nine), std::span(all_nine));
  };
  CHECK_THROWS_WITH_AS(batch_or_one(),
      doctest::Contains(fmt::format("all_gather_parts(9 elements of 4 bytes per rank in 4 parts) on rank 0; "
                                    "all_gather(9 elements of 4 bytes per rank) on {}", others).c_str()),
      comm::mpi::collective_mismatch);
  // Nothing was left in flight: the communicator goes on.
  CHECK_NOTHROW(world.barrier());
}

TEST_CASE("mpi: a collective that another rank does not call throws mpi::timeout instead of hanging") {
  comm::mpi world;
  if (world.size() == 1) return;  // nothing to wait for
  {
    comm::mpi timed(MPI_COMM_WORLD, {.check_collectives = false, .timeout = std::chrono::milliseconds(300)});
    if (world.rank() == 0) {
      const auto started = std::chrono::steady_clock::now();
      CHECK_THROWS_WITH_AS(timed.barrier(),
          doctest::Contains("kfsdp::comm::mpi::barrier: not complete after 0.3 s "
                            "(mpi_options::timeout) on rank 0 of"),
          comm::mpi::timeout);
      CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
      world.barrier();
      world.barrier();  // MPI progresses rank 0's abandoned barrier meanwhile
    } else {
      world.barrier();  // rank 0 has given up on its barrier
      timed.barrier();  // completes the abandoned one, so the test leaves nothing pending
      world.barrier();
    }
  }
  int value = 1;
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(value == world.size());
}

TEST_CASE("mpi: a rank that skips a collective: the others' call throws mpi::timeout naming it") {
  comm::mpi world;
  if (world.size() == 1) return;  // nothing to skip
  static double sum[1] = {1.0};  // outlives rank 0's abandoned call, which completes in the background
  {
    comm::mpi timed(MPI_COMM_WORLD, {.check_collectives = false, .timeout = std::chrono::seconds(1)});
    if (world.rank() == 0) {
      CHECK_THROWS_WITH_AS(comm::all_reduce_sum(timed, std::span<double>(sum)),
          doctest::Contains("kfsdp::comm::mpi::iall_reduce_sum: not complete after 1 s "
                            "(mpi_options::timeout) on rank 0 of"),
          comm::mpi::timeout);
      world.barrier();
      world.barrier();
    } else {
      world.barrier();  // the skipped call, made late so that the test leaves nothing pending
      comm::all_reduce_sum(timed, std::span<double>(sum));
      CHECK(sum[0] == double(world.size()));
      world.barrier();
    }
  }
}

TEST_CASE("mpi: a blocking collective that times out leaves none of the caller's memory in MPI's hands") {
  comm::mpi world;
  if (world.size() == 1) return;  // nothing to wait for
  constexpr std::size_t count = 512;
  {
    comm::mpi timed(MPI_COMM_WORLD, {.check_collectives = false, .timeout = std::chrono::milliseconds(50)});
    if (world.rank() == 0) {
      const double* abandoned = nullptr;
      {
        std::vector<double> sums(count, 1.0);  // freed when the call has thrown
        abandoned = sums.data();
        CHECK_THROWS_AS(comm::all_reduce_sum(timed, std::span(sums)), comm::mpi::timeout);
      }
      std::vector<double> fresh(count, 7.0);  // often where `sums` was: the late peers must not write here
      world.barrier();                        // the others join the abandoned all-reduce now
      world.barrier();
      for (int i = 0; i < 100; ++i) {  // progress, so that MPI finishes the abandoned call on this rank
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world.native(), &flag, MPI_STATUS_IGNORE);
      }
      MESSAGE("the fresh buffer ", (fresh.data() == abandoned ? "reuses" : "does not reuse"), " the abandoned one");
      CHECK(std::count(fresh.begin(), fresh.end(), 7.0) == std::ptrdiff_t(count));
    } else {
      world.barrier();  // rank 0 has given up
      std::vector<double> sums(count, 1.0);
      comm::all_reduce_sum(timed, std::span(sums));  // completes with rank 0's abandoned contribution
      CHECK(sums[0] == double(world.size()));
      world.barrier();
    }
  }
  int value = 1;
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(value == world.size());
}

TEST_CASE("mpi: split into groups of two; collectives and agreement stay inside each group") {
  comm::mpi world;
  const int color = world.rank() / 2;  // at 4 ranks: {0, 1} and {2, 3}
  comm::mpi group = world.split(color, world.rank());
  const int group_size = std::min(2, world.size() - 2 * color);
  CHECK(group.size() == group_size);
  CHECK(group.rank() == world.rank() % 2);
  CHECK(group.native() != world.native());

  std::vector<std::int64_t> sum{world.rank()};
  comm::all_reduce_sum(group, std::span(sum));
  CHECK(sum[0] == (group_size == 2 ? 4 * color + 1 : 2 * color));

  std::vector<float> gathered_ranks(static_cast<std::size_t>(group_size));
  comm::all_gather(group, std::vector<float>{float(world.rank())}, std::span(gathered_ranks));
  for (int q = 0; q < group_size; ++q) CHECK(gathered_ranks[std::size_t(q)] == float(2 * color + q));

  const std::vector<kfsdp::bf16> ones(static_cast<std::size_t>(group_size), kfsdp::bf16(1.0F));
  std::vector<kfsdp::bf16> reduced(1);
  group.ireduce_scatter_sum(ones, std::span(reduced)).wait();
  CHECK(reduced[0].to_float() == float(group_size));

  // The groups hold different fingerprints: each agrees inside itself.
  CHECK_NOTHROW(comm::check_agreement(group, std::uint64_t(color), "the group's color"));
  if (group_size == 2) {
    CHECK_THROWS_WITH_AS(comm::check_agreement(group, std::uint64_t(world.rank()), "the rank"),
                         doctest::Contains(fmt::format("this rank ({} of 2)", group.rank()).c_str()),
                         std::runtime_error);
  }
  if (world.size() >= 4) {
    CHECK_THROWS_AS(comm::check_agreement(world, std::uint64_t(color), "the group's color"),
                    std::runtime_error);
  }
  world.barrier();
}

TEST_CASE("mpi: split orders by key, keeps the options, and frees its communicator") {
  comm::mpi world(MPI_COMM_WORLD, {.check_collectives = true, .timeout = std::chrono::seconds(60)});
  world.set_reduce_scatter_ring_min_bytes(4321);
  MPI_Comm native = MPI_COMM_NULL;
  {
    comm::mpi reversed = world.split(0, -world.rank());
    CHECK(reversed.size() == world.size());
    CHECK(reversed.rank() == world.size() - 1 - world.rank());
    CHECK(reversed.options().check_collectives);
    CHECK(reversed.options().timeout.count() == 60.0);
    CHECK(reversed.reduce_scatter_ring_min_bytes() == 4321);
    std::vector<double> from_root{double(world.rank())};
    comm::broadcast(reversed, std::span(from_root), 0);  // the group's rank 0 is the last rank
    CHECK(from_root[0] == double(world.size() - 1));
    native = reversed.native();
    comm::mpi moved = std::move(reversed);
    CHECK(moved.native() == native);
  }
  CHECK(native != MPI_COMM_NULL);
  CHECK_THROWS_WITH_AS((void)world.split(-1, 0),
                       "kfsdp::comm::mpi::split: color is -1, expected color >= 0 (every rank "
                       "joins a group)",
                       std::invalid_argument);
}

TEST_CASE("mpi: split_shared gives the ranks of this node") {
  comm::mpi world;
  comm::mpi node = world.split_shared();
  CHECK(node.size() == world.ranks_on_node());
  CHECK(node.size() == world.size());  // the tests run on one machine
  CHECK(node.rank() == world.rank());
  std::vector<kfsdp::f16> one{kfsdp::f16(1.0F)};
  comm::all_reduce_sum(node, std::span(one));
  CHECK(one[0].to_float() == float(node.size()));
}

TEST_CASE("mpi: waits yield their CPU from the start only where the node runs more ranks than CPUs") {
  CHECK(comm::detail::oversubscribed(3, 2));
  CHECK(comm::detail::oversubscribed(1, 0));  // no CPUs counted: yield, the safe side
  CHECK_FALSE(comm::detail::oversubscribed(2, 2));
  CHECK_FALSE(comm::detail::oversubscribed(1, 16));
  comm::mpi world;
  const int ranks_here = world.ranks_on_node();
  const auto cpus_here = static_cast<int>(std::thread::hardware_concurrency());
  // More ranks than the machine's CPUs: oversubscribed whatever the masks say.
  if (cpus_here > 0 && ranks_here > cpus_here) CHECK(world.yields_while_waiting());
  // Every rank free to run anywhere (mpirun --bind-to none, or one rank): exactly the rule.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  int unbound = CPU_COUNT(&mine) == cpus_here ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &unbound, 1, MPI_INT, MPI_MIN, world.native());
  if (unbound == 1) CHECK(world.yields_while_waiting() == (ranks_here > cpus_here));
  CHECK(world.split(0, world.rank()).yields_while_waiting() == world.yields_while_waiting());
  // Either way a wait completes (the timeouts are tested below).
  std::vector<double> sum{1.0};
  comm::all_reduce_sum(world, std::span(sum));
  CHECK(sum[0] == double(world.size()));
}

TEST_CASE("mpi_options: the defaults come from KFSDP_CHECK_COLLECTIVES and KFSDP_COLLECTIVE_TIMEOUT") {
  ::unsetenv("KFSDP_COLLECTIVE_TIMEOUT");
  CHECK(comm::mpi_options{}.timeout.count() == 600.0);  // on unless asked otherwise, as PyTorch's 10 minutes
  ::setenv("KFSDP_COLLECTIVE_TIMEOUT", "0", 1);
  CHECK(comm::mpi_options{}.timeout.count() == 0.0);  // 0: none
  ::setenv("KFSDP_CHECK_COLLECTIVES", "1", 1);
  ::setenv("KFSDP_COLLECTIVE_TIMEOUT", "2.5", 1);
  const comm::mpi_options from_environment;
  CHECK(from_environment.check_collectives);
  CHECK(from_environment.timeout.count() == 2.5);
  // Strict (kfsdp::parse_real) and at least 1 ms: text, a tail, a sign and a tiny value are refused alike.
  for (const char* bad : {"soon", "2.5s", "-1", "1e-300", "0.0009", "nan", "inf", "1e10"}) {
    ::setenv("KFSDP_COLLECTIVE_TIMEOUT", bad, 1);
    CHECK_THROWS_WITH_AS((void)comm::mpi_options{},
        fmt::format("KFSDP_COLLECTIVE_TIMEOUT is '{}', expected 0 (no timeout) or seconds from 0.001 to 1e+09", bad).c_str(),
        std::invalid_argument);
  }
  ::setenv("KFSDP_COLLECTIVE_TIMEOUT", "0.001", 1);
  CHECK(comm::mpi_options{}.timeout.count() == 0.001);
  ::unsetenv("KFSDP_COLLECTIVE_TIMEOUT");
  CHECK_THROWS_WITH_AS(comm::mpi(MPI_COMM_WORLD, {.timeout = std::chrono::duration<double>(1e-300)}),
      "kfsdp::comm::mpi::mpi: options.timeout is 1e-300 s, expected 0 (no timeout) or from 0.001 to 1e+09 s",
      std::invalid_argument);
  ::setenv("KFSDP_COLLECTIVE_TIMEOUT", "0", 1);
  ::setenv("KFSDP_CHECK_COLLECTIVES", "yes", 1);
  CHECK_THROWS_WITH_AS((void)comm::mpi_options{},
      "KFSDP_CHECK_COLLECTIVES is 'yes', expected 1, on, 0 or off", std::invalid_argument);
  ::unsetenv("KFSDP_CHECK_COLLECTIVES");
  ::unsetenv("KFSDP_COLLECTIVE_TIMEOUT");
  CHECK(comm::mpi_options{}.shared_memory);  // on unless asked otherwise
  ::setenv("KFSDP_SHARED_MEMORY", "off", 1);
  CHECK_FALSE(comm::mpi_options{}.shared_memory);
  ::setenv("KFSDP_SHARED_MEMORY", "2", 1);
  CHECK_THROWS_WITH_AS((void)comm::mpi_options{}, "KFSDP_SHARED_MEMORY is '2', expected 1, on, 0 or off",
                       std::invalid_argument);
  ::unsetenv("KFSDP_SHARED_MEMORY");
}

TEST_CASE("mpi::environment: a second guard finds MPI running and leaves it running") {
  {
    comm::mpi::environment nested;
    CHECK_FALSE(nested.owns_mpi());
    CHECK(nested.thread_level() >= MPI_THREAD_FUNNELED);
  }
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  CHECK(initialised == 1);
  CHECK(finalised == 0);
}

namespace {
// Rank `from`'s block for rank `to` in an all-to-all: small integers, exact in bf16 and f16.
template <class T>
std::vector<T> all_to_all_send(int from, int ranks, std::size_t block) {
  std::vector<T> send;
  for (int to = 0; to < ranks; ++to)
    for (std::size_t i = 0; i < block; ++i) send.push_back(T(float(16 * from + 4 * to + int(i % 4))));
  return send;
}
}  // namespace

TEST_CASE_TEMPLATE("mpi: iall_to_all gives rank r block r of every rank's send, in rank order", T, float, double,
                   kfsdp::bf16, kfsdp::f16) {
  comm::mpi world;
  const int n = world.size(), r = world.rank();
  constexpr std::size_t block = 3;
  const std::vector<T> send = all_to_all_send<T>(r, n, block);
  std::vector<T> expected;
  for (int from = 0; from < n; ++from) {
    const std::vector<T> theirs = all_to_all_send<T>(from, n, block);
    expected.insert(expected.end(), theirs.begin() + std::ptrdiff_t(std::size_t(r) * block),
                    theirs.begin() + std::ptrdiff_t(std::size_t(r + 1) * block));
  }
  std::vector<T> recv(send.size(), T(-1));
  comm::all_to_all(world, send, std::span(recv));
  CHECK(values_of(recv) == values_of(expected));
  // Non-blocking, and through any_communicator (the engine's type).
  comm::any_communicator any(world);
  std::fill(recv.begin(), recv.end(), T(-1));
  comm::request pending = any.iall_to_all(std::span<const T>(send), std::span(recv));
  while (!pending.test()) {
  }
  CHECK(values_of(recv) == values_of(expected));
  // Empty blocks are fine.
  std::vector<T> none;
  comm::all_to_all(world, none, std::span(none));
}

TEST_CASE("mpi: bad all_to_all arguments throw std::invalid_argument on every rank, before communicating") {
  comm::mpi world;
  const int n = world.size();
  std::vector<float> send(static_cast<std::size_t>(2 * n)), short_recv(static_cast<std::size_t>(2 * n - 1));
  CHECK_THROWS_WITH_AS(comm::all_to_all(world, send, std::span(short_recv)),
                       fmt::format("kfsdp::comm::mpi::iall_to_all: recv has {} elements, expected send.size() = {}",
                                   2 * n - 1, 2 * n)
                           .c_str(),
                       std::invalid_argument);
  if (n > 1) {
    std::vector<float> odd(static_cast<std::size_t>(2 * n + 1)), odd_recv(odd.size());
    CHECK_THROWS_WITH_AS((void)world.iall_to_all(odd, std::span(odd_recv)),
                         fmt::format("kfsdp::comm::mpi::iall_to_all: send has {} elements, expected a multiple of "
                                     "size() = {} (one block a rank)",
                                     2 * n + 1, n)
                             .c_str(),
                         std::invalid_argument);
  }
  CHECK_THROWS_AS((void)world.iall_to_all(std::span<const float>(send), std::span(send)), std::invalid_argument);
  world.barrier();  // nothing was sent: the next collective matches
}

TEST_CASE_TEMPLATE(
    "mpi: an all-reduce sum of two ranks (one exchange) gives MPI_Allreduce's bits on both, NaN "
    "included, several in flight",
    T, float, double, kfsdp::bf16) {
  comm::mpi world;
  comm::mpi pair = world.split(world.rank() / 2, world.rank());  // at 3 ranks, rank 2 alone
  constexpr std::size_t n = 1000;
  std::vector<std::vector<T>> sums(3), wanted(3);
  std::vector<comm::request> in_flight;
  for (std::size_t k = 0; k < sums.size(); ++k) {
    for (std::size_t i = 0; i < n; ++i)  // values whose sums round
      sums[k].push_back(T(float(std::sin(double(i + k * n) + 0.37 * world.rank()) * (1 + double(i % 5)))));
    if (world.rank() % 2 == 0) sums[k][k] = T(std::numeric_limits<float>::quiet_NaN());
    wanted[k] = sums[k];
    MPI_Allreduce(MPI_IN_PLACE, wanted[k].data(), int(n), comm::detail::mpi_datatype<T>(),
                  comm::detail::sum_operation<T>(), pair.native());
  }
  for (auto& values : sums) in_flight.push_back(pair.iall_reduce_sum(std::span(values)));
  for (std::size_t k = sums.size(); k-- > 0;) in_flight[k].wait();  // any order
  for (std::size_t k = 0; k < sums.size(); ++k) {
    CAPTURE(k);
    CHECK(float(sums[k][k]) != float(sums[k][k]));  // NaN
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i)
      differ += i != k && std::memcmp(&sums[k][i], &wanted[k][i], sizeof(T)) != 0;
    CHECK(differ == 0);
  }
}
