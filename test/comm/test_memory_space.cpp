// Tests for include/kfsdp/comm/memory_space.hpp (and batched_collectives.hpp's scaled
// reduce-scatter) and the memory-space forms of the backends (span_in), with Kokkos running
// (mpi_kokkos_test_dep's main); under mpirun at 1-4 ranks. On this CPU machine the
// device paths are exercised on host memory: mpi_options::device_memory = staged sends every buffer
// through host copies in staging_space, as it would a GPU's; direct passes the pointers. Both must
// give the bits of the plain std::span calls, whichever path the reduce-scatter takes (ring or MPI).
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/comm/batched_collectives.hpp>
#include <kfsdp/comm/memory_space.hpp>
#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/comm/threaded/threaded.hpp>

#include "../support/rank_values.hpp"

namespace comm = kfsdp::comm;
using kfsdp::test::contributions;
using host = Kokkos::HostSpace;
using path = comm::mpi_options::device_memory_path;

static_assert(comm::communicator_in<comm::mpi, host>);
static_assert(comm::communicator_in<comm::self, host>);
static_assert(comm::communicator_in<comm::any_communicator, host>);
static_assert(comm::communicator_in<comm::threaded<comm::mpi>, host>);
static_assert(comm::host_accessible<host>);
// The default execution space's memory (Kokkos::CudaSpace on a CUDA build): every backend but nccl
// moves it, and any_communicator carries it.
using device = comm::any_communicator::device_space;
static_assert(comm::communicator_in<comm::mpi, device>);
static_assert(comm::communicator_in<comm::self, device>);
static_assert(comm::communicator_in<comm::threaded<comm::mpi>, device>);
static_assert(comm::communicator_in<comm::any_communicator, device>);
// A span keeps its memory space: no conversion to another space, nor from a bare std::span.
struct other_space {};
static_assert(std::is_convertible_v<comm::span_in<float, host>, comm::span_in<const float, host>>);
static_assert(!std::is_convertible_v<comm::span_in<float, host>, comm::span_in<float, other_space>>);
static_assert(!std::is_convertible_v<std::span<float>, comm::span_in<float, host>>);

