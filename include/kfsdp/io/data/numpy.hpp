#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// NumPy's files as datasets: .npy (one array) and .npz (numpy.savez: a zip archive of .npy
// members, stored uncompressed). Backend-free: plain file reads, values converted to double.
//
//   np.savez("heat.npz", x=features.astype(np.float32), y=targets)     # x [N, 6], y [N] or [N, 1]
//   kfsdp::io::array_dataset data = kfsdp::io::numpy_dataset("heat.npz", "x", "y");
//
// A .npy file is a header and the raw values (format versions 1-3):
//   "\x93NUMPY" major minor | header length (2 bytes in v1, 4 in v2/v3, little-endian) |
//   "{'descr': '<f4', 'fortran_order': False, 'shape': (100, 6), }" padded with spaces to 64 bytes |
//   100 · 6 little-endian floats, row-major (column-major with fortran_order True)
// Any dtype numpy writes for numbers is read: floats f2 f4 f8, integers i1-i8 u1-u8, bool b1, in
// either byte order. Every error names the file, the array and what was expected.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <utility>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/meta/host_memory.hpp>  // require_host_memory
#include <kfsdp/meta/parse.hpp>        // parse_count
#include <kfsdp/meta/half.hpp>

namespace kfsdp::io {

/// One array of a .npy file or of an .npz member: its shape, numpy's dtype, its values in C order.
KFSDP_EXPORT struct numpy_array {
  std::vector<std::size_t> shape{};
  std::string dtype{};          // numpy's descr: "<f4", ">i8", "|b1", ...
  std::vector<double> values{};  // row-major, converted to double
};

namespace detail {

[[noreturn]] inline void numpy_refuse(std::string_view file, std::string_view what) {
  throw std::invalid_argument(fmt::format("kfsdp::io: {}: {}", file, what));
}

// The value of `key` in the header's dict text: "'descr': '<f4'" -> "'<f4'", "'shape': (3, 4)" -> "(3, 4)".
inline std::string_view header_value(std::string_view header, std::string_view key, std::string_view file) {
  const std::string quoted = fmt::format("'{}':", key);
  const auto at = header.find(quoted);
  if (at == std::string_view::npos) numpy_refuse(file, fmt::format("the .npy header has no '{}': {}", key, header));
  std::string_view rest = header.substr(at + quoted.size());
  rest.remove_prefix(std::min(rest.find_first_not_of(' '), rest.size()));
  const char open = rest.empty() ? '\0' : rest.front();
  const char close = open == '(' ? ')' : open == '\'' ? '\'' : ',';
  const auto end = rest.find(close, open == '(' || open == '\'' ? 1 : 0);
  if (end == std::string_view::npos) numpy_refuse(file, fmt::format("the .npy header's '{}' does not end: {}", key, header));
  return rest.substr(0, open == '(' || open == '\'' ? end + 1 : end);
}

// A value of `bytes` bytes in numpy's `kind` ('f', 'i', 'u', 'b'), stored in the given byte order.
inline double numpy_value(const unsigned char* p, char kind, std::size_t bytes, bool big_endian) {
  std::array<unsigned char, 8> b{};
  for (std::size_t i = 0; i < bytes; ++i) b[i] = p[(big_endian == (std::endian::native == std::endian::little)) ? bytes - 1 - i : i];
  const auto as = [&]<class T>(T) {
    T v;
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
  };
  switch (kind) {
    case 'f':
      if (bytes == 2) return double(float(f16::from_bits(as(std::uint16_t{}))));
      return bytes == 4 ? double(as(float{})) : as(double{});
    case 'i':
      return bytes == 1 ? double(as(std::int8_t{})) : bytes == 2 ? double(as(std::int16_t{}))
                       : bytes == 4 ? double(as(std::int32_t{})) : double(as(std::int64_t{}));
    case 'u':
      return bytes == 1 ? double(as(std::uint8_t{})) : bytes == 2 ? double(as(std::uint16_t{}))
                       : bytes == 4 ? double(as(std::uint32_t{})) : double(as(std::uint64_t{}));
    default:  // 'b'
      return b[0] != 0 ? 1.0 : 0.0;
  }
}

// What a .npy header says: the shape, numpy's dtype, how its values are stored and where they start.
struct npy_header {
  std::vector<std::size_t> shape{};
  std::string dtype{};      // numpy's descr: "<f4", "<u2", ...
  char kind = '?';          // 'f', 'i', 'u' or 'b'
  std::size_t bytes = 0;    // per value
  bool big_endian = false, fortran = false;
  std::size_t data_offset = 0, count = 0;  // the values: count of them from data_offset, checked to fit the image
};

// Parses one .npy image's header (the image is the whole file, or an .npz member's bytes: the
// values are checked to fit it but not read, so a memory-mapped file is touched only in its header);
// `file` names it in errors.
inline npy_header parse_npy_header(std::span<const unsigned char> image, const std::string& file) {
  constexpr std::string_view magic = "\x93NUMPY";
  if (image.size() < 10 || std::memcmp(image.data(), magic.data(), magic.size()) != 0)
    numpy_refuse(file, "not a .npy file (no \\x93NUMPY magic), expected one written by numpy.save or numpy.savez");
  const unsigned major = image[6];
  if (major < 1 || major > 3) numpy_refuse(file, fmt::format("the .npy format version is {}, expected 1, 2 or 3", major));
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  if (image.size() < 8 + length_bytes)
    numpy_refuse(file, fmt::format("the .npy file is {} bytes, cut short in its header length", image.size()));
  std::size_t header_length = 0;
  for (std::size_t i = 0; i < length_bytes; ++i) header_length |= std::size_t(image[8 + i]) << (8 * i);
  const std::size_t data_offset = 8 + length_bytes + header_length;
  if (data_offset > image.size())
    numpy_refuse(file, fmt::format("the .npy header is {} bytes, and the file holds {}", header_length, image.size()));
  const std::string_view header(reinterpret_cast<const char*>(image.data()) + 8 + length_bytes, header_length);

  npy_header array;
  const std::string_view descr = header_value(header, "descr", file);
  array.dtype = std::string(descr.size() >= 2 ? descr.substr(1, descr.size() - 2) : std::string_view());
  const std::string_view dtype = array.dtype;
  const char order = dtype.empty() ? '?' : dtype[0];
  const char kind = dtype.size() > 1 ? dtype[1] : '?';
  std::size_t bytes = 0;
  if (dtype.size() == 3 && dtype[2] >= '1' && dtype[2] <= '8') bytes = std::size_t(dtype[2] - '0');
  const bool known = (order == '<' || order == '>' || order == '|' || order == '=') &&
                     ((kind == 'f' && (bytes == 2 || bytes == 4 || bytes == 8)) ||
                      ((kind == 'i' || kind == 'u') && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) ||
                      (kind == 'b' && bytes == 1));
  if (!known)
    numpy_refuse(file, fmt::format("dtype '{}', expected a number: f2, f4, f8, i1-i8, u1-u8 or b1, in either byte order",
                                   dtype));
  const bool big_endian = order == '>';
  const bool fortran = header_value(header, "fortran_order", file) == "True";

  std::string_view shape = header_value(header, "shape", file);  // "(100, 6)", "(100,)", "()"
  if (shape.size() < 2 || !shape.starts_with('('))
    numpy_refuse(file, fmt::format("the .npy header's shape is not a tuple: {}", header));
  shape = shape.substr(1, shape.size() - 2);
  std::size_t count = 1;
  while (!shape.empty()) {
    shape.remove_prefix(std::min(shape.find_first_not_of(' '), shape.size()));
    const auto comma = shape.find(',');
    const std::string_view digits = shape.substr(0, comma);
    if (digits.empty()) break;
    std::size_t extent = 0;
    try {  // strict and bounded: "2^64 + 1" is refused, not read as 1
      extent = parse_count(digits.substr(0, digits.find_last_not_of(' ') + 1), "an extent");
    } catch (const std::invalid_argument& bad) {
      numpy_refuse(file, fmt::format("the .npy header's shape is not whole numbers below 2^64 ({}): {}", bad.what(), header));
    }
    array.shape.push_back(extent);
    // In doubles, so that a product past 2^64 is seen instead of wrapping to a small size.
    if (double(count) * double(extent) * double(bytes) > double(image.size()))
      numpy_refuse(file, fmt::format("shape ({}{}) of '{}' needs more bytes of data than the file's {}", fmt::join(array.shape, ", "),
                                     comma == std::string_view::npos ? "" : ", ...", dtype, image.size()));
    count *= extent;
    if (comma == std::string_view::npos) break;
    shape.remove_prefix(comma + 1);
  }
  if (image.size() - data_offset < count * bytes)
    numpy_refuse(file, fmt::format("shape ({}) of '{}' needs {} bytes of data, the file holds {} (cut short?)",
                                   fmt::join(array.shape, ", "), dtype, count * bytes, image.size() - data_offset));
  array.kind = kind;
  array.bytes = bytes;
  array.big_endian = big_endian;
  array.fortran = fortran;
  array.data_offset = data_offset;
  array.count = count;
  return array;
}

// Parses one .npy image (a whole file, or an .npz member's bytes); `file` names it in errors.
inline numpy_array parse_npy(std::span<const unsigned char> image, const std::string& file) {
  const npy_header header = parse_npy_header(image, file);
  const std::size_t count = header.count, bytes = header.bytes;
  const bool fortran = header.fortran, big_endian = header.big_endian;
  const char kind = header.kind;
  numpy_array array{.shape = header.shape, .dtype = header.dtype};
  const std::size_t data_offset = header.data_offset;
  // The values as doubles: up to 8 times the file's bytes (one-byte types).
  require_host_memory(double(count) * sizeof(double), fmt::format("{}'s values (shape ({}))", file, fmt::join(array.shape, ", ")));
  array.values.resize(count);
  const unsigned char* data = image.data() + data_offset;
  // Fortran order: element (i, j, ...) sits at i + d0·(j + d1·...); C order: the reverse strides.
  std::vector<std::size_t> index(array.shape.size(), 0);
  for (std::size_t c = 0; c < count; ++c) {
    std::size_t source = c;
    if (fortran && array.shape.size() > 1) {
      source = 0;
      for (std::size_t d = array.shape.size(); d-- > 0;) source = source * array.shape[d] + index[d];
      for (std::size_t d = array.shape.size(); d-- > 0;)  // next C-order index
        if (++index[d] < array.shape[d]) break;
        else index[d] = 0;
    }
    array.values[c] = numpy_value(data + source * bytes, kind, bytes, big_endian);
  }
  return array;
}

inline std::vector<unsigned char> read_bytes(const std::filesystem::path& path, std::string_view who) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error))
    throw std::invalid_argument(fmt::format("kfsdp::io::{}: '{}' is not a regular file", who, path.string()));
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw std::runtime_error(fmt::format("kfsdp::io::{}: cannot read '{}'", who, path.string()));
  return bytes;
}

