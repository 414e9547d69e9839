#pragma once
// Size arithmetic that stops instead of wrapping: checked_mul and checked_add throw
// std::overflow_error naming what is computed and the operands; static_mul is the same product of
// two static extents, rejected at compile time. The descriptors, the parameter table, the shard
// plan, the nn layers and the network size their buffers with these.

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace kfsdp {

// a · b and a + b, or std::overflow_error naming what is computed and the operands (sizes near
// 2^64 must stop with a message, not wrap around into a small allocation). `what` is called only
// to build that message:
//   checked_mul(std::size_t(1) << 40, std::size_t(1) << 30, [] { return "fc.weight's elements"; })
//     -> throws "kfsdp: fc.weight's elements: 1099511627776 · 1073741824 overflows 64 bits"
template <class What>
constexpr std::size_t checked_mul(std::size_t a, std::size_t b, What&& what) {
  if (b != 0 && a > std::size_t(-1) / b)
    throw std::overflow_error("kfsdp: " + std::string(what()) + ": " + std::to_string(a) + " · " + std::to_string(b) +
                              " overflows 64 bits");
  return a * b;
}
template <class What>
constexpr std::size_t checked_add(std::size_t a, std::size_t b, What&& what) {
  if (a > std::size_t(-1) - b)
    throw std::overflow_error("kfsdp: " + std::string(what()) + ": " + std::to_string(a) + " + " + std::to_string(b) +
                              " overflows 64 bits");
  return a + b;
}

// Whether the product of these sizes fits 64 bits: for static_asserts on static extents.
constexpr bool product_fits(std::initializer_list<std::size_t> factors) {
  std::size_t product = 1;
  for (std::size_t f : factors) {
    if (f != 0 && product > std::size_t(-1) / f) return false;
    product *= f;
  }
  return true;
}

// A · B of two static extents; a product past 2^64 does not compile.
template <std::size_t A, std::size_t B>
consteval std::size_t static_mul() {
  static_assert(B == 0 || A <= std::size_t(-1) / B, "kfsdp: a product of static extents overflows 64 bits");
  return A * B;
}

}  // namespace kfsdp
