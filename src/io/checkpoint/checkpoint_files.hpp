#pragma once
// Checkpoint internals, part 1: the file layout every writer shares (reserved keys, checksums) and
// the POSIX file helpers (regular files only, temporary names, leftovers, fsync of the directory).
// Included by src/io/checkpoint/checkpoint_writer.cpp, checkpoint_reader.cpp and safetensors_file.cpp only; no MPI.
#include <kfsdp/io/checkpoint/checksum.hpp>
#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/tensor/state_dict.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>


namespace kfsdp::io::checkpoint_detail {

// Refuses a tensor holding NaN or an infinity: a diverged model is not saved over a good file.
template <class Scalar>
void check_finite(std::span<const Scalar> values, std::string_view tensor, std::string_view function,
                  const std::filesystem::path& path) {
  const auto bad = std::find_if(values.begin(), values.end(), [](Scalar x) { return !std::isfinite(x); });
  if (bad != values.end())
    throw std::invalid_argument(fmt::format("{}: tensor '{}' holds {}, expected finite values (a diverged model); "
                                            "'{}' is left as it was",
                                            function, tensor, *bad, path.string()));
}

// Refuses a loaded tensor holding NaN or an infinity (as the engine's scalar, after any
// conversion): a file without checksums, or one another tool wrote, is not loaded into a model.
template <class Scalar>
void check_loaded_finite(std::span<const Scalar> values, std::string_view tensor, std::string_view function,
                         const std::filesystem::path& path) {
  const auto bad = std::find_if(values.begin(), values.end(), [](Scalar x) { return !std::isfinite(x); });
  if (bad != values.end())
    throw format_error(
        fmt::format("{}: file '{}': tensor '{}': holds {}, expected finite values (a diverged or "
                    "corrupted model); nothing was loaded",
                    function, path.string(), tensor, *bad));
}

inline std::function<bool(const std::filesystem::path&)>& stop_after_header_hook() {
  static std::function<bool(const std::filesystem::path&)> hook;
  return hook;
}

// What a test hook throws to stop a writer where a kill would: nothing is cleaned up.
struct simulated_kill : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// MPI-IO counts are int: move at most 1 GiB per call and per file-view block.
inline constexpr std::uint64_t max_bytes_per_call = std::uint64_t{1} << 30;

inline std::string quoted(const std::filesystem::path& path) { return fmt::format("'{}'", path.string()); }

inline std::span<const std::byte> bytes_of(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// ------------------------------------------------------------------ the layout, shared by writers

inline bool is_reserved_key(std::string_view key) {
  return key.starts_with(checksum_key_prefix) || key == header_checksum_key ||
         key == parameters_key || key == numel_key || key == dtype_key;
}

inline void check_user_metadata(const metadata_map& metadata, std::string_view function) {
  for (const auto& [key, value] : metadata)
    if (is_reserved_key(key))
      throw std::invalid_argument(fmt::format(
          "{}: metadata key '{}' is reserved (the writer sets it), expected any key but "
          "'{}*', '{}', '{}', '{}', '{}'",
          function, key, checksum_key_prefix, header_checksum_key, parameters_key, numel_key,
          dtype_key));
}

// Covers every tensor's name, dtype, shape and offsets in the data section, and every metadata
// entry but itself: a header that was altered but still parses is caught.
inline checksum_state header_fingerprint(std::span<const tensor_entry> tensors,
                                  std::span<const std::uint64_t> data_offsets,
                                  const metadata_map& metadata) {
  checksum_state state;
  const auto add = [&state](std::string_view text) {
    checksum_update(state, bytes_of(text));
    checksum_update(state, bytes_of(std::string_view("\0", 1)));
  };
  for (const auto& [key, value] : metadata) {
    if (key == header_checksum_key) continue;
    add(key);
    add(value);
  }
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    add(tensors[t].name);
    add(dtype_name(tensors[t].type));
    add(shape_string(tensors[t].shape));
    add(std::to_string(data_offsets[t]));
  }
  return state;
}

inline std::uint64_t byte_size(const tensor_entry& tensor) {
  std::uint64_t bytes = dtype_size(tensor.type);
  for (const std::uint64_t extent : tensor.shape) bytes *= extent;
  return bytes;
}

// The file layout for `tensors` (in this order) with their checksums: the caller's metadata, one
// "checksum.<name>" per tensor, the weights' sizes, and the header checksum over all of it.
inline file_layout checkpoint_layout(const std::vector<tensor_entry>& tensors,
                              std::span<const checksum_state> checksums, const metadata_map& user,
                              std::size_t weight_count, std::uint64_t weight_numel,
                              std::string_view weight_dtype) {
  metadata_map metadata = user;
  std::vector<std::uint64_t> data_offsets(tensors.size());
  std::uint64_t offset = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    metadata.insert_or_assign(std::string(checksum_key_prefix) + tensors[t].name,
                              checksum_hex(checksums[t]));
    data_offsets[t] = offset;
    offset += byte_size(tensors[t]);
  }
  metadata.insert_or_assign(std::string(parameters_key), std::to_string(weight_count));
  metadata.insert_or_assign(std::string(numel_key), std::to_string(weight_numel));
  metadata.insert_or_assign(std::string(dtype_key), std::string(weight_dtype));
  metadata.insert_or_assign(std::string(header_checksum_key),
                            checksum_hex(header_fingerprint(tensors, data_offsets, metadata)));
  return make_header(tensors, metadata);
}

