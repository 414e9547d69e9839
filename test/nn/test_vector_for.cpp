// Tests of include/kfsdp/detail/vector_for.hpp: the loop of the element and row kernels.
#include "nn_test_helpers.hpp"

#include <kfsdp/detail/vector_for.hpp>

#include <cstdint>
#include <vector>

TEST_CASE("vector_for visits every index once, at the chunk edges too") {
  for (const std::int64_t n : {0, 1, 7, 2047, 2048, 2049, 5000}) {
    CAPTURE(n);
    Kokkos::View<int*> visits("visits", std::size_t(n) + 1);  // one past the end: must stay 0
    kfsdp::detail::vector_for("test::visits", n, KOKKOS_LAMBDA(std::int64_t i) { visits(i) += 1; });
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), visits);
    int wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) wrong += host(i) != 1;
    CHECK(wrong == 0);
    CHECK(host(n) == 0);
  }
}

TEST_CASE("a kernel writing floats reads what it captured as it was (a local copy of the kernel)") {
  // The kernel captures a float and stores floats: through a reference to the kernel a store could
  // alias the captured value; the loop's own copy cannot.
  Kokkos::View<float*> out("out", 100);
  const float scale = 3.0F;
  kfsdp::detail::vector_for("test::scale", 100, KOKKOS_LAMBDA(std::int64_t i) { out(i) = scale * float(i); });
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int i = 0; i < 100; ++i) REQUIRE(host(i) == 3.0F * float(i));
}

TEST_CASE("lane_sum adds in 8 lanes, the tail into lane 0, then the lanes in order") {
  std::vector<float> values(21);
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = 1.0F + float(k) * 1e-7F * float(k % 3 == 0 ? 1e4 : 1);
  float lane[8] = {};
  std::size_t k = 0;
  for (; k + 8 <= values.size(); k += 8)
    for (int l = 0; l < 8; ++l) lane[l] += values[k + std::size_t(l)];
  for (; k < values.size(); ++k) lane[0] += values[k];
  float expected = 0;
  for (const float l : lane) expected += l;
  const float sum = kfsdp::detail::lane_sum<float>(int(values.size()), [&](int i) { return values[std::size_t(i)]; });
  CHECK(sum == expected);
  CHECK(kfsdp::detail::lane_sum<float>(0, [](int) { return 1.0F; }) == 0.0F);
}
