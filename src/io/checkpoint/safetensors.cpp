// safetensors header: writer (make_header) and validating reader (parse_header): the schema (names,
// dtypes, shapes, offsets and what they mean) over the strict JSON reader of json_reader.hpp. Check: meson test -C <build> io_safetensors; fuzz: build-io-clang/test/io/
// fuzz_safetensors_header test/io/corpus (clang builds only).
//
// The reader works in two passes over the header text: first a pure syntax check of the whole
// text (so that broken JSON is always reported as such, with the byte where it breaks), then a
// schema pass that decodes names, dtypes, shapes and offsets and checks what they mean.
#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/meta/shape_string.hpp>

#include "json_reader.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <string>
#include <utility>

namespace kfsdp::io {
namespace {

using namespace json_detail;

// ---------------------------------------------------------------- dtypes

struct dtype_row {
  dtype type;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<dtype_row, 15> dtype_table{{
    {dtype::BOOL, "BOOL", 1},   {dtype::U8, "U8", 1},     {dtype::I8, "I8", 1},
    {dtype::F8_E5M2, "F8_E5M2", 1}, {dtype::F8_E4M3, "F8_E4M3", 1}, {dtype::I16, "I16", 2},
    {dtype::U16, "U16", 2},     {dtype::F16, "F16", 2},   {dtype::BF16, "BF16", 2},
    {dtype::I32, "I32", 4},     {dtype::U32, "U32", 4},   {dtype::F32, "F32", 4},
    {dtype::F64, "F64", 8},     {dtype::I64, "I64", 8},   {dtype::U64, "U64", 8},
}};

std::string known_dtype_names() {
  std::string names;
  for (const auto& row : dtype_table) {
    if (!names.empty()) names += ", ";
    names += row.name;
  }
  return names;
}

// Element count and byte count of a shape, or nullopt when they overflow 64 bits.
std::optional<std::uint64_t> byte_count(const std::vector<std::uint64_t>& shape, dtype type) {
  constexpr auto most = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t count = 1;
  bool has_zero = std::find(shape.begin(), shape.end(), 0u) != shape.end();
  if (has_zero) return 0;
  for (const std::uint64_t extent : shape) {
    if (count > most / extent) return std::nullopt;
    count *= extent;
  }
  const std::uint64_t element_bytes = dtype_size(type);
  if (count > most / element_bytes) return std::nullopt;
  return count * element_bytes;
}

// ---------------------------------------------------------------- the schema pass

struct parsed_tensor {
  std::string name;
  std::optional<dtype> type;
  std::optional<std::vector<std::uint64_t>> shape;
  std::optional<std::array<std::uint64_t, 2>> offsets;
};

class header_reader {
 public:
  header_reader(std::string_view json, std::string_view file_name)
      : reader_(json, file_name), file_(file_name) {}

  void read_into(header_table& table, std::vector<parsed_tensor>& tensors) {
    if (reader_.next_kind() != json_kind::object)
      fail(file_, "header is " + std::string(kind_name(reader_.next_kind())) +
                      ", expected a JSON object of tensors");
    reader_.expect('{', "");
    std::set<std::string, std::less<>> names;
    bool metadata_seen = false;
    if (reader_.consume('}')) return;
    do {
      std::string key = reader_.read_string();
      reader_.expect(':', "after an object key");
      if (key == "__metadata__") {
        if (metadata_seen) fail(file_, "'__metadata__' appears twice");
        metadata_seen = true;
        read_metadata(table.metadata);
        continue;
      }
      if (!names.insert(key).second) fail_tensor(file_, key, "appears twice in the header");
      tensors.push_back(read_tensor(std::move(key)));
    } while (reader_.consume(','));
    reader_.expect('}', "");
  }

