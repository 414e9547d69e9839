#pragma once
// kfsdp::math::fast_erf: erf without libm, written so that a compiler vectorises it inside a
// Kokkos::parallel_for (std::erf is a scalar call that stops the loop from vectorising).
//
// Method: two fits, both evaluated for every element and one chosen:
//   |x| < 1:  erf(x) = x · P(x²), P a Chebyshev fit of erf(√s)/√s on s in [0, 1];
//   |x| ≥ 1:  erf(x) = ±(1 − exp(−x² + L(|x|))), L a Chebyshev fit of log(erfc(a) · exp(a²)), the
//             log of the scaled complementary error function, smooth and slowly varying on [1, 6];
//   exp is Cody–Waite reduction y = k ln 2 + r, a polynomial in r, and 2^k made from bits.
// Worked note: at a = 2, L(2) = log(erfc(2) e⁴) = −1.36494, so erf(2) = 1 − e^(−4 − 1.36494) = 0.995322;
// since the tail needs erfc only to an absolute 1e-17 the exp argument's rounding (≤ 36 · 2⁻⁵³ at
// a = 6, where erfc = 2e-17) costs nothing. Beyond |x| = 6 (double) or 4 (float) erf rounds to ±1:
// |x| is clamped there, so ±inf give ±1 and NaN stays NaN.
//
// double: computed in double and chosen by selects (so GCC leaves its loops scalar: see below).
// float: computed in float, 4 lanes with SSE2, in the same two pieces with shorter fits:
//   |x| < 1: x + x · Y(x²), Y = P − 1, so that Y's rounding (|Y| ≤ 0.16) is a small part of the
//            result's; |x| ≥ 1: 1 − exp(L − a²) with a float exp (Cephes expf's polynomial). The
//   erfc of the tail is ≤ 0.157, so its relative error of a few 2⁻²⁴ is < 0.4 ulp of 1 − erfc.
//   Coefficients rounded to float one at a time from the highest, refitting the rest.
//   No select with a constant arm and no select of the two pieces: clamps and choices are integer
//   arithmetic on the bits. GCC turns a select into a branch and moves into its arms the
//   arithmetic that feeds or follows it (threading, sinking); under -ftrapping-math (its default)
//   if-conversion will not then execute those floating-point operations unconditionally, and the
//   loop is left scalar ("control flow in loop"). Polynomials partly in Estrin form: the loop is
//   bound by latency. gelu forward + backward on 4M floats (bench/bench_kernels, gelu row): about
//   3× faster than libm's erf and exp.
// Accuracy (test/nn/test_erf.cpp): float ≤ 1 ulp from (float)std::erf(double(x)) (every float in
// [0, 4.2] checked once: 1 ulp on 5.9% of them, never 2); double within 1e-15 · max(1, |std::erf|)
// absolute of std::erf.
// Coefficients: mpmath.chebyfit (double: in u in [-1, 1], u = 2s − 1 for P, u = (a − mid) / half
// for L; float: Y in s on [0, 1], L in u = (a − 2.5) / 1.5).

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace kfsdp::math {

namespace detail {

// c0 xⁿ + c1 xⁿ⁻¹ + ... + cn, by Horner's rule (the coefficients from the highest power down).
template <class T, class... C>
KOKKOS_FORCEINLINE_FUNCTION T horner(T x, T first, C... rest) {
  T p = first;
  ((p = p * x + T(rest)), ...);
  return p;
}

// 2^k for an integer k in [-1022, 1023] held as `shifted` = k + 0x1.8p52: its low bits are k.
KOKKOS_FORCEINLINE_FUNCTION double power_of_two_from_shifted(double shifted) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &shifted, sizeof bits);  // memcpy: the bit cast that host and device compilers both accept
  bits = (bits + 1023) << 52;                 // the low 12 bits of k + 1023 become the sign and exponent
  double scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  return scale;
}

// exp(y) for y in [-708, 0] to ~1 ulp (Taylor to r^13 leaves 5e-18 at |r| = ln 2 / 2); no libm call.
KOKKOS_FORCEINLINE_FUNCTION double exp_nonpositive(double y) {
  constexpr double log2e = 1.4426950408889634074, shifter = 0x1.8p52;
  constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;  // k · ln2_hi exact
  const double shifted = y * log2e + shifter;  // rounds y / ln 2 to the integer k in its low mantissa bits
  const double k = shifted - shifter;
  const double r = (y - k * ln2_hi) - k * ln2_lo;
  // Taylor to r^13: 1/13!, 1/12!, ..., 1/2, 1, 1.
  const double p = detail::horner(r, 1.0 / 6227020800, 1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880,
      1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0);
  return p * power_of_two_from_shifted(shifted);
}

