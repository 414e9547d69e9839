#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include <kfsdp/meta/half.hpp>

using kfsdp::bf16;
using kfsdp::f16;

// The conversions are constexpr (std::bit_cast), so the header's worked example holds at compile time.
static_assert(f16(1.0f).bits == 0x3C00 && f16(65504.0f).bits == 0x7BFF && f16(65520.0f).bits == 0x7C00);
static_assert(f16(0x1.002p0f).bits == 0x3C00 && f16(0x1.006p0f).bits == 0x3C02 && f16(0x1p-24f).bits == 0x0001);
static_assert(bf16(1.0f).bits == 0x3F80 && bf16(std::bit_cast<float>(0x7F7F8000u)).bits == 0x7F80);
static_assert(float(f16::from_bits(0x3C01)) == 0x1.004p0f && float(bf16::from_bits(0x0001)) == 0x1p-133f);
static_assert(!std::is_convertible_v<float, f16> && std::is_convertible_v<f16, float>);
static_assert(!std::is_constructible_v<f16, double> && !std::is_constructible_v<bf16, double>);
static_assert(std::is_constructible_v<f16, int> && std::is_constructible_v<bf16, float>);

namespace {

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
float up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

std::string hex(std::uint32_t v) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "0x%08X", v);
  return buffer;
}

struct edge {
  const char* what;
  float in;
  std::uint16_t bits;  // expected for +in; -in must give bits | 0x8000
};

template <class Half>
void check_table(const edge* begin, const edge* end) {
  for (const edge* e = begin; e != end; ++e) {
    for (float sign : {1.0f, -1.0f}) {
      const float in = sign * e->in;
      const std::uint16_t want = static_cast<std::uint16_t>(sign > 0 ? e->bits : e->bits | 0x8000);
      INFO(std::string(e->what), ": in = ", in, " (float bits ", hex(std::bit_cast<std::uint32_t>(in)), ")");
      CHECK(Half(in).bits == want);
    }
  }
}

bool f16_is_nan(std::uint16_t b) { return (b & 0x7C00) == 0x7C00 && (b & 0x03FF) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

// Independent f16 reference in double arithmetic: pick the f16 ulp of |f|'s binade (clamped to the subnormal ulp
// 2^-24), round |f| / ulp with nearbyint under FE_TONEAREST, and encode. Finite inputs only.
std::uint16_t f16_reference(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0.0) return sign;
  int k = 0;
  std::frexp(a, &k);  // a = m · 2^k, m in [0.5, 1): the binade's exponent is k - 1
  int exponent = std::max(k - 1, -14);
  double q = std::nearbyint(std::ldexp(a, 10 - exponent));  // exact scaling by a power of two, then RNE
  if (exponent == -14 && q < 1024.0) return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(q));
  if (q == 2048.0) {  // rounded up into the next binade
    q = 1024.0;
    ++exponent;
  }
  if (exponent > 15) return static_cast<std::uint16_t>(sign | 0x7C00);
  return static_cast<std::uint16_t>(sign | ((exponent + 15) << 10) | (static_cast<int>(q) - 1024));
}

// The same for bf16: 7 mantissa bits, normal exponents down to -126, subnormal ulp 2^-133, inf from 2^128.
std::uint16_t bf16_reference(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0.0) return sign;
  int k = 0;
  std::frexp(a, &k);
  int exponent = std::max(k - 1, -126);
  double q = std::nearbyint(std::ldexp(a, 7 - exponent));
  if (exponent == -126 && q < 128.0) return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(q));
  if (q == 256.0) {
    q = 128.0;
    ++exponent;
  }
  if (exponent > 127) return static_cast<std::uint16_t>(sign | 0x7F80);
  return static_cast<std::uint16_t>(sign | ((exponent + 127) << 7) | (static_cast<int>(q) - 128));
}

}  // namespace