inline std::uint64_t little(std::span<const unsigned char> bytes, std::size_t at, std::size_t width) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < width; ++i) v |= std::uint64_t(bytes[at + i]) << (8 * i);
  return v;
}

// One member of a zip archive, from its central directory.
struct zip_member {
  std::string name;
  std::uint16_t method = 0;  // 0 stored, 8 deflated
  std::uint64_t size = 0, offset = 0;
};

// The central directory of a zip archive (zip64 included, as numpy writes it).
inline std::vector<zip_member> zip_directory(std::span<const unsigned char> zip, const std::string& file) {
  const auto bad = [&](std::string_view what) -> void {
    numpy_refuse(file, fmt::format("not a readable .npz (zip) archive: {}", what));
  };
  if (zip.size() < 22) bad("shorter than a zip end record");
  std::size_t end = zip.size() - 22;  // the end-of-central-directory record, after an optional comment
  while (little(zip, end, 4) != 0x06054b50) {
    if (end == 0 || zip.size() - end > 22 + 0xFFFF) bad("no end-of-central-directory record");
    --end;
  }
  std::uint64_t entries = little(zip, end + 10, 2), directory = little(zip, end + 16, 4);
  if ((entries == 0xFFFF || directory == 0xFFFFFFFF) && end >= 20 && little(zip, end - 20, 4) == 0x07064b50) {
    const std::uint64_t record = little(zip, end - 20 + 8, 8);  // the zip64 end record
    if (zip.size() < 56 || record > zip.size() - 56 || little(zip, record, 4) != 0x06064b50)
      bad("a broken zip64 end record");
    entries = little(zip, record + 32, 8);
    directory = little(zip, record + 48, 8);
  }
  std::vector<zip_member> members;
  std::uint64_t at = directory;
  for (std::uint64_t e = 0; e < entries; ++e) {
    if (at > zip.size() || zip.size() - at < 46 || little(zip, at, 4) != 0x02014b50) bad("a broken central directory");
    zip_member m;
    m.method = std::uint16_t(little(zip, at + 10, 2));
    m.size = little(zip, at + 24, 4);  // uncompressed
    const std::uint64_t compressed = little(zip, at + 20, 4);
    m.offset = little(zip, at + 42, 4);
    const std::size_t name_length = little(zip, at + 28, 2), extra_length = little(zip, at + 30, 2),
                      comment_length = little(zip, at + 32, 2);
    if (at + 46 + name_length + extra_length > zip.size()) bad("a central directory entry past the end");
    m.name.assign(reinterpret_cast<const char*>(zip.data()) + at + 46, name_length);
    // zip64: the sizes and offset that do not fit 32 bits are in extra field 0x0001, in this order.
    const std::size_t extra_end = at + 46 + name_length + extra_length;
    for (std::size_t x = at + 46 + name_length; x + 4 <= extra_end;) {
      const std::size_t id = little(zip, x, 2), length = little(zip, x + 2, 2);
      const std::size_t field_end = std::min(x + 4 + length, extra_end);
      std::size_t field = x + 4;
      // Each 8-byte value read lies inside its field (a short field would be read past the archive's end).
      const auto zip64_value = [&] {
        if (field + 8 > field_end) bad("a zip64 extra field shorter than its values");
        const std::uint64_t value = little(zip, field, 8);
        field += 8;
        return value;
      };
      if (id == 0x0001) {
        if (m.size == 0xFFFFFFFF) m.size = zip64_value();
        if (compressed == 0xFFFFFFFF) (void)zip64_value();
        if (m.offset == 0xFFFFFFFF) m.offset = zip64_value();
      }
      x += 4 + length;
    }
    members.push_back(std::move(m));
    at += 46 + name_length + extra_length + comment_length;
  }
  return members;
}

