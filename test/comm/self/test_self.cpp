// Tests for include/kfsdp/comm/self/self.hpp and the backend-free parts of communicator.hpp
// (request, wait_all, check_agreement, the shared argument checks).
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/self/self.hpp>

#include "../../support/gather_parts.hpp"

namespace comm = kfsdp::comm;

static_assert(comm::communicator<comm::self>);
static_assert(!comm::communicator<int>);
static_assert(std::is_move_constructible_v<comm::request>);
static_assert(!std::is_copy_constructible_v<comm::request>);
static_assert(!std::is_copy_assignable_v<comm::request>);

namespace {

// A request state that completes after `polls_left` calls to test(), and counts waits.
struct countdown_state {
  int* polls_left;
  int* waits;
  bool test() { return --*polls_left <= 0; }
  void wait() {
    ++*waits;
    *polls_left = 0;
  }
};

struct failing_state {
  bool test() { throw std::runtime_error("link down"); }
  void wait() { throw std::runtime_error("link down"); }
};

// One rank, but pretends to be `ranks` wide, to reach size checks that need size() > 1.
struct pretend_size {
  int ranks;
  int rank;
};

}  // namespace

TEST_CASE("self: rank 0 of 1") {
  comm::self one;
  CHECK(one.rank() == 0);
  CHECK(one.size() == 1);
  one.barrier();
}

// The value of a 16-bit float as float, so vectors of any element type compare by value.
template <class T>
std::vector<double> values_of(const std::vector<T>& elements) {
  std::vector<double> values;
  for (const T& element : elements) values.push_back(static_cast<double>(element));
  return values;
}

TEST_CASE_TEMPLATE("self: collectives copy or keep the data", T, float, double, std::int64_t,
                   std::uint64_t, kfsdp::bf16, kfsdp::f16) {
  comm::self one;
  const std::vector<T> shard{T(1), T(2), T(3)};
  std::vector<T> full(3, T(0));
  comm::all_gather(one, shard, std::span(full));
  CHECK(values_of(full) == values_of(shard));

  std::vector<T> reduced(3, T(0));
  comm::reduce_scatter_sum(one, shard, std::span(reduced));
  CHECK(values_of(reduced) == values_of(shard));

  std::vector<T> data = shard;
  comm::broadcast(one, std::span(data), 0);
  comm::all_reduce_sum(one, std::span(data));
  if constexpr (comm::ordered_element<T>) {
    one.all_reduce_max(std::span(data));
    one.all_reduce_min(std::span(data));
  }
  CHECK(values_of(data) == values_of(shard));

  std::fill(full.begin(), full.end(), T(0));
  comm::request gathered = one.iall_gather(shard, std::span(full));
  CHECK_FALSE(gathered.in_flight());  // complete when returned
  CHECK(gathered.test());
  gathered.wait();
  CHECK(values_of(full) == values_of(shard));

  std::fill(reduced.begin(), reduced.end(), T(0));
  one.ireduce_scatter_sum(shard, std::span(reduced)).wait();
  CHECK(values_of(reduced) == values_of(shard));
  one.ibroadcast(std::span(data), 0).wait();
  one.iall_reduce_sum(std::span(data)).wait();
  CHECK(values_of(data) == values_of(shard));
}

TEST_CASE("self: the 16-bit element types are elements, but only the others are ordered") {
  static_assert(comm::element<kfsdp::bf16> && comm::element<kfsdp::f16>);
  static_assert(comm::half_element<kfsdp::bf16> && !comm::half_element<float>);
  static_assert(!comm::ordered_element<kfsdp::bf16> && !comm::ordered_element<kfsdp::f16>);
  static_assert(comm::moves_elements<comm::self, kfsdp::bf16>);
  static_assert(!comm::reduces_extrema<comm::self, kfsdp::f16>);
}

TEST_CASE("self: in-place all_gather is allowed (send == recv at rank 0)") {
  comm::self one;
  std::vector<double> buffer{4, 5};
  comm::all_gather(one, std::span<const double>(buffer), std::span(buffer));
  CHECK(buffer == std::vector<double>{4, 5});
}

TEST_CASE("self: empty spans are fine") {
  comm::self one;
  std::vector<float> nothing;
  comm::all_gather(one, nothing, std::span(nothing));
  comm::reduce_scatter_sum(one, nothing, std::span(nothing));
  comm::all_reduce_sum(one, std::span(nothing));
}

