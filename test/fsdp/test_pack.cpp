// The worked example of pack.hpp: 13 rows of 4 at world size 3 (chunk 5 rows, 2 padding rows).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <kfsdp/fsdp/pack.hpp>
#include <kfsdp/fsdp/quantize.hpp>

#include "engine_checks.hpp"

using namespace kfsdp;

TEST_CASE("unpack lays the ranks' chunks back in order and drops padding; pack is its inverse") {
  const std::size_t ws = 3, stride = 30, offset = 7;  // S = 30: this parameter's chunks at offset 7
  // A plan whose bucket 0 holds other parameters around this one: 7 elements of them come first in
  // each rank's shard (bucket_offset 7), so 3 · 7 = 21 first in the unpacked buffer.
  shard_plan plan;
  plan.world_size = ws;
  plan.params = {param_shard{.dim0 = 13, .row_numel = 4, .chunk_rows = 5, .padding_rows = 2, .bucket = 0,
                             .bucket_offset = offset, .storage_offset = offset}};
  plan.buckets = {bucket_shard{.first_param = 0, .param_count = 1, .shard_numel = stride, .storage_offset = 0,
                               .full_numel = 52}};
  const shard_mapping map(plan);
  Kokkos::View<double*> gathered("gathered", ws * stride);
  auto host = Kokkos::create_mirror_view(gathered);
  for (std::size_t i = 0; i < host.extent(0); ++i) host(i) = double(i);
  Kokkos::deep_copy(gathered, host);
  Kokkos::View<double*> unpacked("unpacked", ws * stride);
  CHECK(map.unpacked(0) == index_range{21, 52});
  kernels::unpack_param<double>(gathered, map, 0, unpacked);
  const auto full = testing::to_host(unpacked);
  for (std::size_t j = 0; j < 52; ++j) CHECK(full[21 + j] == double((j / 20) * stride + offset + j % 20));
  CHECK(full[0] == 0.0);  // outside the slot: untouched

  Kokkos::View<double*> packed("packed", ws * stride);
  Kokkos::deep_copy(packed, -1.0);
  kernels::pack_param<double>(unpacked, map, 0, packed);
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

TEST_CASE("fill_init uniform: within the bound, mean near 0, the same at every split") {
  const std::size_t n = 20000;
  const param_init uniform{param_init::uniform, 0.25};
  Kokkos::View<double*> whole("whole", n);
  kernels::fill_init<double>(whole, n, 0, 5, 3, uniform);
  const auto w = testing::to_host(whole);
  double sum = 0, sum_sq = 0, low = 1, high = -1;
  for (double v : w) sum += v, sum_sq += v * v, low = std::min(low, v), high = std::max(high, v);
  CHECK(low >= -0.25);
  CHECK(high < 0.25);
  CHECK(std::abs(sum / n) < 0.005);                                    // σ of the mean ≈ 0.001
  CHECK(sum_sq / n == doctest::Approx(0.25 * 0.25 / 3).epsilon(0.03));  // variance of U(−b, b): b²/3
  CHECK(low < -0.249);  // and it spans the interval
  CHECK(high > 0.249);
  const std::size_t worlds[] = {2, 3, 7};
  for (std::size_t world : worlds) {  // each rank's chunk computed alone, as at that world size
    const std::size_t chunk = (n + world - 1) / world;
    for (std::size_t rank = 0; rank < world; ++rank) {
      const std::size_t first = rank * chunk, count = std::min(chunk, n - first);
      Kokkos::View<double*> part("part", count);
      kernels::fill_init<double>(part, count, first, 5, 3, uniform);
      const auto p = testing::to_host(part);
      std::size_t mismatches = 0;
      for (std::size_t k = 0; k < count; ++k) mismatches += p[k] != w[first + k];
      CHECK_MESSAGE(mismatches == 0, "world " << world << " rank " << rank);
    }
  }
  Kokkos::View<double*> other("other", n);  // another parameter index: other values
  kernels::fill_init<double>(other, n, 0, 5, 4, uniform);
  CHECK(testing::to_host(other) != w);
}

TEST_CASE("int8 blocks: the wire layout, and a round trip off by at most half a block's scale") {
  // 601 values: blocks of 256, 256 and 89; the values end short of a whole f32 (3 bytes of padding).
  const int8_blocks blocks{601};
  CHECK(blocks.block_count == 3);
  CHECK(blocks.scales_offset() == 604);
  CHECK(blocks.bytes() == 604 + 3 * 4);
  CHECK(blocks.bytes() % 4 == 0);
  CHECK(int8_blocks{1024}.bytes() == 1024 + 4 * 4);  // the theory: (1 + 4 / 256) bytes a value
  std::vector<double> values(blocks.numel);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = std::sin(0.37 * double(i)) * (i < 256 ? 1e-3 : i < 512 ? 0.0 : 40.0);  // a small, a zero, a large block
  Kokkos::View<double*> in("in", values.size());
  auto host_in = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < values.size(); ++i) host_in(i) = values[i];
  Kokkos::deep_copy(in, host_in);
  Kokkos::View<float*> wire("wire", blocks.words());
  kernels::quantize_int8<double>(in, blocks.values(wire.data()), blocks.scales(wire.data()));
  Kokkos::View<float*> out("out", values.size());
  kernels::dequantize_int8<float>(blocks.values(wire.data()), blocks.scales(wire.data()), 0, out);
  const auto back = testing::to_host(out);
  Kokkos::View<float*> scales_view = blocks.scales(wire.data());
  auto scales = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, scales_view);
  for (std::size_t b = 0; b < blocks.block_count; ++b) {
    double absmax = 0;
    for (std::size_t i = b * 256; i < std::min(values.size(), (b + 1) * 256); ++i) absmax = std::max(absmax, std::abs(values[i]));
    CHECK(scales(b) == doctest::Approx(absmax / 127).epsilon(1e-6));
  }
  CHECK(scales(1) == 0.0f);  // a zero block stays exactly zero
  std::size_t outside = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double scale = scales(i / 256);
    outside += std::abs(double(back[i]) - values[i]) > scale / 2 * (1 + 1e-5) + 1e-6 * std::abs(values[i]);
  }
  CHECK(outside == 0);
  // A range of the shard (one parameter's chunk) lands where it is asked for.
  Kokkos::View<double*> part("part", 100);
  kernels::dequantize_int8<double>(blocks.values(wire.data()), blocks.scales(wire.data()), 500, part);
  const auto p = testing::to_host(part);
  for (std::size_t k = 0; k < 100; ++k) CHECK(float(p[k]) == back[500 + k]);
}

