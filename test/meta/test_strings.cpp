#include <doctest/doctest.h>

#include <stdexcept>

#include <kfsdp/meta/fixed_string.hpp>
#include <kfsdp/meta/inline_string.hpp>

template <kfsdp::fixed_string S>
constexpr std::string_view name_of() { return S.view(); }

static_assert(name_of<"c_attn">() == "c_attn");
static_assert(kfsdp::fixed_string("abc").size() == 3);
static_assert(kfsdp::inline_string<8>("h").append(".").append_number(95).view() == "h.95");
static_assert(kfsdp::inline_string<4>().append_number(0).view() == "0");

TEST_CASE("inline_string appends and refuses to overflow") {
  kfsdp::inline_string<6> s("ab");
  s.append("cd").append_number(12);
  CHECK(s.view() == "abcd12");
  CHECK(s.size() == 6);
  CHECK_THROWS_AS(s.append("x"), std::length_error);
  CHECK(s.view() == "abcd12");  // nothing half-written
}
