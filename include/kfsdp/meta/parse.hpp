#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp's one reader of numbers and switches written as text: environment variables, the example
// programs' flags, the numbers in checkpoint metadata. Strict: the whole text or nothing, no sign,
// space or suffix on a count, no overflow; a bad value throws std::invalid_argument naming what was
// read, the text seen and what is expected (a session's run() prints it as "error: ..." and exits 2).
//
//   kfsdp::parse_count("64", "--width")            -> 64
//   kfsdp::parse_count("64abc", "--width")         -> throws "--width is '64abc', expected a whole number >= 0"
//   kfsdp::parse_count("-1", "--width")            -> throws (no sign)
//   kfsdp::parse_count("99999999999999999999", "--width")   -> throws (over 2^64 - 1)
//   kfsdp::parse_real("1e-3", "--lr")              -> 0.001 (finite only)
//   kfsdp::parse_switch("off", "KFSDP_SHARED_MEMORY")       -> false (1, on, 0, off)

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

namespace kfsdp {

/// A whole number in [least, most] written in decimal digits alone; throws std::invalid_argument
/// "<what> is '<text>', expected ...".
KFSDP_EXPORT inline std::uint64_t parse_count(std::string_view text, std::string_view what, std::uint64_t least = 0,
                                              std::uint64_t most = std::numeric_limits<std::uint64_t>::max()) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (!digits || error != std::errc{} || stop != end || value < least || value > most) {
    const std::string range = most == std::numeric_limits<std::uint64_t>::max()
                                  ? fmt::format(">= {}", least)
                                  : fmt::format("from {} to {}", least, most);
    throw std::invalid_argument(fmt::format("{} is '{}', expected a whole number {}", what, text, range));
  }
  return value;
}

/// A finite number in [least, most] (decimal or exponent notation, the whole text); throws
/// std::invalid_argument as parse_count does.
KFSDP_EXPORT inline double parse_real(std::string_view text, std::string_view what,
                                      double least = -std::numeric_limits<double>::max(),
                                      double most = std::numeric_limits<double>::max()) {
  double value = 0;
  // from_chars takes no '+'; one is skipped, but not before a '-' ("+-1" is not -1).
  const char* begin = text.data() + (text.starts_with('+') && !text.substr(1).starts_with('-') ? 1 : 0);
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(begin, end, value);
  if (text.empty() || error != std::errc{} || stop != end || !std::isfinite(value) || value < least || value > most) {
    const std::string range = least == -std::numeric_limits<double>::max()
                                  ? (most == std::numeric_limits<double>::max() ? std::string("a finite number")
                                                                                : fmt::format("a number <= {}", most))
                              : most == std::numeric_limits<double>::max() ? fmt::format("a number >= {}", least)
                                                                           : fmt::format("a number from {} to {}", least, most);
    throw std::invalid_argument(fmt::format("{} is '{}', expected {}", what, text, range));
  }
  return value;
}

/// A switch: 1 or on, 0 or off; throws std::invalid_argument as parse_count does.
KFSDP_EXPORT inline bool parse_switch(std::string_view text, std::string_view what) {
  if (text == "1" || text == "on") return true;
  if (text == "0" || text == "off") return false;
  throw std::invalid_argument(fmt::format("{} is '{}', expected 1, on, 0 or off", what, text));
}

}  // namespace kfsdp
