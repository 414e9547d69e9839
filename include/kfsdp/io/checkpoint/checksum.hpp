#pragma once
// kfsdp::io checksum — a fast 64-bit checksum of tensor bytes that can be computed piece by piece,
// in order (checksum_update) or from independent pieces combined afterwards (checksum_combine),
// so that each rank can checksum its own rows of a tensor and the results be joined in rank order.
//
// What it computes: the bytes b_0 .. b_{n-1} are the coefficients of a polynomial evaluated at a
// fixed point x modulo the Mersenne prime p = 2^61 - 1, with a leading 1 so that leading zero bytes
// count:  H = x^n + b_0 x^(n-1) + b_1 x^(n-2) + ... + b_{n-1}  (mod p), then bit-mixed to 64 bits.
// Because the state is (polynomial, length), two pieces combine as P_ab = P_a * x^(len_b) + P_b,
// which costs O(log len_b) multiplications; a split may fall at any byte, not only at row ends.
//
//   kfsdp::io::checksum_state whole;
//   kfsdp::io::checksum_update(whole, bytes);                          // all at once, or ...
//   auto first = kfsdp::io::checksum_of(bytes.first(100));             // ... rank 0's rows
//   auto second = kfsdp::io::checksum_of(bytes.subspan(100));          // ... rank 1's rows
//   assert(kfsdp::io::checksum_combine(first, second) == whole);
//   metadata["w.checksum"] = kfsdp::io::checksum_hex(whole);           // "1f0c9a..." (16 digits)
//
// It detects corruption (any single changed byte, swapped pieces, truncation); it is not a
// cryptographic hash.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace kfsdp::io {

/// Running checksum: the polynomial value (mod 2^61-1) of the bytes seen so far and their count.
///
///   kfsdp::io::checksum_state state;            // the checksum of no bytes
///   kfsdp::io::checksum_update(state, row_0);   // then row_1, row_2, ... in order
struct checksum_state {
  std::uint64_t polynomial = 0;  // b_0 x^(n-1) + ... + b_{n-1} mod 2^61-1, always < 2^61-1
  std::uint64_t length = 0;      // n, bytes seen

  friend bool operator==(const checksum_state&, const checksum_state&) = default;
};

/// Appends `bytes` to the running checksum (any split of the data gives the same result).
///
///   checksum_update(state, std::as_bytes(std::span(values)));
void checksum_update(checksum_state& state, std::span<const std::byte> bytes) noexcept;

/// The checksum of `bytes` alone, for combining later.
///
///   auto piece = checksum_of(std::as_bytes(std::span(my_rows)));
[[nodiscard]] checksum_state checksum_of(std::span<const std::byte> bytes) noexcept;

/// The checksum of the bytes of `first` followed by those of `second`.
///
///   checksum_combine(checksum_of(a), checksum_of(b)) == checksum_of(a followed by b)
[[nodiscard]] checksum_state checksum_combine(const checksum_state& first,
                                              const checksum_state& second) noexcept;

/// The 64-bit checksum value of everything appended so far.
///
///   std::uint64_t value = checksum_digest(state);
[[nodiscard]] std::uint64_t checksum_digest(const checksum_state& state) noexcept;

/// The digest as exactly 16 lowercase hex digits, for a safetensors `__metadata__` value.
///
///   checksum_hex(state) -> "03b9c1d0e4f5a617"
[[nodiscard]] std::string checksum_hex(const checksum_state& state);

/// Formats any 64-bit value as 16 lowercase hex digits: format_hex64(255) -> "00000000000000ff".
[[nodiscard]] std::string format_hex64(std::uint64_t value);

}  // namespace kfsdp::io
