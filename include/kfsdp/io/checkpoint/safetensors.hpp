#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io safetensors — the file format alone (no MPI, no Kokkos): build a header that says where
// every tensor's bytes go, and parse and validate the header of an existing file.
//
// Layout of a file:  [N: 8-byte little-endian u64][N bytes of JSON header][data section]
//   header  {"__metadata__": {"k": "v"}, "w": {"dtype": "F32", "shape": [2, 3],
//            "data_offsets": [0, 24]}, ...}      offsets count from the start of the data section
//   N is padded with spaces so that the data section starts at a multiple of 8 bytes.
//   Tensors are row-major, little-endian, contiguous, in the order given, with no holes.
//
//   auto layout = kfsdp::io::make_header({{"w", dtype::F32, {2, 3}}, {"b", dtype::F32, {3}}},
//                                        {{"format", "pt"}});
//   write(file, 0, layout.prefix);                        // rank 0 (or everyone, same bytes)
//   write(file, layout.tensors[0].begin + my_row_offset, my_rows);  // each rank its own range
//   ...
//   auto table = kfsdp::io::parse_header(first_bytes, file_size, "model.safetensors");
//   const auto& w = table.at("w");                        // w.begin, w.end: absolute file offsets
//
// Every malformed input makes parse_header throw format_error naming the file (and the tensor,
// where there is one); no input makes it crash or read out of bounds.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/tensor/dtype.hpp>  // dtype, dtype_of, dtype_name, dtype_size, parse_dtype
#include <kfsdp/tensor/metadata.hpp>  // metadata_map

namespace kfsdp::io {

/// A safetensors file that is malformed; the message names the file and, where it applies, the
/// tensor:  "safetensors file 'model.safetensors': tensor 'w': dtype 'F31' is unknown ..."
class format_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What the writer knows about a tensor before it is written: name, element type, shape.
///
///   kfsdp::io::tensor_entry{"transformer.h.0.attn.c_attn.weight", dtype::F32, {768, 2304}}
struct tensor_entry {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::uint64_t> shape;  // [] is a scalar (one element); a 0 extent is an empty tensor
};

/// A tensor's place in a file: [begin, end) are ABSOLUTE file offsets (header included).
struct tensor_info {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  [[nodiscard]] std::uint64_t size_bytes() const noexcept { return end - begin; }
  [[nodiscard]] std::uint64_t element_count() const noexcept;  // product of the shape
  // Absolute file offset of row `row` (dim 0) of a tensor with at least one dimension.
  [[nodiscard]] std::uint64_t row_offset(std::uint64_t row) const;
};

/// What make_header gives a writer: the bytes to put at offset 0 and where each tensor goes.
struct file_layout {
  std::vector<std::byte> prefix;    // 8-byte length + JSON header + space padding
  std::vector<tensor_info> tensors; // in the order given, absolute offsets
  std::uint64_t data_offset = 0;    // == prefix.size(), a multiple of 8
  std::uint64_t file_size = 0;      // data_offset + all tensor bytes

  [[nodiscard]] std::string_view header_json() const noexcept;  // the JSON text inside prefix
};

/// The header for `tensors` (laid out contiguously in this order) and `metadata`.
/// Throws std::invalid_argument for a duplicate or reserved ("__metadata__") name, a name or
/// metadata string that is not valid UTF-8, or a tensor too large for 64-bit offsets.
///
///   auto layout = make_header({{"w", dtype::F64, {4, 2}}}, {{"step", "100"}});
///   layout.data_offset  -> 96 (say); layout.tensors[0].begin == layout.data_offset
[[nodiscard]] file_layout make_header(const std::vector<tensor_entry>& tensors,
                                      const metadata_map& metadata = {});

/// Collects tensors and metadata, then forwards to make_header.
///
///   kfsdp::io::header_builder builder;
///   builder.add_tensor("w", dtype::F32, {4, 2}).add_metadata("w.checksum", checksum_hex(state));
///   file_layout layout = builder.build();
class header_builder {
 public:
  header_builder& add_tensor(std::string name, dtype type, std::vector<std::uint64_t> shape);
  header_builder& add_metadata(std::string key, std::string value);
  [[nodiscard]] file_layout build() const { return make_header(tensors_, metadata_); }

  [[nodiscard]] const std::vector<tensor_entry>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const metadata_map& metadata() const noexcept { return metadata_; }

 private:
  std::vector<tensor_entry> tensors_;
  metadata_map metadata_;
};

struct header_table;

/// Largest header accepted (as the reference implementation: 100 MB).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
/// Deepest nesting of JSON arrays and objects accepted in a header (safetensors needs 3).
inline constexpr std::size_t max_json_depth = 64;

/// The header length N from the file's first 8 bytes, checked against the file size, so that a
/// reader knows how many bytes (8 + N) to read before parse_header.
///
///   auto n = header_length(first_8_bytes, file_size, "model.safetensors");
[[nodiscard]] std::uint64_t header_length(std::span<const std::byte> first_bytes,
                                          std::uint64_t file_size, std::string_view file_name);

/// Parses and validates a header. `file_prefix` starts at file offset 0 and holds at least the
/// 8 + N header bytes (the whole file is fine); `file_size` is the size of the whole file, against
/// which the offsets are checked; `file_name` is used only in messages.
/// Throws format_error for: a header length over the file or over max_header_bytes; text that is
/// not JSON (bad syntax, invalid UTF-8, nesting over max_json_depth) or JSON followed by anything
/// but spaces; duplicate keys; an unknown dtype; a shape or offset that is not an unsigned 64-bit
/// integer; shape × dtype size ≠ byte range; offsets past the data; ranges that overlap or leave
/// holes (the data section must be exactly covered); a non-string metadata value.
///
///   auto table = parse_header(prefix, file_size, "ckpt/step_100.safetensors");
///   for (const auto& tensor : table.tensors) read(file, tensor.begin, tensor.size_bytes());
[[nodiscard]] header_table parse_header(std::span<const std::byte> file_prefix,
                                        std::uint64_t file_size, std::string_view file_name);

/// A validated header: every tensor's dtype, shape and absolute byte range.
struct header_table {
  metadata_map metadata;
  std::vector<tensor_info> tensors;  // in file order (by offset)
  std::uint64_t data_offset = 0;     // 8 + N
  std::uint64_t file_size = 0;
  std::string file_name;             // as given to parse_header, for messages

  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const tensor_info* find(std::string_view name) const noexcept;
  /// The tensor called `name`; throws std::out_of_range naming it when there is none.
  [[nodiscard]] const tensor_info& at(std::string_view name) const;

 private:
  friend header_table parse_header(std::span<const std::byte>, std::uint64_t, std::string_view);
  std::map<std::string, std::size_t, std::less<>> index_by_name_;
};

}  // namespace kfsdp::io