// Float bit operations written as memcpy, which host and device compilers accept and which
// vectorise (GCC turns the copies into register moves): |x| and copysign without branches.
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t bits_of(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

KOKKOS_FORCEINLINE_FUNCTION float float_of(std::uint32_t bits) {
  float x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// min(a, b) for a, b < 2^31 as integer arithmetic with no comparison, which GCC cannot turn into
// a branch (see the top of this file). C++20 defines >> of a negative int as arithmetic.
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t min_bits(std::uint32_t a, std::uint32_t b) {
  const std::int32_t d = std::int32_t(b) - std::int32_t(a);  // < 0 where a > b
  return std::uint32_t(std::int32_t(a) + (d & (d >> 31)));
}

// All ones where a ≤ b, else 0 (a, b < 2^31), with no comparison.
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t not_above_mask(std::uint32_t a, std::uint32_t b) {
  return ~std::uint32_t((std::int32_t(b) - std::int32_t(a)) >> 31);
}

KOKKOS_FORCEINLINE_FUNCTION float abs_float(float x) { return float_of(bits_of(x) & 0x7fffffffU); }

// |magnitude| with the sign of `sign` (magnitude ≥ 0 or NaN).
KOKKOS_FORCEINLINE_FUNCTION float copy_sign_float(float magnitude, float sign) {
  return float_of(bits_of(magnitude) | (bits_of(sign) & 0x80000000U));
}

// exp(y) in float for y in [-87.3, 0] (NaN gives NaN), to about 1 ulp, with no branch and no call:
// y = k ln 2 + r, |r| ≤ ln 2 / 2, exp(r) = 1 + r + r² P(r) (Cephes expf's degree-5 P), 2^k from bits.
KOKKOS_FORCEINLINE_FUNCTION float exp_nonpositive_float(float y) {
  constexpr float log2e = 1.44269504F, shifter = 0x1.8p23F;
  constexpr float ln2_hi = 0.693359375F, ln2_lo = -2.12194440e-4F;  // ln2_hi has 9 bits: k · ln2_hi is exact
  const float shifted = y * log2e + shifter;  // rounds y / ln 2 to the integer k in its low mantissa bits
  const float k = shifted - shifter;
  const float r = (y - k * ln2_hi) - k * ln2_lo;
  const float r2 = r * r;  // Estrin, for the latency (see fast_erf)
  const float p = (5.0000001201e-1F + 1.6666665459e-1F * r) + r2 * (4.1665795894e-2F + 8.3334519073e-3F * r) +
                  (r2 * r2) * (1.3981999507e-3F + 1.9875691500e-4F * r);
  const float e = p * r2 + r + 1.0F;
  const float scale = float_of((bits_of(shifted) + 127U) << 23);  // 2^k, k + 127 in [1, 127]
  return e * scale;
}

}  // namespace detail

// exp(y) for y <= 0 without libm (0 below -708, where exp is subnormal): the Gaussian of gelu's derivative.
KOKKOS_FORCEINLINE_FUNCTION double fast_exp_nonpositive(double y) {
  const double clamped = y < -708 ? -708 : y;
  const double value = detail::exp_nonpositive(clamped);
  return y < -708 ? 0 : value;
}

// The float one: y > 0 is taken as −y (only y ≤ 0 is its domain).
KOKKOS_FORCEINLINE_FUNCTION float fast_exp_nonpositive(float y) {
  // |y| clamped to 87.3 (exp(-87.3) = 1.2e-38 is still normal) on its bits, which order like |y|;
  // beyond that the result is flushed to +0 by a mask, and a NaN is returned as itself. Integer
  // arithmetic instead of selects, so that the loop vectorises (see the top of this file).
  const std::uint32_t magnitude = detail::bits_of(y) & 0x7fffffffU, limit = detail::bits_of(87.3F);
  const float clamped = detail::float_of(detail::min_bits(magnitude, limit) | 0x80000000U);
  const std::uint32_t value_bits = detail::bits_of(detail::exp_nonpositive_float(clamped));
  const std::uint32_t nan = ~detail::not_above_mask(magnitude, 0x7f800000U);
  return detail::float_of(((value_bits & detail::not_above_mask(magnitude, limit)) & ~nan) |
                          (detail::bits_of(y) & nan));
}

KOKKOS_FORCEINLINE_FUNCTION double fast_erf(double x) {
  const double a = x < 0 ? -x : x;
  const double s = a * a;
  // P(u), u = 2 a² − 1: erf(x) / x on |x| < 1 (Chebyshev fit error 7e-18).
  const double u_small = 2 * s - 1;
  const double p = detail::horner(u_small, -3.8065912241221399e-13, 9.2112501874282304e-12, -2.035231956483527e-10,
      4.1157515002658853e-09, -7.51156925108609e-08, 1.2233827638093572e-06, -1.7537169441280198e-05,
      0.00021751715603563488, -0.0022854855611440855, 0.019852496688984218, -0.14053608902271711,
      0.96546873866986727);
  const double small = x * p;
  // L(u), u = (a − 3.5) / 2.5: log(erfc(a) e^(a²)) on [1, 6] (fit error · erfc below 3e-18).
  const double a_tail = a > 6 ? 6 : a;  // written so that NaN passes through
  const double u_tail = (a_tail - 3.5) * 0.4;
  const double l = detail::horner(u_tail, 2.2472763521074389e-09, -7.2408249745153269e-09, 4.5214162045836509e-09,
      4.7108405270992661e-09, -2.1580142736303587e-09, 1.8848830089033838e-08, -1.2999681259733388e-07,
      3.9189232885279243e-07, -9.1655075925352759e-07, 1.9126979860773401e-06, -3.4204246659666945e-06,
      4.5683976219076296e-06, -1.4780737118311842e-06, -1.8475289860008109e-05, 9.0901015515971757e-05,
      -0.00030781940159072446, 0.00089357657168803186, -0.0023739973006794987, 0.0059537044771415838,
      -0.014384548328888422, 0.03412841107971968, -0.081650909717857198, 0.20779340786106157, -0.66524897091297663,
      -1.8624374021481738);
  const double tail = 1 - detail::exp_nonpositive(l - a_tail * a_tail);
  const double signed_tail = x < 0 ? -tail : tail;
  return a < 1 ? small : signed_tail;
}

KOKKOS_FORCEINLINE_FUNCTION float fast_erf(float x) {
  const float a = detail::abs_float(x);
  const float s = a * a;
  // |x| < 1: erf(x) = x + x · Y(s), Y(s) = erf(√s)/√s − 1 (|Y| ≤ 0.16, so its rounding is a small
  // part of the result's; fit error 1.6e-8, from rounding the coefficients to float).
  const float y = detail::horner(s, 8.18125118e-05F, -8.10101221e-04F, 5.19771455e-03F, -2.68582497e-02F,
      1.12836786e-01F, -3.76126319e-01F, 1.28379166e-01F);
  const float small = x + x * y;  // keeps −0; for subnormal x only x · y rounds (≤ 1 ulp)
  // |x| ≥ 1: erf(|x|) = 1 − exp(L(u) − a²), u = (a − 2.5) / 1.5 on [1, 4], L = log(erfc(a) e^(a²))
  // (fit error 4.8e-8 in L, i.e. relative in erfc); erfc(4) = 1.5e-8 already rounds 1 − erfc to 1.0f.
  // a clamped to 4 on its bits (a ≥ 0 orders like its bits) rather than `a > 4 ? 4 : a`, so that
  // the loop vectorises (see the top of this file). NaN becomes 4 here; the final choice takes `small` (NaN).
  const float a_tail = detail::float_of(detail::min_bits(detail::bits_of(a), detail::bits_of(4.0F)));
  const float u = (a_tail - 2.5F) * (1.0F / 1.5F);
  const float s_tail = a_tail * a_tail;
  // Horner for the low-order terms, which set the rounding error; Estrin for the others, which
  // shortens the dependency chain (the loop is bound by latency, not by the count of operations).
  const float u2 = u * u;
  const float high = (-3.66471037e-02F + 1.09616788e-02F * u) + u2 * (-3.19142174e-03F + 8.80535285e-04F * u) +
                     (u2 * u2) * (-2.26770746e-04F + 4.19583994e-05F * u);
  const float l = detail::horner(u, high * u + 1.26239210e-01F, -5.29021084e-01F, -1.55681527e+00F);
  const float tail = 1.0F - detail::exp_nonpositive_float(l - s_tail);
  // The choice between the two, as a bit mask too: a select here would let GCC sink the tail's
  // arithmetic into a branch that if-conversion cannot undo. NaN (bits above +inf's) takes small.
  const std::uint32_t a_bits = detail::bits_of(a);
  const std::uint32_t use_tail =
      detail::not_above_mask(detail::bits_of(1.0F), a_bits) & detail::not_above_mask(a_bits, 0x7f800000U);
  return detail::float_of((detail::bits_of(detail::copy_sign_float(tail, x)) & use_tail) |
                          (detail::bits_of(small) & ~use_tail));
}

}  // namespace kfsdp::math