// Whether the file carries kfsdp's checksums. A standard safetensors file (from the safetensors
// library, PyTorch, another tool) has none of kfsdp's keys: it loads after the layout checks,
// unverified. A file with some of them is kfsdp's and must carry all.
inline bool has_checksums(const header_table& table) {
  for (const auto& [key, value] : table.metadata)
    if (key == header_checksum_key || key.starts_with(checksum_key_prefix)) return true;
  return false;
}

// Throws format_error unless the header checksum in the file matches its header.
inline void verify_header_checksum(const header_table& table, std::string_view function) {
  if (!has_checksums(table)) return;
  const auto stored = table.metadata.find(header_checksum_key);
  if (stored == table.metadata.end())
    throw format_error(fmt::format(
        "{}: file '{}': no '{}' in __metadata__, expected one (written by kfsdp::io::save_model)",
        function, table.file_name, header_checksum_key));
  std::vector<tensor_entry> tensors;
  std::vector<std::uint64_t> data_offsets;
  for (const tensor_info& tensor : table.tensors) {
    tensors.push_back({tensor.name, tensor.type, tensor.shape});
    data_offsets.push_back(tensor.begin - table.data_offset);
  }
  const std::string computed = checksum_hex(header_fingerprint(tensors, data_offsets, table.metadata));
  if (computed != stored->second)
    throw format_error(fmt::format(
        "{}: file '{}': header checksum {} computed from the header, expected {} from '{}': the "
        "header (a name, shape, offset or metadata value) was altered",
        function, table.file_name, computed, stored->second, header_checksum_key));
}

// Throws format_error unless tensor `name`'s checksum in __metadata__ equals `computed`.
inline void verify_tensor_checksum(const header_table& table, const std::string& name,
                            const checksum_state& computed, std::string_view function) {
  if (!has_checksums(table)) return;
  const auto stored = table.metadata.find(std::string(checksum_key_prefix) + name);
  if (stored == table.metadata.end())
    throw format_error(fmt::format(
        "{}: file '{}': tensor '{}': no '{}{}' in __metadata__, expected its checksum", function,
        table.file_name, name, checksum_key_prefix, name));
  if (checksum_hex(computed) != stored->second)
    throw format_error(fmt::format(
        "{}: file '{}': tensor '{}': checksum {} computed from its {} bytes, expected {} from "
        "__metadata__: the data is corrupted",
        function, table.file_name, name, checksum_hex(computed), computed.length, stored->second));
}

// ------------------------------------------------------------------ POSIX helpers

[[noreturn]] inline void throw_errno(std::string_view function, std::string_view what,
                              const std::filesystem::path& path) {
  throw std::runtime_error(
      fmt::format("{}: {} {} failed: {}", function, what, quoted(path), std::strerror(errno)));
}

inline void write_fully(int descriptor, std::span<const std::byte> bytes, std::string_view function,
                 const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(descriptor, bytes.data(), std::min<std::size_t>(bytes.size(), max_bytes_per_call));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) throw_errno(function, "write to", path);
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
}

