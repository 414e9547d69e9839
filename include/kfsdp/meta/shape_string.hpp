#pragma once
// shape_string(extents) -> "[768, 3072]": how every kfsdp message and table writes a shape (the
// one formatter: the layers' checks, the plan tables and the safetensors reader all call it).

#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kfsdp {

template <class Extents>
std::string shape_string(const Extents& extents) {
  return fmt::format("[{}]", fmt::join(extents, ", "));
}

}  // namespace kfsdp
