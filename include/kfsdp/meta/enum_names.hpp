#pragma once
// An enumeration's names, one table an enumeration (`*_names`), read both ways: name_of for its
// to_string, parse_named for its parse_* (an error that names what was parsed, the text and the
// choices, in the table's order).
//
//   inline constexpr enum_names<bucketing, 3> bucketing_names = {
//       {bucketing::none, "none"}, {bucketing::layer, "layer"}, {bucketing::block, "block"}};
//   name_of(bucketing_names, bucketing::layer)          // "layer"
//   parse_named("layer", bucketing_names, "bucketing")  // bucketing::layer
//   parse_named("Layer", bucketing_names, "bucketing")
//   // throws std::invalid_argument("kfsdp: bucketing 'Layer' is not one of none, layer, block")

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kfsdp {

template <class E>
struct enum_name {
  E value;
  std::string_view name;
};

// The table: every value of E with its name.
template <class E, std::size_t N>
using enum_names = enum_name<E>[N];

// `value`'s name in `names`; "?" for a value the table lacks.
template <class E, std::size_t N>
constexpr std::string_view name_of(const enum_names<E, N>& names, E value) noexcept {
  for (const enum_name<E>& entry : names)
    if (entry.value == value) return entry.name;
  return "?";
}

// The value named `text` in `names`; anything else throws naming `what`, the text and the names.
template <class E, std::size_t N>
E parse_named(std::string_view text, const enum_names<E, N>& names, std::string_view what) {
  std::string choices;
  for (const enum_name<E>& entry : names) {
    if (entry.name == text) return entry.value;
    choices += (choices.empty() ? "" : ", ") + std::string(entry.name);
  }
  throw std::invalid_argument("kfsdp: " + std::string(what) + " '" + std::string(text) + "' is not one of " + choices);
}

}  // namespace kfsdp