TEST_CASE("int8 gradient sums: a chunk summed over the senders' wire buffers is the sum of its dequantized copies") {
  // Two chunks (300 and 5 values) in one layout, three senders; the second chunk is summed.
  const int8_blocks layout{305, int8_blocks::blocks_of(300) + int8_blocks::blocks_of(5)};
  const int8_chunk second{1, {300, 5}, {300, 5}, {2, 1}};
  constexpr std::size_t senders = 3;
  Kokkos::View<float*> wires("wires", senders * layout.words());
  std::vector<std::vector<double>> dequantized(senders);
  for (std::size_t s = 0; s < senders; ++s) {
    char* wire = reinterpret_cast<char*>(wires.data()) + s * layout.bytes();
    Kokkos::View<double*> chunk("chunk", 5);
    auto host = Kokkos::create_mirror_view(chunk);
    for (std::size_t i = 0; i < 5; ++i) host(i) = std::cos(double(s + 3 * i)) * double(s + 1);
    Kokkos::deep_copy(chunk, host);
    kernels::quantize_int8<double>(chunk, Kokkos::subview(layout.values(wire), std::make_pair(300, 305)),
                                   Kokkos::subview(layout.scales(wire), std::make_pair(2, 3)));
    Kokkos::View<double*> back("back", 5);
    kernels::dequantize_int8<double>(Kokkos::subview(layout.values(wire), std::make_pair(300, 305)),
                                     Kokkos::subview(layout.scales(wire), std::make_pair(2, 3)), 0, back);
    dequantized[s] = testing::to_host(back);
  }
  Kokkos::View<double*> sum("sum", 5);
  const Kokkos::View<const char*> received(reinterpret_cast<const char*>(wires.data()), senders * layout.bytes());
  kernels::sum_dequantized_int8<double>(received, senders, layout, second, 0.5, sum);
  const auto got = testing::to_host(sum);
  for (std::size_t i = 0; i < 5; ++i)
    CHECK(got[i] == (dequantized[0][i] + dequantized[1][i] + dequantized[2][i]) * 0.5);  // rank order, then the factor
}