namespace {

using kfsdp::test::values_of;  // for vectors; views below

template <class T>
Kokkos::View<T*, host> view_of(const std::vector<T>& values, const char* label) {
  Kokkos::View<T*, host> v(std::string(label), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) v(i) = values[i];
  return v;
}
template <class T>
std::vector<double> values_of(const Kokkos::View<T*, host>& v) {
  std::vector<double> values;
  for (std::size_t i = 0; i < v.extent(0); ++i) values.push_back(static_cast<double>(v(i)));
  return values;
}
// Every collective through span_in on `c`, compared with the same collective through std::span on
// `reference` (the same ranks).
template <class T, class C, class Reference>
void check_every_collective(C& c, Reference& reference, std::size_t count) {
  const int rank = reference.rank();
  const auto ranks = static_cast<std::size_t>(reference.size());
  const std::vector<T> mine = contributions<T>(rank, count);
  const std::vector<T> mine_of_all = contributions<T>(rank, count * ranks);

  std::vector<T> full_expected(count * ranks);
  comm::all_gather(reference, mine, std::span(full_expected));
  const auto send = view_of(mine, "send");
  Kokkos::View<T*, host> full("full", count * ranks);
  c.iall_gather(comm::span_in<const T, host>(send), comm::span_in(full)).wait();
  CHECK(values_of(full) == values_of(full_expected));

  // In place: send is this rank's slot of recv.
  Kokkos::View<T*, host> in_place("in_place", count * ranks);
  for (std::size_t i = 0; i < count; ++i) in_place(rank * count + i) = mine[i];
  const auto slot = comm::span_in(in_place).subspan(rank * count, count);
  comm::all_gather(c, comm::span_in<const T, host>(slot), comm::span_in(in_place));
  CHECK(values_of(in_place) == values_of(full_expected));

  std::vector<T> reduced_expected(count);
  comm::reduce_scatter_sum(reference, mine_of_all, std::span(reduced_expected));
  const auto to_reduce = view_of(mine_of_all, "to_reduce");
  Kokkos::View<T*, host> reduced("reduced", count);
  comm::request pending = c.ireduce_scatter_sum(comm::span_in<const T, host>(to_reduce), comm::span_in(reduced));
  while (!pending.test()) {
  }
  CHECK(values_of(reduced) == values_of(reduced_expected));

  // Scaled: the sums · factor, folded into the ring's last addition or one pass after MPI's; the bits
  // of a multiply after the sum (a power of two for bf16, whose fold rounds once, in float).
  const std::vector<comm::scale_type<T>> factors =
      kfsdp::comm::half_element<T> ? std::vector<comm::scale_type<T>>{0.25f}
                                   : std::vector<comm::scale_type<T>>{comm::scale_type<T>(0.25), comm::scale_type<T>(1) / 3};
  for (const comm::scale_type<T> factor : factors) {
    CAPTURE(static_cast<double>(factor));
    Kokkos::View<T*, host> scaled("scaled", count);
    comm::request scaling = comm::ireduce_scatter_sum<T, host>(c, comm::span_in<const T, host>(to_reduce),
                                                              comm::span_in(scaled), factor);
    while (!scaling.test()) {
    }
    std::vector<double> scaled_expected;
    for (const T sum : reduced_expected) scaled_expected.push_back(static_cast<double>(comm::detail::product_of(sum, factor)));
    CHECK(values_of(scaled) == scaled_expected);
  }

  for (int root = 0; root < reference.size(); ++root) {
    auto data = view_of(contributions<T>(rank, count), "broadcast");
    comm::broadcast(c, comm::span_in(data), root);
    CHECK(values_of(data) == values_of(contributions<T>(root, count)));
  }

  std::vector<T> summed_expected = mine;
  comm::all_reduce_sum(reference, std::span(summed_expected));
  auto summed = view_of(mine, "summed");
  { comm::request out_of_scope = c.iall_reduce_sum(comm::span_in(summed)); }  // waits, and copies out
  CHECK(values_of(summed) == values_of(summed_expected));
}

}  // namespace

TEST_CASE_TEMPLATE("memory spaces: every collective on span_in gives the bits of std::span, direct and staged, "
                   "through the ring and through MPI",
                   T, float, double, kfsdp::bf16) {
  comm::mpi reference;
  for (const path device_memory : {path::automatic, path::direct, path::staged}) {
    for (const std::size_t ring_min_bytes : {std::size_t{1}, std::size_t{1} << 30}) {  // the ring; MPI's
      CAPTURE(static_cast<int>(device_memory));
      CAPTURE(ring_min_bytes);
      comm::mpi c(MPI_COMM_WORLD, {.device_memory = device_memory});
      c.set_reduce_scatter_ring_min_bytes(ring_min_bytes);
      reference.set_reduce_scatter_ring_min_bytes(ring_min_bytes);
      for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{70000}}) {
        CAPTURE(count);
        check_every_collective<T>(c, reference, count);
      }
    }
  }
}

TEST_CASE("memory spaces: threaded, self and any_communicator carry span_in (the staged mpi behind them)") {
  comm::mpi reference;
  comm::mpi staged(MPI_COMM_WORLD, {.device_memory = path::staged});
  {
    comm::threaded overlapped(staged);
    check_every_collective<float>(overlapped, reference, 300);
  }
  comm::any_communicator erased(staged);
  check_every_collective<double>(erased, reference, 300);
  // std::span through any_communicator still means host memory.
  std::vector<float> mine(3, 1.0f), full(3 * reference.size());
  comm::all_gather(erased, std::span<const float>(mine), std::span(full));
  CHECK(full == std::vector<float>(full.size(), 1.0f));

  comm::self one;
  comm::self reference_one;
  check_every_collective<kfsdp::bf16>(one, reference_one, 5);
}