TEST_CASE("self: bad arguments throw std::invalid_argument naming function, parameter and sizes") {
  comm::self one;
  std::vector<float> four(4), five(5);
  // The blocking free functions check through the i-form, and say so.
  CHECK_THROWS_WITH_AS(
      comm::all_gather(one, four, std::span(five)),
      "kfsdp::comm::self::iall_gather: recv has 5 elements, expected size()*send.size() = 1*4 = 4",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (void)one.iall_gather(four, std::span(five)),
      "kfsdp::comm::self::iall_gather: recv has 5 elements, expected size()*send.size() = 1*4 = 4",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(comm::reduce_scatter_sum(one, five, std::span(four)),
                       "kfsdp::comm::self::ireduce_scatter_sum: send has 5 elements, expected "
                       "size()*recv.size() = 1*4 = 4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)one.ireduce_scatter_sum(five, std::span(four)),
                       "kfsdp::comm::self::ireduce_scatter_sum: send has 5 elements, expected "
                       "size()*recv.size() = 1*4 = 4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(comm::broadcast(one, std::span(four), 1),
                       "kfsdp::comm::self::ibroadcast: root is 1, expected 0 <= root < size() = 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)one.ibroadcast(std::span(four), -1),
                       "kfsdp::comm::self::ibroadcast: root is -1, expected 0 <= root < size() = 1",
                       std::invalid_argument);
}

TEST_CASE("self: overlapping send and recv are rejected unless in place") {
  comm::self one;
  std::vector<float> buffer(8);
  const auto whole = std::span(buffer);
  // send = buffer[1:5) overlaps recv = buffer[0:4) without being the in-place slot (rank 0 -> 0).
  CHECK_THROWS_WITH_AS(comm::all_gather(one, std::span<const float>(whole.subspan(1, 4)), whole.first(4)),
                       "kfsdp::comm::self::iall_gather: send and recv overlap; the only overlap "
                       "allowed is in place, send.data() == recv.data() + rank()*send.size() = "
                       "recv.data() + 0*4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      comm::reduce_scatter_sum(one, std::span<const float>(whole.first(4)), whole.subspan(2, 4)),
      "kfsdp::comm::self::ireduce_scatter_sum: send and recv overlap; reduce_scatter_sum needs "
      "separate buffers",
      std::invalid_argument);
  // Adjacent but disjoint is fine.
  comm::reduce_scatter_sum(one, std::span<const float>(whole.first(4)), whole.subspan(4, 4));
}

TEST_CASE_TEMPLATE("self: iall_gather_parts gathers part by part", T, float, double, kfsdp::bf16, kfsdp::f16) {
  comm::self one;
  static_assert(!comm::gathers_parts<comm::self, T, Kokkos::HostSpace>);  // the free function's loop
  kfsdp::test::gather_parts_case<T> batch(0, 1);
  comm::iall_gather_parts<T, Kokkos::HostSpace>(one, batch.parts).wait();
  batch.check();
}

TEST_CASE("self: iall_gather_parts rejects overlapping parts before gathering any") {
  comm::self one;
  kfsdp::test::gather_parts_case<float> batch(0, 1);
  const std::vector<float> before = batch.gathered;
  batch.parts[2] = {batch.parts[2].send.subspan(0, 1), batch.parts[0].recv.subspan(1, 1)};  // inside parts[0]'s
  const auto gather = [&] { return comm::iall_gather_parts<float, Kokkos::HostSpace>(one, batch.parts); };
  CHECK_THROWS_WITH_AS((void)gather(),
                       "kfsdp::comm::iall_gather_parts: parts[2].recv overlaps parts[0].recv; each part "
                       "needs a recv of its own",
                       std::invalid_argument);
  CHECK(batch.gathered == before);  // parts[0] was not gathered either
}

TEST_CASE("argument checks: sizes at a pretended size() = 3, in-place slot of rank 1") {
  using kfsdp::comm::detail::check_all_gather;
  using kfsdp::comm::detail::check_reduce_scatter;
  const pretend_size world{3, 1};
  std::vector<double> send(4), recv(10), full(12);
  CHECK_THROWS_WITH_AS(
      check_all_gather<double>("kfsdp::comm::mpi::all_gather", world.rank, world.ranks, send,
                               std::span(recv)),
      "kfsdp::comm::mpi::all_gather: recv has 10 elements, expected size()*send.size() = 3*4 = 12",
      std::invalid_argument);
  CHECK_NOTHROW(check_all_gather<double>("f", world.rank, world.ranks, send, std::span(full)));
  // In place at rank 1: send is full[4:8).
  const auto whole = std::span(full);
  CHECK_NOTHROW(check_all_gather<double>("f", world.rank, world.ranks, whole.subspan(4, 4), whole));
  CHECK_THROWS_AS(
      check_all_gather<double>("f", world.rank, world.ranks, whole.subspan(0, 4), whole),
                  std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_reduce_scatter<double>("kfsdp::comm::mpi::reduce_scatter_sum",
                                                    world.ranks, recv, std::span(send)),
                       "kfsdp::comm::mpi::reduce_scatter_sum: send has 10 elements, expected "
                       "size()*recv.size() = 3*4 = 12",
                       std::invalid_argument);
  CHECK_NOTHROW(check_reduce_scatter<double>("f", world.ranks, full, std::span(send)));
}

TEST_CASE("argument checks: counts above INT_MAX are an error for int-count backends") {
  using kfsdp::comm::detail::checked_int_count;
  CHECK(checked_int_count("f", "data", 2147483647u) == 2147483647);
  CHECK_THROWS_WITH_AS(checked_int_count("kfsdp::comm::mpi::broadcast", "data", 2147483648u),
                       doctest::Contains("kfsdp::comm::mpi::broadcast: data has 2147483648 "
                                         "elements, expected at most INT_MAX = 2147483647"),
                       std::invalid_argument);
}

TEST_CASE("request: empty requests are complete") {
  comm::request none;
  CHECK_FALSE(none.in_flight());
  CHECK(none.test());
  none.wait();
  none.wait();  // waiting twice on a finished request is fine
}

TEST_CASE("request: test polls until complete, then the request is empty") {
  int polls_left = 3, waits = 0;
  comm::request pending(countdown_state{&polls_left, &waits});
  CHECK(pending.in_flight());
  CHECK_FALSE(pending.test());
  CHECK_FALSE(pending.test());
  CHECK(pending.test());
  CHECK_FALSE(pending.in_flight());
  pending.wait();
  CHECK(waits == 0);  // already complete: nothing left to wait on
}

TEST_CASE("request: the destructor waits, and so does move-assignment over a pending one") {
  int polls_left = 5, waits = 0;
  { comm::request pending(countdown_state{&polls_left, &waits}); }
  CHECK(waits == 1);

  int other_polls = 5, other_waits = 0;
  comm::request first(countdown_state{&polls_left, &waits});
  comm::request second(countdown_state{&other_polls, &other_waits});
  first = std::move(second);  // first's old operation must finish before it is replaced
  CHECK(waits == 2);
  CHECK(other_waits == 0);
  CHECK_FALSE(second.in_flight());  // NOLINT(bugprone-use-after-move): moved-from is empty
  comm::request moved(std::move(first));
  CHECK(moved.in_flight());
  moved.wait();
  CHECK(other_waits == 1);
}

TEST_CASE("request: errors surface from wait and test, once") {
  comm::request waited(failing_state{});
  CHECK_THROWS_WITH_AS(waited.wait(), "link down", std::runtime_error);
  CHECK_FALSE(waited.in_flight());
  waited.wait();  // finished (with an error) already: no second throw

  comm::request polled(failing_state{});
  CHECK_THROWS_WITH_AS((void)polled.test(), "link down", std::runtime_error);
  CHECK_FALSE(polled.in_flight());
}

TEST_CASE("wait_all: every request completes") {
  int polls_a = 9, waits_a = 0, polls_b = 9, waits_b = 0;
  std::vector<comm::request> batch;
  batch.emplace_back(countdown_state{&polls_a, &waits_a});
  batch.emplace_back(countdown_state{&polls_b, &waits_b});
  batch.emplace_back();
  comm::wait_all(batch);
  CHECK(waits_a == 1);
  CHECK(waits_b == 1);
  for (auto& pending : batch) CHECK_FALSE(pending.in_flight());
}

TEST_CASE("check_agreement: one rank always agrees") {
  comm::self one;
  CHECK_NOTHROW(comm::check_agreement(one, 0xdeadbeefULL, "the shard plan"));
  CHECK_NOTHROW(comm::check_agreement(one, 0, "zero"));
  CHECK_NOTHROW(comm::check_agreement(one, ~0ULL, "all ones"));
}

TEST_CASE_TEMPLATE("self: iall_to_all sends the only block to itself; bad sizes and overlap throw", T, float, double,
                   kfsdp::bf16, kfsdp::f16) {
  comm::self one;
  const std::vector<T> send = {T(1), T(2), T(3)};
  std::vector<T> recv(3, T(0));
  comm::all_to_all(one, send, std::span(recv));
  CHECK(values_of(recv) == values_of(send));
  std::vector<T> two(2);
  CHECK_THROWS_WITH_AS((void)one.iall_to_all(send, std::span(two)),
                       "kfsdp::comm::self::iall_to_all: recv has 2 elements, expected send.size() = 3",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (void)one.iall_to_all(std::span<const T>(recv), std::span(recv)),
      "kfsdp::comm::self::iall_to_all: send and recv overlap; all_to_all needs separate buffers",
      std::invalid_argument);
}

TEST_CASE("argument checks: all_to_all at a pretended size() = 3") {
  std::vector<float> seven(7), six(6), other(6);
  CHECK_THROWS_WITH_AS(comm::detail::check_all_to_all<float>("f", 3, seven, std::span(other).first(6)),
                       "f: send has 7 elements, expected a multiple of size() = 3 (one block a rank)",
                       std::invalid_argument);
  CHECK_NOTHROW(comm::detail::check_all_to_all<float>("f", 3, six, std::span(other)));
}
