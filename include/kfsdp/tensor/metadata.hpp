#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io::metadata_map — a file's `__metadata__`: what the safetensors format writes and the
// checkpoint protocol (tensor/stateful.hpp) reads back, in a header of its own so that neither
// pulls the other (nor Kokkos) in.

#include <functional>
#include <map>
#include <string>

namespace kfsdp::io {

/// `__metadata__`: string keys to string values, written in key order.
KFSDP_EXPORT using metadata_map = std::map<std::string, std::string, std::less<>>;

}  // namespace kfsdp::io
