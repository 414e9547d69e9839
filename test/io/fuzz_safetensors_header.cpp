// libFuzzer target for kfsdp::io::parse_header (clang builds only):
//   CXX=clang++-19 meson setup build-io-clang && ninja -C build-io-clang test/io/fuzz_safetensors_header
//   mkdir -p fuzz-work && build-io-clang/test/io/fuzz_safetensors_header fuzz-work test/io/corpus -max_total_time=60
// Any input may be rejected with format_error; anything else (a crash, a sanitizer report, another
// exception, an accepted header that does not survive a rewrite) is a bug.
#include <kfsdp/io/checkpoint/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace {

// Re-writes an accepted header with make_header and checks that it parses to the same table.
void check_rewrite(const kfsdp::io::header_table& table) {
  std::vector<kfsdp::io::tensor_entry> entries;
  for (const auto& tensor : table.tensors) entries.push_back({tensor.name, tensor.type, tensor.shape});
  const auto layout = kfsdp::io::make_header(entries, table.metadata);
  std::vector<std::byte> file = layout.prefix;
  file.resize(layout.file_size);
  const auto again = kfsdp::io::parse_header(file, file.size(), "rewrite");
  if (again.metadata != table.metadata || again.tensors.size() != table.tensors.size()) __builtin_trap();
  for (std::size_t index = 0; index < table.tensors.size(); ++index) {
    const auto& before = table.tensors[index];
    const auto& after = again.tensors[index];
    if (before.name != after.name || before.type != after.type || before.shape != after.shape ||
        before.begin - table.data_offset != after.begin - again.data_offset ||
        before.size_bytes() != after.size_bytes())
      __builtin_trap();
    if (again.find(before.name) != &after) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto table = kfsdp::io::parse_header(bytes, bytes.size(), "fuzz.safetensors");
    for (const auto& tensor : table.tensors)
      if (tensor.begin < table.data_offset || tensor.end > table.file_size) __builtin_trap();
    check_rewrite(table);
  } catch (const kfsdp::io::format_error&) {
  }
  // The same bytes as the prefix of a larger file (only the prefix was read).
  if (size > 0) {
    try {
      (void)kfsdp::io::parse_header(bytes, bytes.size() + data[0] * 1024ull, "fuzz.safetensors");
    } catch (const kfsdp::io::format_error&) {
    }
  }
  return 0;
}