 private:
  void read_metadata(metadata_map& metadata) {
    const json_kind kind = reader_.next_kind();
    if (kind == json_kind::null) {
      reader_.skip_value(1);
      return;
    }
    if (kind != json_kind::object)
      fail(file_, "'__metadata__' is " + std::string(kind_name(kind)) +
                      ", expected an object of strings");
    reader_.expect('{', "");
    if (reader_.consume('}')) return;
    do {
      std::string key = reader_.read_string();
      reader_.expect(':', "after an object key");
      const json_kind value_kind = reader_.next_kind();
      if (value_kind != json_kind::string)
        fail(file_, "'__metadata__' value of " + printable(key) + " is " +
                        std::string(kind_name(value_kind)) + ", expected a string");
      std::string value = reader_.read_string();
      if (metadata.contains(key))
        fail(file_, "'__metadata__' key " + printable(key) + " appears twice");
      metadata.emplace(std::move(key), std::move(value));
    } while (reader_.consume(','));
    reader_.expect('}', "");
  }

  parsed_tensor read_tensor(std::string name) {
    parsed_tensor tensor{std::move(name), {}, {}, {}};
    const json_kind kind = reader_.next_kind();
    if (kind != json_kind::object)
      fail_tensor(file_, tensor.name,
                  "entry is " + std::string(kind_name(kind)) +
                      ", expected an object with dtype, shape and data_offsets");
    reader_.expect('{', "");
    if (!reader_.consume('}')) {
      do {
        const std::string field = reader_.read_string();
        reader_.expect(':', "after an object key");
        if (field == "dtype") {
          if (tensor.type) fail_tensor(file_, tensor.name, "'dtype' appears twice");
          tensor.type = read_dtype(tensor.name);
        } else if (field == "shape") {
          if (tensor.shape) fail_tensor(file_, tensor.name, "'shape' appears twice");
          tensor.shape = read_unsigned_array(tensor.name, "shape");
        } else if (field == "data_offsets") {
          if (tensor.offsets) fail_tensor(file_, tensor.name, "'data_offsets' appears twice");
          const auto offsets = read_unsigned_array(tensor.name, "data_offsets");
          if (offsets.size() != 2)
            fail_tensor(file_, tensor.name,
                        "data_offsets has " + std::to_string(offsets.size()) +
                            " numbers, expected 2 ([begin, end])");
          tensor.offsets = std::array<std::uint64_t, 2>{offsets[0], offsets[1]};
        } else {
          reader_.skip_value(2);  // unknown fields are ignored, as the reference does
        }
      } while (reader_.consume(','));
      reader_.expect('}', "");
    }
    for (const auto& [present, field] : {std::pair{tensor.type.has_value(), "dtype"},
                                         std::pair{tensor.shape.has_value(), "shape"},
                                         std::pair{tensor.offsets.has_value(), "data_offsets"}})
      if (!present) fail_tensor(file_, tensor.name, std::string("'") + field + "' is missing");
    return tensor;
  }

  dtype read_dtype(std::string_view tensor) {
    const json_kind kind = reader_.next_kind();
    if (kind != json_kind::string)
      fail_tensor(file_, tensor, "dtype is " + std::string(kind_name(kind)) + ", expected a string");
    const std::string name = reader_.read_string();
    if (const auto type = parse_dtype(name)) return *type;
    fail_tensor(file_, tensor,
                "dtype " + printable(name) + " is unknown, expected one of " + known_dtype_names());
  }

  std::vector<std::uint64_t> read_unsigned_array(std::string_view tensor, std::string_view field) {
    const json_kind kind = reader_.next_kind();
    if (kind != json_kind::array)
      fail_tensor(file_, tensor,
                  std::string(field) + " is " + std::string(kind_name(kind)) +
                      ", expected an array of unsigned integers");
    reader_.expect('[', "");
    std::vector<std::uint64_t> values;
    if (reader_.consume(']')) return values;
    do {
      const std::string where = std::string(field) + "[" + std::to_string(values.size()) + "]";
      const json_kind item_kind = reader_.next_kind();
      if (item_kind != json_kind::number)
        fail_tensor(file_, tensor,
                    where + " is " + std::string(kind_name(item_kind)) +
                        ", expected an unsigned integer");
      values.push_back(to_unsigned(reader_.read_number_text(), tensor, where));
    } while (reader_.consume(','));
    reader_.expect(']', "");
    return values;
  }