// The array `name` of an .npz archive's bytes (read_npz's, or a fuzzer's); `file` names it in errors.
inline numpy_array parse_npz(std::span<const unsigned char> zip, std::string_view name, const std::string& file) {
  std::vector<std::string> names;
  for (const zip_member& m : zip_directory(zip, file)) {
    const std::string array = m.name.ends_with(".npy") ? m.name.substr(0, m.name.size() - 4) : m.name;
    names.push_back(array);
    if (array != name) continue;
    if (m.method != 0)
      numpy_refuse(file, fmt::format("array '{}' is compressed (numpy.savez_compressed), expected an archive "
                                     "of numpy.savez (stored), or a .npy file", name));
    // Compared as remaining bytes: a zip64 offset or size near 2^64 would wrap a sum past the check.
    if (m.offset > zip.size() || zip.size() - m.offset < 30 || little(zip, m.offset, 4) != 0x04034b50)
      numpy_refuse(file, fmt::format("array '{}': a broken local zip header", name));
    const std::size_t data = m.offset + 30 + little(zip, m.offset + 26, 2) + little(zip, m.offset + 28, 2);
    if (data > zip.size() || m.size > zip.size() - data)
      numpy_refuse(file, fmt::format("array '{}' runs past the end (cut short?)", name));
    return parse_npy(zip.subspan(data, m.size), fmt::format("{}, array '{}'", file, name));
  }
  numpy_refuse(file, fmt::format("no array '{}', expected one of: {}", name, fmt::join(names, ", ")));
}

}  // namespace detail