// Every collective of `c` on views of the default execution space (device memory on a CUDA build,
// where this instantiates each one with device views): all-gather, reduce-scatter, broadcast and
// all-reduce of ones, checked on a host mirror.
template <class C>
void collectives_on_default_space(C& c) {
  const auto ranks = static_cast<std::size_t>(c.size());
  constexpr std::size_t count = 40000;  // 160 KB chunks of float: the mpi ring
  Kokkos::View<float*> ones("ones", count * ranks), gathered("gathered", count * ranks), reduced("reduced", count);
  Kokkos::deep_copy(ones, 1.0f);
  c.iall_gather(comm::span_in(ones).subspan(0, count), comm::span_in(gathered)).wait();
  c.ireduce_scatter_sum(comm::span_in(ones), comm::span_in(reduced)).wait();
  c.ibroadcast(comm::span_in(gathered), 0).wait();
  c.iall_reduce_sum(comm::span_in(reduced)).wait();
  const auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gathered);
  const auto r = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reduced);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < g.extent(0); ++i) wrong += g(i) != 1.0f;
  for (std::size_t i = 0; i < r.extent(0); ++i) wrong += r(i) != static_cast<float>(ranks * ranks);
  CHECK(wrong == 0);
}

TEST_CASE("memory spaces: every backend on views of the default execution space") {
  for (const path device_memory : {path::automatic, path::staged}) {
    comm::mpi world(MPI_COMM_WORLD, {.device_memory = device_memory});
    collectives_on_default_space(world);
    comm::any_communicator erased(world);
    collectives_on_default_space(erased);
  }
  comm::mpi world;
  {
    comm::threaded overlapped(world);
    collectives_on_default_space(overlapped);
  }
  comm::self one;
  collectives_on_default_space(one);
}

TEST_CASE("memory spaces: bad arguments are named the same on the staged path, before any copy") {
  comm::mpi staged(MPI_COMM_WORLD, {.device_memory = path::staged});
  Kokkos::View<float*, host> send("send", 4), recv("recv", 4 * staged.size() + 1);
  CHECK_THROWS_WITH_AS((void)staged.iall_gather(comm::span_in<const float, host>(send), comm::span_in(recv)),
                       doctest::Contains("kfsdp::comm::mpi::iall_gather: recv has"), std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)staged.ireduce_scatter_sum(comm::span_in<const float, host>(recv), comm::span_in(send)),
                       doctest::Contains("kfsdp::comm::mpi::ireduce_scatter_sum: send has"), std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)staged.ibroadcast(comm::span_in(send), staged.size()),
                       doctest::Contains("kfsdp::comm::mpi::ibroadcast: root is"), std::invalid_argument);
}

TEST_CASE("memory_space.hpp: the ring's add and the copies, as Kokkos kernels and (Kokkos aside) as loops") {
  std::vector<float> a{1, 2, 3}, b{10, 20, 30}, sum(3);
  comm::detail::add(comm::host_span<const float>(std::span<const float>(a)),
                    comm::host_span<const float>(std::span<const float>(b)), comm::host_span<float>(std::span(sum)));
  CHECK(sum == std::vector<float>{11, 22, 33});
  std::vector<kfsdp::bf16> h{kfsdp::bf16(1.0f), kfsdp::bf16(256.0f)}, one{kfsdp::bf16(1.0f), kfsdp::bf16(1.0f)}, out(2);
  comm::detail::add(comm::host_span<const kfsdp::bf16>(std::span<const kfsdp::bf16>(h)),
                    comm::host_span<const kfsdp::bf16>(std::span<const kfsdp::bf16>(one)),
                    comm::host_span<kfsdp::bf16>(std::span(out)));
  CHECK(out[0].to_float() == 2.0f);
  CHECK(out[1].to_float() == 256.0f);  // 257 rounds to even in bf16: one rounding, in float
  comm::detail::owned_elements<double, host> owned(4);
  comm::detail::transfer(owned.span(), comm::host_span<const double>(std::span<const double>(std::vector<double>{1, 2, 3, 4})));
  CHECK(owned.span().span()[3] == 4.0);
}