  std::uint64_t to_unsigned(std::string_view literal, std::string_view tensor,
                            const std::string& where) const {
    const std::string shown =
        literal.size() > 40 ? std::string(literal.substr(0, 40)) + "..." : std::string(literal);
    if (literal.find_first_of(".eE") != std::string_view::npos)
      fail_tensor(file_, tensor,
                  where + " = " + shown + " is not an integer, expected an unsigned integer");
    if (literal.starts_with('-'))
      fail_tensor(file_, tensor, where + " = " + shown + " is negative, expected an unsigned integer");
    std::uint64_t value = 0;
    constexpr auto most = std::numeric_limits<std::uint64_t>::max();
    for (const char digit : literal) {
      const auto d = static_cast<std::uint64_t>(digit - '0');
      if (value > (most - d) / 10)
        fail_tensor(file_, tensor,
                    where + " = " + shown + " does not fit in 64 bits, expected at most " +
                        std::to_string(most));
      value = value * 10 + d;
    }
    return value;
  }

  json_reader reader_;
  std::string_view file_;
};

// ---------------------------------------------------------------- JSON writing

using json_detail::append_json_string;


void require_utf8(std::string_view text, std::string_view what) {
  if (!is_valid_utf8(text))
    throw std::invalid_argument("make_header: " + std::string(what) + " " + printable(text) +
                                " is not valid UTF-8, expected UTF-8 text");
}

}  // namespace

// ---------------------------------------------------------------- public API

std::string_view dtype_name(dtype type) noexcept {
  for (const auto& row : dtype_table)
    if (row.type == type) return row.name;
  return "?";
}

std::size_t dtype_size(dtype type) noexcept {
  for (const auto& row : dtype_table)
    if (row.type == type) return row.size;
  return 1;
}

std::optional<dtype> parse_dtype(std::string_view name) noexcept {
  for (const auto& row : dtype_table)
    if (row.name == name) return row.type;
  return std::nullopt;
}

std::uint64_t tensor_info::element_count() const noexcept {
  std::uint64_t count = 1;
  for (const std::uint64_t extent : shape) count *= extent;  // validated not to overflow
  return count;
}

std::uint64_t tensor_info::row_offset(std::uint64_t row) const {
  if (shape.empty())
    throw std::invalid_argument("tensor_info::row_offset: tensor " + printable(name) +
                                " is a scalar (shape []), expected at least one dimension");
  if (row > shape[0])
    throw std::out_of_range("tensor_info::row_offset: row = " + std::to_string(row) +
                            " of tensor " + printable(name) + ", expected row <= " +
                            std::to_string(shape[0]));
  if (shape[0] == 0) return begin;
  return begin + row * (size_bytes() / shape[0]);
}

std::string_view file_layout::header_json() const noexcept {
  if (prefix.size() < 8) return {};
  return {reinterpret_cast<const char*>(prefix.data()) + 8, prefix.size() - 8};
}

file_layout make_header(const std::vector<tensor_entry>& tensors, const metadata_map& metadata) {
  file_layout layout;
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      require_utf8(key, "metadata key");
      require_utf8(value, "metadata value");
      if (!first) json += ',';
      first = false;
      append_json_string(json, key);
      json += ':';
      append_json_string(json, value);
    }
    json += '}';
  }
  std::set<std::string_view> names;
  // The header lists the tensors sorted by name, as the reference writer does; their bytes stay in
  // the order given (offsets need not follow the keys).
  std::vector<std::pair<std::string_view, std::string>> entries;
  std::uint64_t data_bytes = 0;
  for (const auto& tensor : tensors) {
    if (tensor.name == "__metadata__")
      throw std::invalid_argument(
          "make_header: tensor name '__metadata__' is reserved for metadata, expected another name");
    require_utf8(tensor.name, "tensor name");
    if (!names.insert(tensor.name).second)
      throw std::invalid_argument("make_header: tensor name " + printable(tensor.name) +
                                  " appears twice, expected unique names");
    const auto bytes = byte_count(tensor.shape, tensor.type);
    if (!bytes || *bytes > std::numeric_limits<std::uint64_t>::max() / 2 - data_bytes)
      throw std::invalid_argument("make_header: tensor " + printable(tensor.name) + " of shape " +
                                  shape_string(tensor.shape) +
                                  " is too large, expected a file under 2^63 bytes");
    std::string entry;
    append_json_string(entry, tensor.name);
    entry += ":{\"dtype\":\"";
    entry += dtype_name(tensor.type);
    entry += "\",\"shape\":" + shape_string(tensor.shape);
    entry += ",\"data_offsets\":[" + std::to_string(data_bytes) + "," +
             std::to_string(data_bytes + *bytes) + "]}";
    entries.emplace_back(tensor.name, std::move(entry));
    layout.tensors.push_back({tensor.name, tensor.type, tensor.shape, data_bytes, data_bytes + *bytes});
    data_bytes += *bytes;
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& [name, entry] : entries) {
    if (json.size() > 1) json += ',';
    json += entry;
  }
  json += '}';
  // Spaces after the JSON so that the data section starts 8-byte aligned, as the reference does.
  json.append((8 - json.size() % 8) % 8, ' ');