TEST_CASE("f16: edge values round to nearest, ties to even, in both signs") {
  const float inf = std::numeric_limits<float>::infinity();
  const edge table[] = {
      {"+0", 0.0f, 0x0000},
      {"smallest subnormal 2^-24", 0x1p-24f, 0x0001},
      {"largest subnormal 1023 · 2^-24", 0x1.ff8p-15f, 0x03FF},
      {"smallest normal 2^-14", 0x1p-14f, 0x0400},
      {"1", 1.0f, 0x3C00},
      {"1 + 1 ulp", 0x1.004p0f, 0x3C01},
      {"largest finite 65504", 65504.0f, 0x7BFF},
      {"tie 1 + 2^-11 -> even 0x3C00 (down)", 0x1.002p0f, 0x3C00},
      {"just above that tie", up(0x1.002p0f), 0x3C01},
      {"just below that tie", down(0x1.002p0f), 0x3C00},
      {"tie 1 + 3 · 2^-11 -> even 0x3C02 (up)", 0x1.006p0f, 0x3C02},
      {"just above that tie", up(0x1.006p0f), 0x3C02},
      {"just below that tie", down(0x1.006p0f), 0x3C01},
      {"tie 2 - 2^-11 -> next binade 2", 0x1.ffep0f, 0x4000},
      {"just below 2 - 2^-11 -> 2 - 2^-10", down(0x1.ffep0f), 0x3FFF},
      {"tie 1 - 2^-12 -> next binade 1", 0x1.ffep-1f, 0x3C00},
      {"tie 2^-25 (half the smallest subnormal) -> even 0", 0x1p-25f, 0x0000},
      {"just above 2^-25 -> smallest subnormal", up(0x1p-25f), 0x0001},
      {"2^-26 flushes to 0", 0x1p-26f, 0x0000},
      {"float's smallest subnormal flushes to 0", from_bits(0x00000001u), 0x0000},
      {"subnormal tie 1.5 · 2^-24 -> even 0x0002", 0x1.8p-24f, 0x0002},
      {"subnormal tie 2.5 · 2^-24 -> even 0x0002", 0x1.4p-23f, 0x0002},
      {"just above 2.5 · 2^-24", up(0x1.4p-23f), 0x0003},
      {"tie 1023.5 · 2^-24 -> smallest normal", 0x1.ffcp-15f, 0x0400},
      {"just below 1023.5 · 2^-24 stays subnormal", down(0x1.ffcp-15f), 0x03FF},
      {"just below the smallest normal", down(0x1p-14f), 0x0400},
      {"tie 65520 -> +inf (65504's mantissa is odd)", 65520.0f, 0x7C00},
      {"just below 65520 -> largest finite", down(65520.0f), 0x7BFF},
      {"65519", 65519.0f, 0x7BFF},
      {"65536", 65536.0f, 0x7C00},
      {"float's largest finite -> +inf", std::numeric_limits<float>::max(), 0x7C00},
      {"+inf", inf, 0x7C00},
  };
  check_table<f16>(std::begin(table), std::end(table));
  CHECK(f16(-0.0f).bits == 0x8000);
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
                    from_bits(0x7F800001u), from_bits(0x7FFFFFFFu)}) {
    for (float signed_nan : {nan, -nan}) {
      const std::uint16_t b = f16(signed_nan).bits;
      CHECK(f16_is_nan(b));
      CHECK((b & 0x0200) != 0);  // quiet
      CHECK(((b & 0x8000) != 0) == std::signbit(signed_nan));
      CHECK(std::isnan(float(f16::from_bits(b))));
    }
  }
}

TEST_CASE("bf16: edge values round to nearest, ties to even, in both signs") {
  const float inf = std::numeric_limits<float>::infinity();
  const edge table[] = {
      {"+0", 0.0f, 0x0000},
      {"smallest subnormal 2^-133", 0x1p-133f, 0x0001},
      {"largest subnormal 127 · 2^-133", from_bits(0x007F0000u), 0x007F},
      {"smallest normal 2^-126", 0x1p-126f, 0x0080},
      {"1", 1.0f, 0x3F80},
      {"1 + 1 ulp", 0x1.02p0f, 0x3F81},
      {"largest finite (2 - 2^-7) · 2^127", from_bits(0x7F7F0000u), 0x7F7F},
      {"tie 1 + 2^-8 -> even 0x3F80 (down)", 0x1.01p0f, 0x3F80},
      {"just above that tie", up(0x1.01p0f), 0x3F81},
      {"just below that tie", down(0x1.01p0f), 0x3F80},
      {"tie 1 + 3 · 2^-8 -> even 0x3F82 (up)", 0x1.03p0f, 0x3F82},
      {"just above that tie", up(0x1.03p0f), 0x3F82},
      {"just below that tie", down(0x1.03p0f), 0x3F81},
      {"tie 2 - 2^-8 -> next binade 2", 0x1.ffp0f, 0x4000},
      {"just below 2 - 2^-8 -> 2 - 2^-7", down(0x1.ffp0f), 0x3FFF},
      {"tie 2^-134 (half the smallest subnormal) -> even 0", 0x1p-134f, 0x0000},
      {"just above 2^-134 -> smallest subnormal", up(0x1p-134f), 0x0001},
      {"float's smallest subnormal 2^-149 -> 0", from_bits(0x00000001u), 0x0000},
      {"subnormal tie 1.5 · 2^-133 -> even 0x0002", from_bits(0x00018000u), 0x0002},
      {"subnormal tie 2.5 · 2^-133 -> even 0x0002", from_bits(0x00028000u), 0x0002},
      {"tie 127.5 · 2^-133 -> smallest normal", from_bits(0x007F8000u), 0x0080},
      {"just below 127.5 · 2^-133 stays subnormal", from_bits(0x007F7FFFu), 0x007F},
      {"tie above the largest finite -> +inf", from_bits(0x7F7F8000u), 0x7F80},
      {"just below that tie -> largest finite", from_bits(0x7F7F7FFFu), 0x7F7F},
      {"float's largest finite -> +inf", std::numeric_limits<float>::max(), 0x7F80},
      {"+inf", inf, 0x7F80},
  };
  check_table<bf16>(std::begin(table), std::end(table));
  CHECK(bf16(-0.0f).bits == 0x8000);
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
                    from_bits(0x7F800001u), from_bits(0x7FFFFFFFu)}) {
    for (float signed_nan : {nan, -nan}) {
      const std::uint16_t b = bf16(signed_nan).bits;
      CHECK(bf16_is_nan(b));
      CHECK((b & 0x0040) != 0);  // quiet
      CHECK(((b & 0x8000) != 0) == std::signbit(signed_nan));
      CHECK(std::isnan(float(bf16::from_bits(b))));
    }
  }
}