TEST_CASE("int8 blocks: a block with a NaN, +Inf or -Inf dequantizes to NaN throughout; the other blocks as before") {
  // Five blocks of 256 (the last 100 long): finite, NaN, +Inf, -Inf, and an infinity followed by a NaN.
  const int8_blocks blocks{4 * 256 + 100};
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> values(blocks.numel);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37 * double(i));
  values[256 + 17] = nan;   // not the block's first value: the absmax loop has seen finite ones before it
  values[512 + 255] = inf;  // its last
  values[768] = -inf;       // its first
  values[1024 + 3] = inf;
  values[1024 + 50] = -nan;
  Kokkos::View<double*> in("in", values.size());
  auto host_in = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < values.size(); ++i) host_in(i) = values[i];
  Kokkos::deep_copy(in, host_in);
  for (const bool as_float : {false, true}) {
    CAPTURE(as_float);
    Kokkos::View<float*> wire("wire", blocks.words());
    if (as_float) {
      Kokkos::View<float*> f("f", values.size());
      auto host_f = Kokkos::create_mirror_view(f);
      for (std::size_t i = 0; i < values.size(); ++i) host_f(i) = float(values[i]);
      Kokkos::deep_copy(f, host_f);
      kernels::quantize_int8<float>(f, blocks.values(wire.data()), blocks.scales(wire.data()));
    } else {
      kernels::quantize_int8<double>(in, blocks.values(wire.data()), blocks.scales(wire.data()));
    }
    Kokkos::View<float*> scales_view = blocks.scales(wire.data());
    const auto scales = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, scales_view);
    CHECK(std::isfinite(scales(0)));
    for (std::size_t b = 1; b < blocks.block_count; ++b) CHECK(std::isnan(scales(b)));
    Kokkos::View<std::int8_t*> values_view = blocks.values(wire.data());
    const auto q = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, values_view);
    for (std::size_t i = 256; i < values.size(); ++i) CHECK(q(i) == 0);  // no NaN was cast to int8
    Kokkos::View<double*> out("out", values.size());
    kernels::dequantize_int8<double>(blocks.values(wire.data()), blocks.scales(wire.data()), 0, out);
    const auto back = testing::to_host(out);
    for (std::size_t i = 0; i < 256; ++i) CHECK(std::abs(back[i] - values[i]) <= double(scales(0)) / 2 * (1 + 1e-5));
    std::size_t numbers = 0;
    for (std::size_t i = 256; i < values.size(); ++i) numbers += !std::isnan(back[i]);
    CHECK(numbers == 0);
  }
  // The gradient sum: one sender's NaN block makes the sum NaN there, the other blocks stay numbers.
  const int8_blocks layout{512};
  const int8_chunk chunk{0, {0, 512}, {0, 512}, {0, 2}};
  constexpr std::size_t senders = 3;
  Kokkos::View<float*> wires("wires", senders * layout.words());
  for (std::size_t s = 0; s < senders; ++s) {
    char* wire = reinterpret_cast<char*>(wires.data()) + s * layout.bytes();
    Kokkos::View<double*> grads("grads", 512);
    auto host = Kokkos::create_mirror_view(grads);
    for (std::size_t i = 0; i < 512; ++i) host(i) = std::cos(double(s + 3 * i));
    if (s == 1) host(300) = nan;
    Kokkos::deep_copy(grads, host);
    kernels::quantize_int8<double>(grads, layout.values(wire), layout.scales(wire));
  }
  Kokkos::View<double*> sum("sum", 512);
  const Kokkos::View<const char*> received(reinterpret_cast<const char*>(wires.data()), senders * layout.bytes());
  kernels::sum_dequantized_int8<double>(received, senders, layout, chunk, 1.0 / 3, sum);
  const auto got = testing::to_host(sum);
  std::size_t finite_first = 0, nan_second = 0;
  for (std::size_t i = 0; i < 256; ++i) finite_first += std::isfinite(got[i]);
  for (std::size_t i = 256; i < 512; ++i) nan_second += std::isnan(got[i]);
  CHECK(finite_first == 256);
  CHECK(nan_second == 256);
}
