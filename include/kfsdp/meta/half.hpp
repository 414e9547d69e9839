#pragma once
// Two 16-bit floating-point element types, stored as their bits and converted in integer arithmetic:
//   kfsdp::bf16  bfloat16         1 sign, 8 exponent (bias 127), 7 mantissa bits: float's range, 8 bits of precision
//   kfsdp::f16   IEEE binary16    1 sign, 5 exponent (bias 15), 10 mantissa bits: largest finite 65504
// float -> half is explicit and rounds to nearest, ties to even, with gradual underflow into the subnormals, overflow
// to ±inf, ±inf kept and NaN kept as a quiet NaN of the same sign; half -> float is exact and implicit.
// Worked example (f16, then bf16):
//   f16(1.0f).bits == 0x3C00         0 01111 0000000000   exponent 15 - 15 = 0, mantissa 1.0
//   f16(65504.0f).bits == 0x7BFF     0 11110 1111111111   (2 - 2^-10) · 2^15, the largest finite
//   f16(1 + 2^-11) == 0x3C00         halfway between 0x3C00 and 0x3C01: the even one, 0x3C00, wins
//   f16(1 + 3 · 2^-11) == 0x3C02     halfway between 0x3C01 and 0x3C02: rounds up to the even 0x3C02
//   f16(65520.0f).bits == 0x7C00     halfway between 65504 (odd mantissa) and 2^16: ties to even = +inf
//   f16(0x1p-24f).bits == 0x0001     smallest subnormal; 0x1p-25f (a tie with 0) gives 0x0000
//   bf16(1.0f).bits == 0x3F80        the top 16 bits of float 1.0f (0x3F800000)
//   bf16(float bits 0x3F808000) == 0x3F80, bf16(float bits 0x3F818000) == 0x3F82   (ties to even)
//   bf16(float bits 0x7F7F8000) == 0x7F80 (+inf): the tie above the largest finite 0x7F7F rounds to even
// Kokkos 3.4's Kokkos::Experimental::half_t is plain float on a host-only build (KOKKOS_HALF_T_IS_FLOAT) and 3.4 has
// no bhalf_t, so these are kfsdp's own: trivially copyable, 2 bytes, no tables, callable in kernels.

#include <cstdint>
#include <cstring>
#include <type_traits>

// __builtin_bit_cast (GCC 11, clang 9, nvcc) makes the conversions constexpr and callable in device code, where
// std::bit_cast is a host function to nvcc; without it memcpy is the defined way to reinterpret, not constexpr.
#if defined(__has_builtin)
#if __has_builtin(__builtin_bit_cast)
#define KFSDP_HALF_BIT_CAST 1
#endif
#endif

// Kernel-callable where Kokkos (or a device compiler) is present, plain inline otherwise: the meta headers do not
// depend on Kokkos, and a CUDA/HIP translation unit gets __host__ __device__ even if Kokkos comes later.
#if defined(KOKKOS_INLINE_FUNCTION)
#define KFSDP_HALF_FUNCTION KOKKOS_INLINE_FUNCTION
#elif defined(__CUDACC__) || defined(__HIPCC__)
#define KFSDP_HALF_FUNCTION __host__ __device__ inline
#else
#define KFSDP_HALF_FUNCTION inline
#endif

#if defined(KFSDP_HALF_BIT_CAST)
#define KFSDP_HALF_CONSTEXPR constexpr
#else
#define KFSDP_HALF_CONSTEXPR
#endif