TEST_CASE("half -> float is exact: all 65536 bit patterns survive the round trip") {
  int f16_bad = 0, bf16_bad = 0;
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = float(f16::from_bits(bits));
    const std::uint16_t back = f16(x).bits;
    if (f16_is_nan(bits) ? !(std::isnan(x) && f16_is_nan(back)) : back != bits) ++f16_bad;
    // Exactness checked independently of the conversion back: the value formula of binary16.
    if (!f16_is_nan(bits) && (bits & 0x7C00) != 0x7C00) {
      const int e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
      const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
      const bool negative = (bits & 0x8000) != 0;
      if (static_cast<double>(x) != (negative ? -v : v) || std::signbit(x) != negative) ++f16_bad;
    }
    const float y = float(bf16::from_bits(bits));
    const std::uint16_t back_b = bf16(y).bits;
    if (bf16_is_nan(bits) ? !(std::isnan(y) && bf16_is_nan(back_b)) : back_b != bits) ++bf16_bad;
    if (std::bit_cast<std::uint32_t>(y) != b << 16) ++bf16_bad;
  }
  CHECK(f16_bad == 0);
  CHECK(bf16_bad == 0);
}

TEST_CASE("float -> half agrees bit for bit with a double-arithmetic reference on a dense sweep") {
  REQUIRE(std::fesetround(FE_TONEAREST) == 0);
  // Every 31st float bit pattern in [0, 70000] and its negative: 31 is odd, so every residue of the 13 (f16) and 16
  // (bf16) dropped bits is visited, ties included.
  const std::uint32_t last = std::bit_cast<std::uint32_t>(70000.0f);
  long f16_bad = 0, bf16_bad = 0, count = 0;
  std::uint32_t first_f16_bad = 0, first_bf16_bad = 0;
  for (std::uint32_t u = 0; u <= last; u += 31) {
    for (std::uint32_t s : {0u, 0x80000000u}) {
      const float f = std::bit_cast<float>(u | s);
      if (f16(f).bits != f16_reference(f) && f16_bad++ == 0) first_f16_bad = u | s;
      if (bf16(f).bits != bf16_reference(f) && bf16_bad++ == 0) first_bf16_bad = u | s;
      ++count;
    }
  }
  INFO("first f16 mismatch at float bits ", hex(first_f16_bad), ", first bf16 mismatch at ", hex(first_bf16_bad));
  CHECK(count > 70'000'000);
  CHECK(f16_bad == 0);
  CHECK(bf16_bad == 0);
  // bf16 keeps float's range: also sweep the top of it, the overflow threshold 0x7F7F8000 included.
  long top_bad = 0;
  for (std::uint32_t u = 0x7F000000u; u < 0x7F800000u; u += 31)
    for (std::uint32_t s : {0u, 0x80000000u}) {
      const float f = std::bit_cast<float>(u | s);
      top_bad += bf16(f).bits != bf16_reference(f);
    }
  CHECK(top_bad == 0);
  CHECK(bf16(from_bits(0x7F7F8000u)).bits == bf16_reference(from_bits(0x7F7F8000u)));
}