/// The array of a .npy file. Throws std::invalid_argument naming the file for anything that is not
/// a numeric .npy array.
///
///   const kfsdp::io::numpy_array u = kfsdp::io::read_npy("u.npy");   // u.shape == {64, 64}
KFSDP_EXPORT inline numpy_array read_npy(const std::filesystem::path& path) {
  const std::vector<unsigned char> bytes = detail::read_bytes(path, "read_npy");
  return detail::parse_npy(bytes, path.string());
}

/// The names of an .npz archive's arrays ("x" for the member "x.npy"), in the archive's order.
inline std::vector<std::string> npz_names(const std::filesystem::path& path) {
  const std::vector<unsigned char> bytes = detail::read_bytes(path, "npz_names");
  std::vector<std::string> names;
  for (const detail::zip_member& m : detail::zip_directory(bytes, path.string()))
    names.push_back(m.name.ends_with(".npy") ? m.name.substr(0, m.name.size() - 4) : m.name);
  return names;
}

/// The array `name` of an .npz archive written by numpy.savez. Throws std::invalid_argument naming
/// the file and the array when it is missing (listing those there are), compressed
/// (numpy.savez_compressed: not read here) or not a numeric array.
///
///   const kfsdp::io::numpy_array x = kfsdp::io::read_npz("heat.npz", "x");
KFSDP_EXPORT inline numpy_array read_npz(const std::filesystem::path& path, std::string_view name) {
  return detail::parse_npz(detail::read_bytes(path, "read_npz"), name, path.string());
}