namespace kfsdp {

namespace half_detail {

KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION std::uint32_t float_bits(float f) {
#if defined(KFSDP_HALF_BIT_CAST)
  return __builtin_bit_cast(std::uint32_t, f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION float bits_float(std::uint32_t u) {
#if defined(KFSDP_HALF_BIT_CAST)
  return __builtin_bit_cast(float, u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// float -> bfloat16: the top 16 bits, rounded. Adding 0x7FFF plus the kept lsb rounds to nearest with ties to even;
// the carry walks into the exponent (next binade, or 0x7F80 = inf above the largest finite's midpoint), and float
// subnormals round into bf16 subnormals the same way since both share the exponent field.
KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION std::uint16_t bf16_from_float(float f) {
  const std::uint32_t u = float_bits(f);
  // NaN: keep the sign and the top payload bits, set the quiet bit (rounding could carry a NaN into inf).
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION float bf16_to_float(std::uint16_t h) {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

// float -> binary16, rounded to nearest with ties to even.
KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION std::uint16_t f16_from_float(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  // NaN: quiet (0x200), sign and the top payload bits kept.
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  // >= 65520 = 65504 + half an ulp (32): the tie goes to the even neighbour 2^16, i.e. inf; inf itself lands here too.
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a < 0x38800000u) {  // below 2^-14, the smallest normal: subnormal result in units of 2^-24
    // <= 2^-25 (half the smallest subnormal; the tie goes to the even 0) is ±0; this also covers float subnormals.
    if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;  // value = mant · 2^(e - 150)
    const std::uint32_t shift = 126u - (a >> 23);            // 14 .. 24: mant · 2^(e - 150) / 2^-24 = mant >> shift
    std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // r == 0x400 is the smallest normal: encoded correctly
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: rebias the exponent (127 -> 15), then drop 13 mantissa bits rounding as for bf16; a carry moves into
  // the exponent, and the bound above keeps it below inf.
  const std::uint32_t rebiased = a - (112u << 23);
  return static_cast<std::uint16_t>(sign | ((rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13));
}

KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (e == 31) return bits_float(sign | 0x7F800000u | (mant << 13));  // inf, or NaN with its payload and quietness
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);
  // Subnormal mant · 2^-24: normalise (at most 10 shifts; no clz so that device compilers need nothing extra).
  std::uint32_t fe = 113;  // float exponent field of 2^-14
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --fe;
  }
  return bits_float(sign | (fe << 23) | ((mant & 0x3FFu) << 13));
}

// The two encodings, as the type below takes them.
struct bf16_format {
  KFSDP_HALF_CONSTEXPR static KFSDP_HALF_FUNCTION std::uint16_t from_float(float f) { return bf16_from_float(f); }
  KFSDP_HALF_CONSTEXPR static KFSDP_HALF_FUNCTION float to_float(std::uint16_t b) { return bf16_to_float(b); }
};
struct f16_format {
  KFSDP_HALF_CONSTEXPR static KFSDP_HALF_FUNCTION std::uint16_t from_float(float f) { return f16_from_float(f); }
  KFSDP_HALF_CONSTEXPR static KFSDP_HALF_FUNCTION float to_float(std::uint16_t b) { return f16_to_float(b); }
};

}  // namespace half_detail

// A 16-bit float of the given encoding: its bits, and conversions from and to float.
template <class Format>
struct basic_half {
  std::uint16_t bits;

  basic_half() = default;  // trivial, like float: uninitialised unless value-initialised (bf16{} is +0)
  // Explicit: narrowing loses precision (and range for f16: above 65504 is inf), so it must be asked for.
  KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION explicit basic_half(float f) : bits(Format::from_float(f)) {}
  // double -> float -> half would round twice; convert to float first if that is what is meant.
  template <class T>
    requires std::is_same_v<T, double>
  explicit basic_half(T) = delete;

  static constexpr KFSDP_HALF_FUNCTION basic_half from_bits(std::uint16_t b) {
    basic_half h{};
    h.bits = b;
    return h;
  }
  // Implicit: widening to float is exact (like float -> double), so half values read as floats in arithmetic.
  KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION operator float() const { return Format::to_float(bits); }
  KFSDP_HALF_CONSTEXPR KFSDP_HALF_FUNCTION float to_float() const { return Format::to_float(bits); }
};

using bf16 = basic_half<half_detail::bf16_format>;
using f16 = basic_half<half_detail::f16_format>;

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && std::is_trivially_copyable_v<bf16> &&
              std::is_standard_layout_v<bf16> && std::is_trivially_default_constructible_v<bf16>);
static_assert(sizeof(f16) == 2 && alignof(f16) == 2 && std::is_trivially_copyable_v<f16> &&
              std::is_standard_layout_v<f16> && std::is_trivially_default_constructible_v<f16>);

}  // namespace kfsdp