  const std::uint64_t header_bytes = json.size();
  layout.prefix.resize(8 + json.size());
  for (int byte = 0; byte < 8; ++byte)
    layout.prefix[static_cast<std::size_t>(byte)] = static_cast<std::byte>((header_bytes >> (8 * byte)) & 0xff);
  std::transform(json.begin(), json.end(), layout.prefix.begin() + 8,
                 [](char c) { return static_cast<std::byte>(c); });
  layout.data_offset = layout.prefix.size();
  for (auto& tensor : layout.tensors) {
    tensor.begin += layout.data_offset;
    tensor.end += layout.data_offset;
  }
  layout.file_size = layout.data_offset + data_bytes;
  return layout;
}

header_builder& header_builder::add_tensor(std::string name, dtype type,
                                           std::vector<std::uint64_t> shape) {
  tensors_.push_back({std::move(name), type, std::move(shape)});
  return *this;
}

header_builder& header_builder::add_metadata(std::string key, std::string value) {
  metadata_.insert_or_assign(std::move(key), std::move(value));
  return *this;
}

const tensor_info* header_table::find(std::string_view name) const noexcept {
  const auto found = index_by_name_.find(name);
  return found == index_by_name_.end() ? nullptr : &tensors[found->second];
}

const tensor_info& header_table::at(std::string_view name) const {
  if (const tensor_info* tensor = find(name)) return *tensor;
  throw std::out_of_range("safetensors file " + printable(file_name) + ": no tensor named " +
                          printable(name));
}

std::uint64_t header_length(std::span<const std::byte> first_bytes, std::uint64_t file_size,
                            std::string_view file_name) {
  if (file_size < 8)
    fail(file_name, "file is " + std::to_string(file_size) +
                        " bytes, expected at least 8 (the header length)");
  if (first_bytes.size() < 8)
    fail(file_name, "first_bytes holds " + std::to_string(first_bytes.size()) +
                        " bytes, expected at least 8 (the header length)");
  std::uint64_t length = 0;
  for (int byte = 7; byte >= 0; --byte)
    length = (length << 8) | std::to_integer<std::uint64_t>(first_bytes[static_cast<std::size_t>(byte)]);
  if (length > max_header_bytes)
    fail(file_name, "header length " + std::to_string(length) + " is absurd, expected at most " +
                        std::to_string(max_header_bytes) + " bytes");
  if (length > file_size - 8)
    fail(file_name, "header length " + std::to_string(length) + " is larger than the file (" +
                        std::to_string(file_size) + " bytes, so at most " +
                        std::to_string(file_size - 8) + " after the length)");
  return length;
}

