// libFuzzer target for kfsdp::parse_count, parse_real and parse_switch (kfsdp/meta/parse.hpp; clang builds):
//   CXX=clang++-19 meson setup build-fuzz -Dbenches=false && ninja -C build-fuzz test/meta/fuzz_parse
//   mkdir -p fuzz-work && build-fuzz/test/meta/fuzz_parse fuzz-work test/meta/corpus_parse
// Every parser gets the whole input. Each returns a value or throws std::invalid_argument naming
// the text; anything else (a crash, a sanitizer report, another exception, a value that does not
// read back from its own decimal text, a text accepted that the documented grammar refuses) is a bug.
#include <kfsdp/meta/parse.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace {

void check(bool property) {
  if (!property) __builtin_trap();
}

// Decimal digits alone, no more than 2^64 - 1: what parse_count documents it accepts.
bool is_count(std::string_view text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return false;
  std::uint64_t value = 0;
  for (const char c : text)
    if (__builtin_mul_overflow(value, 10u, &value) || __builtin_add_overflow(value, std::uint64_t(c - '0'), &value))
      return false;
  return true;
}

void fuzz_count(std::string_view text) {
  std::uint64_t value = 0;
  try {
    value = kfsdp::parse_count(text, "--count");
  } catch (const std::invalid_argument&) {
    check(!is_count(text));
    return;
  }
  check(is_count(text));
  // The value's own text reads back the same, and is the input without its leading zeros.
  const std::string written = fmt::to_string(value);
  check(kfsdp::parse_count(written, "--count") == value && written == std::to_string(value));
  const std::size_t first = std::min(text.find_first_not_of('0'), text.size() - 1);
  check(text.substr(first) == written);
  // Bounds only narrow what is accepted.
  try {
    const std::uint64_t bounded = kfsdp::parse_count(text, "--count", 3, 1000);
    check(bounded == value && bounded >= 3 && bounded <= 1000);
  } catch (const std::invalid_argument&) {
    check(value < 3 || value > 1000);
  }
}

void fuzz_real(std::string_view text) {
  double value = 0;
  try {
    value = kfsdp::parse_real(text, "--lr");
  } catch (const std::invalid_argument&) {
    return;
  }
  check(std::isfinite(value));
  // Decimal or exponent notation, one optional sign: no space, hex, inf or nan, no "+-".
  check(text.find_first_not_of("0123456789.eE+-") == std::string_view::npos);
  const std::string_view unsigned_text = text.substr(text.starts_with('+') || text.starts_with('-') ? 1 : 0);
  check(!unsigned_text.empty() && unsigned_text.front() != '+' && unsigned_text.front() != '-');
  check(!text.starts_with('+') || !std::signbit(value));
  // The shortest text fmt writes reads back as the same double.
  check(kfsdp::parse_real(fmt::format("{}", value), "--lr") == value);
  try {
    const double bounded = kfsdp::parse_real(text, "--lr", 0.0, 1.0);
    check(bounded == value && bounded >= 0.0 && bounded <= 1.0);
  } catch (const std::invalid_argument&) {
    check(!(value >= 0.0 && value <= 1.0));
  }
}

void fuzz_switch(std::string_view text) {
  const bool documented = text == "1" || text == "on" || text == "0" || text == "off";
  try {
    const bool value = kfsdp::parse_switch(text, "KFSDP_SWITCH");
    check(documented && value == (text == "1" || text == "on"));
  } catch (const std::invalid_argument&) {
    check(!documented);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz_count(text);
  fuzz_real(text);
  fuzz_switch(text);
  return 0;
}