/// A dataset of two arrays of an .npz archive: features [N, F] (or [N]: F = 1) and targets [N, T]
/// (or [N]: T = 1), the same N. Throws std::invalid_argument naming the file, the array, its shape
/// and what was expected.
///
///   kfsdp::io::array_dataset data = kfsdp::io::numpy_dataset("heat.npz", "x", "y");
inline array_dataset numpy_dataset(const std::filesystem::path& npz, std::string_view features, std::string_view targets) {
  numpy_array x = read_npz(npz, features), y = read_npz(npz, targets);
  const auto shape = [](const numpy_array& a) { return fmt::format("({})", fmt::join(a.shape, ", ")); };
  for (const auto& [array, name] : {std::pair<const numpy_array*, std::string_view>{&x, features}, {&y, targets}})
    if (array->shape.empty() || array->shape.size() > 2 || array->shape[0] == 0 ||
        (array->shape.size() == 2 && array->shape[1] == 0))
      detail::numpy_refuse(npz.string(), fmt::format("array '{}' has shape {}, expected (N, width) or (N,), N and width > 0",
                                                     name, shape(*array)));
  if (y.shape[0] != x.shape[0])
    detail::numpy_refuse(npz.string(),
                         fmt::format("array '{}' has shape {}, expected {} rows, as '{}' has (shape {})", targets,
                                     shape(y), x.shape[0], features, shape(x)));
  const std::size_t in = x.shape.size() == 2 ? x.shape[1] : 1, out = y.shape.size() == 2 ? y.shape[1] : 1;
  return array_dataset(std::move(x.values), in, std::move(y.values), out);
}

}  // namespace kfsdp::io