header_table parse_header(std::span<const std::byte> file_prefix, std::uint64_t file_size,
                          std::string_view file_name) {
  if (file_prefix.size() > file_size)
    throw std::invalid_argument("parse_header: file_size = " + std::to_string(file_size) +
                                " is smaller than file_prefix (" +
                                std::to_string(file_prefix.size()) +
                                " bytes), expected the size of the whole file");
  const std::uint64_t length = header_length(file_prefix, file_size, file_name);
  if (file_prefix.size() - 8 < length)
    fail(file_name, "file_prefix holds " + std::to_string(file_prefix.size()) +
                        " bytes, but the header needs 8 + " + std::to_string(length) +
                        "; read that many bytes first");
  const std::string_view json(reinterpret_cast<const char*>(file_prefix.data()) + 8,
                              static_cast<std::size_t>(length));

  // Pass 1: syntax of the whole text, and nothing but whitespace after the value.
  {
    json_reader syntax(json, file_name);
    syntax.skip_value(0);
    syntax.skip_whitespace();
    if (!syntax.at_end()) syntax.syntax_error("expected the end of the header after the JSON value");
  }

  // Pass 2: meaning.
  header_table table;
  table.file_name = std::string(file_name);
  table.file_size = file_size;
  table.data_offset = 8 + length;
  std::vector<parsed_tensor> parsed;
  header_reader(json, file_name).read_into(table, parsed);

  const std::uint64_t data_bytes = file_size - table.data_offset;
  for (const auto& tensor : parsed) {
    const auto [begin, end] = *tensor.offsets;
    const std::string offsets_text =
        "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (begin > end) fail_tensor(file_name, tensor.name, offsets_text + " end before begin");
    const auto bytes = byte_count(*tensor.shape, *tensor.type);
    if (!bytes)
      fail_tensor(file_name, tensor.name,
                  "shape " + shape_string(*tensor.shape) + " of " +
                      std::string(dtype_name(*tensor.type)) + " has more than 2^64 bytes");
    if (*bytes != end - begin)
      fail_tensor(file_name, tensor.name,
                  "shape " + shape_string(*tensor.shape) + " of " +
                      std::string(dtype_name(*tensor.type)) + " (" +
                      std::to_string(dtype_size(*tensor.type)) + " bytes each) is " +
                      std::to_string(*bytes) + " bytes, but " + offsets_text + " span " +
                      std::to_string(end - begin));
    if (end > data_bytes)
      fail_tensor(file_name, tensor.name,
                  offsets_text + " go past the end of the data section, which has " +
                      std::to_string(data_bytes) + " bytes (file of " + std::to_string(file_size) +
                      " bytes, data from byte " + std::to_string(table.data_offset) + ")");
  }

  // The ranges, in file order, must tile the data section exactly: no overlap, no hole.
  std::vector<std::size_t> order(parsed.size());
  for (std::size_t index = 0; index < order.size(); ++index) order[index] = index;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return *parsed[a].offsets < *parsed[b].offsets;
  });
  std::uint64_t covered = 0;
  const parsed_tensor* previous = nullptr;
  for (const std::size_t index : order) {
    const auto& tensor = parsed[index];
    const auto [begin, end] = *tensor.offsets;
    if (begin < covered)
      fail_tensor(file_name, tensor.name,
                  "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                      "] overlap tensor " + printable(previous->name) + ", which ends at " +
                      std::to_string(covered));
    if (begin > covered)
      fail_tensor(file_name, tensor.name,
                  "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                      "] leave a hole: bytes [" + std::to_string(covered) + ", " +
                      std::to_string(begin) + ") of the data section belong to no tensor");
    covered = end;
    previous = &tensor;
  }
  if (covered != data_bytes)
    fail(file_name, "bytes [" + std::to_string(covered) + ", " + std::to_string(data_bytes) +
                        ") at the end of the data section belong to no tensor" +
                        (previous ? " (the last is " + printable(previous->name) + ")"
                                  : std::string(" (the header has no tensors)")));

  table.tensors.reserve(parsed.size());
  for (const std::size_t index : order) {
    auto& tensor = parsed[index];
    table.index_by_name_.emplace(tensor.name, table.tensors.size());
    table.tensors.push_back({std::move(tensor.name), *tensor.type, std::move(*tensor.shape),
                             table.data_offset + (*tensor.offsets)[0],
                             table.data_offset + (*tensor.offsets)[1]});
  }
  return table;
}

}  // namespace kfsdp::io