inline std::uint64_t read_fully(int descriptor, std::span<std::byte> bytes, std::uint64_t offset,
                         std::string_view function, const std::filesystem::path& path) {
  std::uint64_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::pread(descriptor, bytes.data() + done,
                                std::min<std::uint64_t>(bytes.size() - done, max_bytes_per_call),
                                static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_errno(function, "read of", path);
    if (got == 0) break;
    done += static_cast<std::uint64_t>(got);
  }
  return done;
}

struct file_descriptor {
  int value = -1;
  ~file_descriptor() {
    if (value >= 0) ::close(value);
  }
};

// Makes a rename durable: the directory entry itself is flushed.
inline void sync_directory(const std::filesystem::path& file, std::string_view function) {
  std::filesystem::path directory = file.parent_path();
  if (directory.empty()) directory = ".";
  file_descriptor handle{::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (handle.value < 0) throw_errno(function, "open of the directory", directory);
  if (::fsync(handle.value) != 0) throw_errno(function, "fsync of the directory", directory);
}

inline void rename_over(const std::filesystem::path& temporary, const std::filesystem::path& path,
                 std::string_view function) {
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error)
    throw std::runtime_error(fmt::format("{}: rename of {} to {} failed: {}", function,
                                         quoted(temporary), quoted(path), error.message()));
  sync_directory(path, function);
}

// "<dir>/<name>.tmp.<16 hex digits>": beside the target (so the rename stays in one file system)
// and unique, so a temporary file left by a killed job never gets in the way.
inline std::filesystem::path temporary_name(const std::filesystem::path& path) {
  std::random_device entropy;
  const std::uint64_t nonce =
      (std::uint64_t{entropy()} << 32) ^ entropy() ^ static_cast<std::uint64_t>(::getpid()) ^
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::filesystem::path temporary = path;
  temporary += ".tmp." + format_hex64(nonce);
  return temporary;
}

// Where a save really writes: `path` itself, or the file a symlink names (so the link stays and
// its target is replaced atomically). Throws std::invalid_argument before anything is written for
// an empty path and for a path that names a directory, a device, a FIFO or a socket.
inline std::filesystem::path save_target(const std::filesystem::path& path, std::string_view function) {
  namespace fs = std::filesystem;
  if (path.empty()) throw std::invalid_argument(fmt::format("{}: the path is empty, expected a file name", function));
  fs::path target = path;
  std::error_code error;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, error)); ++hops) {
    if (hops == 40) throw std::invalid_argument(fmt::format("{}: {}: too many levels of symbolic links", function, quoted(path)));
    const fs::path next = fs::read_symlink(target, error);
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const fs::file_status status = fs::status(target, error);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    const char* kind = fs::is_directory(status)           ? "a directory"
                       : fs::is_character_file(status) ? "a character device"
                       : fs::is_block_file(status)     ? "a block device"
                       : fs::is_fifo(status)           ? "a FIFO"
                       : fs::is_socket(status)         ? "a socket"
                                                       : "not a regular file";
    throw std::invalid_argument(
        fmt::format("{}: {} is {}, expected a regular file (nothing was written)", function, quoted(target), kind));
  }
  return target;
}

// Removes "<name>.tmp.<16 hex digits>" files beside `target` that a killed save left behind.
inline void remove_leftover_temporaries(const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code error;
  const fs::path directory = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() == prefix.size() + 16 && name.starts_with(prefix) &&
        name.find_first_not_of("0123456789abcdef", prefix.size()) == std::string::npos && it->is_regular_file(error)) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

// The first 8 + N bytes of a file (N the header length) and the file's size.
inline std::vector<std::byte> read_header_bytes(const std::filesystem::path& path, std::uint64_t& file_size,
                                         std::string_view function) {
  file_descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.value < 0) throw_errno(function, "open of", path);
  struct stat status {};
  if (::fstat(file.value, &status) != 0) throw_errno(function, "stat of", path);
  file_size = static_cast<std::uint64_t>(status.st_size);
  std::vector<std::byte> prefix(8);
  prefix.resize(read_fully(file.value, prefix, 0, function, path));
  const std::uint64_t length = header_length(prefix, file_size, path.string());
  prefix.resize(8 + length);
  if (read_fully(file.value, std::span(prefix).subspan(8), 8, function, path) != length)
    throw format_error(fmt::format("{}: file {}: the file ended inside its {}-byte header",
                                   function, quoted(path), length));
  return prefix;
}

}  // namespace kfsdp::io::checkpoint_detail
