#pragma once
// parse_named — an enumeration's value from its name, the inverse of its to_string (found by
// argument-dependent lookup), with an error that names what was parsed, the text and the choices.
//
//   parse_named("layer", {bucketing::none, bucketing::layer, bucketing::block}, "bucketing")  // layer
//   parse_named("Layer", {...}, "bucketing")
//   // throws std::invalid_argument("kfsdp: bucketing 'Layer' is not one of none, layer, block")

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kfsdp {

template <class E>
E parse_named(std::string_view text, std::initializer_list<E> values, std::string_view what) {
  std::string names;
  for (E value : values) {
    if (to_string(value) == text) return value;
    names += (names.empty() ? "" : ", ") + std::string(to_string(value));
  }
  throw std::invalid_argument("kfsdp: " + std::string(what) + " '" + std::string(text) + "' is not one of " + names);
}

}  // namespace kfsdp
