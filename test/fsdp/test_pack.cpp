// The worked example of pack.hpp: 13 rows of 4 at world size 3 (chunk 5 rows, 2 padding rows).
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include <kfsdp/fsdp/pack.hpp>

#include "engine_checks.hpp"

using namespace kfsdp;
using kernels::param_slot;

TEST_CASE("unpack lays the ranks' chunks back in order and drops padding; pack is its inverse") {
  const std::size_t ws = 3, stride = 30, offset = 7;  // S = 30: this parameter's chunks at offset 7
  const param_slot slot{offset, 20, 52, 4};
  Kokkos::View<double*> gathered("gathered", ws * stride);
  auto host = Kokkos::create_mirror_view(gathered);
  for (std::size_t i = 0; i < host.extent(0); ++i) host(i) = double(i);
  Kokkos::deep_copy(gathered, host);
  Kokkos::View<double*> unpacked("unpacked", 4 + 52);
  kernels::unpack_param<double>(gathered, stride, slot, unpacked);
  const auto full = testing::to_host(unpacked);
  for (std::size_t j = 0; j < 52; ++j) CHECK(full[4 + j] == double((j / 20) * stride + offset + j % 20));
  CHECK(full[0] == 0.0);  // outside the slot: untouched

  Kokkos::View<double*> packed("packed", ws * stride);
  Kokkos::deep_copy(packed, -1.0);
  kernels::pack_param<double>(unpacked, slot, stride, ws, packed);
  const auto back = testing::to_host(packed);
  for (std::size_t r = 0; r < ws; ++r)
    for (std::size_t k = 0; k < 20; ++k) {
      const std::size_t j = r * 20 + k;
      CHECK(back[r * stride + offset + k] == (j < 52 ? host(r * stride + offset + k) : 0.0));  // padding: zero
    }
  CHECK(back[0] == -1.0);  // other parameters' places: untouched
}

TEST_CASE("accumulate_scaled adds, fill_init is the same at every offset") {
  Kokkos::View<float*> a("a", 8), b("b", 8);
  Kokkos::deep_copy(a, 1.0f);
  Kokkos::deep_copy(b, 2.0f);
  kernels::accumulate_scaled<float>(a, b, 0.25f);
  for (float x : testing::to_host(a)) CHECK(x == 1.5f);
  Kokkos::View<double*> whole("whole", 100), part("part", 30);
  const param_init normal{param_init::normal, 1.0};
  kernels::fill_init<double>(whole, 100, 0, 9, 2, normal);
  kernels::fill_init<double>(part, 30, 40, 9, 2, normal);  // elements 40..69 alone, as a rank computes them
  const auto w = testing::to_host(whole), p = testing::to_host(part);
  for (std::size_t k = 0; k < 30; ++k) CHECK(p[k] == w[40 + k]);
}
