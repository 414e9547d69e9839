// Tests for include/kfsdp/io/checkpoint/checksum.hpp: any split gives the same checksum, in order or combined.
#include <doctest/doctest.h>
#include <kfsdp/io/checkpoint/checksum.hpp>

#include <random>
#include <vector>

namespace {

std::vector<std::byte> random_bytes(std::size_t count, unsigned seed) {
  std::mt19937 generator(seed);
  std::vector<std::byte> bytes(count);
  for (auto& byte : bytes) byte = static_cast<std::byte>(generator() & 0xff);
  return bytes;
}

}  // namespace

using kfsdp::io::checksum_combine;
using kfsdp::io::checksum_of;
using kfsdp::io::checksum_state;

TEST_CASE("checksum_update over pieces in order equals the checksum of the whole") {
  const auto bytes = random_bytes(301, 1);  // over several 32-byte blocks plus a tail
  const checksum_state whole = checksum_of(bytes);
  for (std::size_t split = 0; split <= bytes.size(); ++split) {
    checksum_state pieces;
    kfsdp::io::checksum_update(pieces, std::span(bytes).first(split));
    kfsdp::io::checksum_update(pieces, std::span(bytes).subspan(split));
    CAPTURE(split);
    CHECK(pieces == whole);
  }
}

TEST_CASE("checksum_combine of independent pieces equals the checksum of the whole") {
  const auto bytes = random_bytes(1000, 2);
  const checksum_state whole = checksum_of(bytes);
  // Three "ranks" with uneven rows, combined in rank order.
  for (const auto& [first_end, second_end] : {std::pair<std::size_t, std::size_t>{0, 0}, {1, 999},
                                             {333, 666}, {32, 64}, {1000, 1000}, {7, 8}}) {
    const auto rank_0 = checksum_of(std::span(bytes).first(first_end));
    const auto rank_1 = checksum_of(std::span(bytes).subspan(first_end, second_end - first_end));
    const auto rank_2 = checksum_of(std::span(bytes).subspan(second_end));
    CHECK(checksum_combine(checksum_combine(rank_0, rank_1), rank_2) == whole);
    CHECK(checksum_combine(rank_0, checksum_combine(rank_1, rank_2)) == whole);  // associative
  }
  CHECK(checksum_combine(checksum_state{}, whole) == whole);
}

TEST_CASE("checksum tells apart changed, swapped, truncated and zero-prefixed data") {
  auto bytes = random_bytes(256, 3);
  const auto digest = kfsdp::io::checksum_digest(checksum_of(bytes));
  for (std::size_t position : {0u, 1u, 31u, 32u, 255u}) {
    auto changed = bytes;
    changed[position] ^= std::byte{1};
    CHECK(kfsdp::io::checksum_digest(checksum_of(changed)) != digest);
  }
  const auto first = checksum_of(std::span(bytes).first(100));
  const auto second = checksum_of(std::span(bytes).subspan(100));
  CHECK(kfsdp::io::checksum_digest(checksum_combine(second, first)) != digest);
  CHECK(kfsdp::io::checksum_digest(checksum_of(std::span(bytes).first(255))) != digest);
  const std::vector<std::byte> one{std::byte{1}};
  const std::vector<std::byte> zero_one{std::byte{0}, std::byte{1}};
  CHECK(kfsdp::io::checksum_digest(checksum_of(one)) != kfsdp::io::checksum_digest(checksum_of(zero_one)));
  CHECK(kfsdp::io::checksum_digest(checksum_state{}) !=
        kfsdp::io::checksum_digest(checksum_of(std::vector<std::byte>(1))));
}

TEST_CASE("checksum_hex is 16 lowercase hex digits and stable across releases") {
  CHECK(kfsdp::io::format_hex64(255) == "00000000000000ff");
  CHECK(kfsdp::io::format_hex64(0xfedcba9876543210ULL) == "fedcba9876543210");
  // Pinned values: files written today must verify tomorrow, so the definition may not change.
  std::vector<std::byte> counting(100);
  for (std::size_t index = 0; index < counting.size(); ++index)
    counting[index] = static_cast<std::byte>(index);
  const std::string empty_hex = kfsdp::io::checksum_hex(checksum_state{});
  const std::string counting_hex = kfsdp::io::checksum_hex(checksum_of(counting));
  CHECK(empty_hex == "5692161d100b05e5");
  CHECK(counting_hex == "0c59640aba84c3ef");
}
