// Polynomial checksum mod 2^61-1 (see include/kfsdp/io/checkpoint/checksum.hpp for the definition).
// Check: meson test -C <build> io_checksum
#include <kfsdp/io/checkpoint/checksum.hpp>

#include <array>

namespace kfsdp::io {
namespace {

constexpr std::uint64_t mersenne_61 = (std::uint64_t{1} << 61) - 1;
// Evaluation point: any fixed residue far from 0 and 1 works; this one is arbitrary.
constexpr std::uint64_t evaluation_point = 0x1d8e4e27c47d124fULL % mersenne_61;
constexpr std::size_t block_bytes = 32;

constexpr std::uint64_t reduce(unsigned __int128 value) noexcept {
  // Valid for value < 2^122: 2^61 = 1 (mod p), so fold the high part onto the low part once.
  const std::uint64_t folded = static_cast<std::uint64_t>(value & mersenne_61) +
                               static_cast<std::uint64_t>(value >> 61);
  return folded >= mersenne_61 ? folded - mersenne_61 : folded;
}

constexpr std::uint64_t multiply(std::uint64_t a, std::uint64_t b) noexcept {
  return reduce(static_cast<unsigned __int128>(a) * b);
}

constexpr std::uint64_t add(std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t sum = a + b;  // both < 2^61, no wrap
  return sum >= mersenne_61 ? sum - mersenne_61 : sum;
}

constexpr std::uint64_t power(std::uint64_t base, std::uint64_t exponent) noexcept {
  std::uint64_t result = 1;
  while (exponent != 0) {
    if (exponent & 1) result = multiply(result, base);
    base = multiply(base, base);
    exponent >>= 1;
  }
  return result;
}

// powers[k] = x^k, split into 32-bit halves so that the block sum vectorises in 64-bit lanes.
struct split_powers {
  std::array<std::uint64_t, block_bytes + 1> low{};
  std::array<std::uint64_t, block_bytes + 1> high{};
};

constexpr split_powers make_split_powers() noexcept {
  split_powers powers;
  std::uint64_t value = 1;
  for (std::size_t k = 0; k <= block_bytes; ++k) {
    powers.low[k] = value & 0xffffffffULL;
    powers.high[k] = value >> 32;
    value = multiply(value, evaluation_point);
  }
  return powers;
}

constexpr split_powers block_powers = make_split_powers();
constexpr std::uint64_t x_to_block = power(evaluation_point, block_bytes);

std::uint64_t mix64(std::uint64_t z) noexcept {
  // splitmix64's finaliser: a bijection that spreads every input bit over the output.
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ULL;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return z;
}

}  // namespace

void checksum_update(checksum_state& state, std::span<const std::byte> bytes) noexcept {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t remaining = bytes.size();
  std::uint64_t polynomial = state.polynomial;
  while (remaining >= block_bytes) {
    // sum_j b_j x^(31-j) < 2^74 in two 64-bit halves: low terms < 2^40, high terms < 2^37 each.
    std::uint64_t sum_low = 0;
    std::uint64_t sum_high = 0;
    for (std::size_t j = 0; j < block_bytes; ++j) {
      sum_low += data[j] * block_powers.low[block_bytes - 1 - j];
      sum_high += data[j] * block_powers.high[block_bytes - 1 - j];
    }
    const unsigned __int128 block_value =
        (static_cast<unsigned __int128>(sum_high) << 32) + sum_low;
    polynomial = add(multiply(polynomial, x_to_block), reduce(block_value));
    data += block_bytes;
    remaining -= block_bytes;
  }
  for (; remaining != 0; --remaining, ++data)
    polynomial = add(multiply(polynomial, evaluation_point), *data);
  state.polynomial = polynomial;
  state.length += bytes.size();
}

checksum_state checksum_of(std::span<const std::byte> bytes) noexcept {
  checksum_state state;
  checksum_update(state, bytes);
  return state;
}

checksum_state checksum_combine(const checksum_state& first, const checksum_state& second) noexcept {
  return {add(multiply(first.polynomial, power(evaluation_point, second.length)), second.polynomial),
          first.length + second.length};
}

std::uint64_t checksum_digest(const checksum_state& state) noexcept {
  // The implicit leading coefficient x^n makes "00 01" differ from "01".
  return mix64(add(power(evaluation_point, state.length), state.polynomial));
}

std::string format_hex64(std::uint64_t value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int position = 15; position >= 0; --position, value >>= 4)
    text[static_cast<std::size_t>(position)] = digits[value & 0xf];
  return text;
}

std::string checksum_hex(const checksum_state& state) { return format_hex64(checksum_digest(state)); }

}  // namespace kfsdp::io
