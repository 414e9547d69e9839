#pragma once
// shape_string(extents) -> "[768, 3072]": how every kfsdp message and table writes a shape.

#include <string>

namespace kfsdp {

template <class Extents>
std::string shape_string(const Extents& extents) {
  std::string out = "[";
  bool first = true;
  for (const auto e : extents) {
    out += (first ? "" : ", ") + std::to_string(e);
    first = false;
  }
  return out + "]";
}

}  // namespace kfsdp
