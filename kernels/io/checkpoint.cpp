// Parallel safetensors checkpoints over MPI-IO (include/kfsdp/io/checkpoint.hpp).
//
// Every step that can fail on one rank only is followed by an agreement (the lowest failing rank's
// error is broadcast and thrown on every rank), so no rank is ever left waiting in a collective.
#include <kfsdp/io/checkpoint.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace kfsdp::io {

namespace {

std::function<bool(const std::filesystem::path&)>& stop_after_header_hook() {
  static std::function<bool(const std::filesystem::path&)> hook;
  return hook;
}

// What a test hook throws to stop a writer where a kill would: nothing is cleaned up.
struct simulated_kill : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// MPI-IO counts are int: move at most 1 GiB per call and per file-view block.
constexpr std::uint64_t max_bytes_per_call = std::uint64_t{1} << 30;

std::string quoted(const std::filesystem::path& path) { return fmt::format("'{}'", path.string()); }

std::span<const std::byte> bytes_of(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// ------------------------------------------------------------------ the layout, shared by writers

bool is_reserved_key(std::string_view key) {
  return key.starts_with(checksum_key_prefix) || key == header_checksum_key ||
         key == parameters_key || key == numel_key || key == dtype_key;
}

void check_user_metadata(const metadata_map& metadata, std::string_view function) {
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
checksum_state header_fingerprint(std::span<const tensor_entry> tensors,
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

std::uint64_t byte_size(const tensor_entry& tensor) {
  std::uint64_t bytes = dtype_size(tensor.type);
  for (const std::uint64_t extent : tensor.shape) bytes *= extent;
  return bytes;
}

// The file layout for `tensors` (in this order) with their checksums: the caller's metadata, one
// "checksum.<name>" per tensor, the weights' sizes, and the header checksum over all of it.
file_layout checkpoint_layout(const std::vector<tensor_entry>& tensors,
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
bool has_checksums(const header_table& table) {
  for (const auto& [key, value] : table.metadata)
    if (key == header_checksum_key || key.starts_with(checksum_key_prefix)) return true;
  return false;
}

// Throws format_error unless the header checksum in the file matches its header.
void verify_header_checksum(const header_table& table, std::string_view function) {
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
void verify_tensor_checksum(const header_table& table, const std::string& name,
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

[[noreturn]] void throw_errno(std::string_view function, std::string_view what,
                              const std::filesystem::path& path) {
  throw std::runtime_error(
      fmt::format("{}: {} {} failed: {}", function, what, quoted(path), std::strerror(errno)));
}

void write_fully(int descriptor, std::span<const std::byte> bytes, std::string_view function,
                 const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(descriptor, bytes.data(), std::min<std::size_t>(bytes.size(), max_bytes_per_call));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) throw_errno(function, "write to", path);
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
}

std::uint64_t read_fully(int descriptor, std::span<std::byte> bytes, std::uint64_t offset,
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
void sync_directory(const std::filesystem::path& file, std::string_view function) {
  std::filesystem::path directory = file.parent_path();
  if (directory.empty()) directory = ".";
  file_descriptor handle{::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (handle.value < 0) throw_errno(function, "open of the directory", directory);
  if (::fsync(handle.value) != 0) throw_errno(function, "fsync of the directory", directory);
}

void rename_over(const std::filesystem::path& temporary, const std::filesystem::path& path,
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
std::filesystem::path temporary_name(const std::filesystem::path& path) {
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
std::filesystem::path save_target(const std::filesystem::path& path, std::string_view function) {
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
void remove_leftover_temporaries(const std::filesystem::path& target) {
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
std::vector<std::byte> read_header_bytes(const std::filesystem::path& path, std::uint64_t& file_size,
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

// ------------------------------------------------------------------ agreement over ranks

enum class failure_kind : std::int64_t { format = 1, argument = 2, runtime = 3 };

struct failure {
  failure_kind kind = failure_kind::runtime;
  std::string message;
};

[[noreturn]] void throw_failure(const failure& error) {
  switch (error.kind) {
    case failure_kind::format: throw format_error(error.message);
    case failure_kind::argument: throw std::invalid_argument(error.message);
    case failure_kind::runtime: break;
  }
  throw std::runtime_error(error.message);
}

// MPI's error classes for files are coarse (MPI_ERR_IO, MPI_ERR_OTHER); the system's errno, when
// the call left one (together() clears it first), says what went wrong.
void check_mpi(int code, std::string_view function, std::string_view call,
               const std::filesystem::path& path) {
  const int cause = errno;
  if (code == MPI_SUCCESS) return;
  throw std::runtime_error(fmt::format(
      "{}: {} on {} failed: {} (MPI error code {}){}", function, call, quoted(path),
      comm::detail::mpi_error_text(code), code,
      cause != 0 ? fmt::format("; the system's last error: {}", std::strerror(cause)) : ""));
}

// Collective: when any rank holds a failure, every rank throws the lowest failing rank's one (the
// same type and text everywhere).
void agree(MPI_Comm comm, const std::optional<failure>& local) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int candidate = local ? rank : size;
  int first_failing = size;
  if (MPI_Allreduce(&candidate, &first_failing, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
    throw std::runtime_error("kfsdp::io checkpoint: MPI_Allreduce of the ranks' verdicts failed");
  if (first_failing == size) return;
  std::int64_t shape[2] = {local ? static_cast<std::int64_t>(local->kind) : 0,
                           local ? static_cast<std::int64_t>(local->message.size()) : 0};
  MPI_Bcast(shape, 2, MPI_INT64_T, first_failing, comm);
  std::string message = rank == first_failing ? local->message : std::string(static_cast<std::size_t>(shape[1]), ' ');
  MPI_Bcast(message.data(), static_cast<int>(shape[1]), MPI_CHAR, first_failing, comm);
  throw_failure({static_cast<failure_kind>(shape[0]), std::move(message)});
}

// Runs `step` on this rank and agrees on the outcome: it throws on every rank or on none. A step
// may hold one collective call, but nothing that can throw before it.
template <class Step>
void together(MPI_Comm comm, Step&& step) {
  std::optional<failure> local;
  try {
    errno = 0;
    step();
  } catch (const format_error& error) {
    local = failure{failure_kind::format, error.what()};
  } catch (const std::invalid_argument& error) {
    local = failure{failure_kind::argument, error.what()};
  } catch (const std::exception& error) {
    local = failure{failure_kind::runtime, error.what()};
  } catch (...) {
    local = failure{failure_kind::runtime, "kfsdp::io checkpoint: an unknown exception"};
  }
  agree(comm, local);
}

// ------------------------------------------------------------------ collective transfers

// A byte range of the file and where it sits in the rank's contiguous staging buffer (pieces are
// in file order and staged back to back).
struct file_piece {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// MPI-IO can report a short write (a full disk, a file size limit) without its cause: writing the
// same bytes with pwrite either completes them or fails with the errno that names it.
std::optional<failure> rewrite_with_pwrite(const std::filesystem::path& path,
                                           std::span<const file_piece> pieces,
                                           const std::byte* staging, std::string_view function,
                                           std::uint64_t moved, std::uint64_t asked) {
  const auto failed = [&] {
    return failure{failure_kind::runtime,
                   fmt::format("{}: write to {} failed: {} (MPI-IO wrote {} of the {} bytes asked for)",
                               function, quoted(path), std::strerror(errno), moved, asked)};
  };
  file_descriptor file{::open(path.c_str(), O_WRONLY | O_CLOEXEC)};
  if (file.value < 0) return failed();
  for (const file_piece& piece : pieces) {
    for (std::uint64_t done = 0; done < piece.length;) {
      const ssize_t written = ::pwrite(file.value, staging + done,
                                       std::min<std::uint64_t>(piece.length - done, max_bytes_per_call),
                                       static_cast<off_t>(piece.offset + done));
      if (written < 0 && errno == EINTR) continue;
      if (written == 0) errno = ENOSPC;  // no progress and no error: the space is gone
      if (written <= 0) return failed();
      done += static_cast<std::uint64_t>(written);
    }
    staging += piece.length;
  }
  return std::nullopt;
}

// Moves a rank's pieces between the file and `staging` (their bytes back to back) with collective
// MPI-IO calls through a file view; every rank makes the same number of calls. Returns the error of
// this rank (a failed call or a short read), to be agreed on afterwards.
std::optional<failure> transfer_pieces(MPI_File file, MPI_Comm comm, std::span<const file_piece> pieces,
                                       std::byte* staging, bool writing, std::string_view function,
                                       const std::filesystem::path& path) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> displacements;
  std::uint64_t total = 0;
  for (const file_piece& piece : pieces)
    for (std::uint64_t done = 0; done < piece.length; done += max_bytes_per_call) {
      lengths.push_back(static_cast<int>(std::min(max_bytes_per_call, piece.length - done)));
      displacements.push_back(static_cast<MPI_Aint>(piece.offset + done));
      total += static_cast<std::uint64_t>(lengths.back());
    }
  std::optional<failure> error;
  const auto record = [&](int code, std::string_view call) {
    if (code != MPI_SUCCESS && !error) {
      try {
        check_mpi(code, function, call, path);
      } catch (const std::exception& caught) {
        error = failure{failure_kind::runtime, caught.what()};
      }
    }
  };
  // A rank with nothing to move keeps the plain byte view (an empty filetype is not portable).
  MPI_Datatype file_type = MPI_BYTE;
  if (!lengths.empty()) {
    record(MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(),
                                    displacements.data(), MPI_BYTE, &file_type),
           "MPI_Type_create_hindexed");
    record(MPI_Type_commit(&file_type), "MPI_Type_commit");
  }
  record(MPI_File_set_view(file, 0, MPI_BYTE, error ? MPI_BYTE : file_type, "native", MPI_INFO_NULL),
         "MPI_File_set_view");

  std::uint64_t calls = (total + max_bytes_per_call - 1) / max_bytes_per_call;
  MPI_Allreduce(MPI_IN_PLACE, &calls, 1, MPI_UINT64_T, MPI_MAX, comm);
  for (std::uint64_t call = 0; call < calls; ++call) {
    const std::uint64_t offset = std::min(total, call * max_bytes_per_call);
    const int count = error ? 0 : static_cast<int>(std::min(max_bytes_per_call, total - offset));
    MPI_Status status;
    const int code = writing
        ? MPI_File_write_at_all(file, static_cast<MPI_Offset>(offset), staging + offset, count, MPI_BYTE, &status)
        : MPI_File_read_at_all(file, static_cast<MPI_Offset>(offset), staging + offset, count, MPI_BYTE, &status);
    record(code, writing ? "MPI_File_write_at_all" : "MPI_File_read_at_all");
    int moved = count;
    if (code == MPI_SUCCESS && count > 0) MPI_Get_count(&status, MPI_BYTE, &moved);
    if (!error && moved != count && writing) {
      error = rewrite_with_pwrite(path, pieces, staging, function, static_cast<std::uint64_t>(moved),
                                  static_cast<std::uint64_t>(count));
      // (When pwrite wrote every piece, the later calls rewrite the same bytes: every rank must
      // make the same number of collective calls.)
    } else if (!error && moved != count)
      error = failure{failure_kind::format,
                      fmt::format("{}: file {}: {} {} bytes of {} asked for: the file is shorter "
                                  "than its header says (truncated?)",
                                  function, quoted(path), writing ? "wrote" : "read", moved, count)};
  }
  // Back to the plain byte view, so that later calls see the file as bytes again.
  record(MPI_File_set_view(file, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL), "MPI_File_set_view");
  if (file_type != MPI_BYTE) MPI_Type_free(&file_type);
  return error;
}

// Rank 0's string on every rank.
std::string broadcast_string(MPI_Comm comm, std::string text) {
  std::uint64_t length = text.size();
  MPI_Bcast(&length, 1, MPI_UINT64_T, 0, comm);
  text.resize(length);
  MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, comm);
  return text;
}

// ------------------------------------------------------------------ sharded tensors

// One tensor of the file: a parameter's rows from one flat view (the weights or a named shard).
template <class Scalar>
struct sharded_tensor {
  std::string name;
  std::size_t param = 0;
  Kokkos::View<Scalar*> flat;
  std::uint64_t staging_offset = 0;  // where this rank's rows sit in the staging buffer
  std::uint64_t local_bytes = 0;     // this rank's rows, padding left out
};

// The tensors of a checkpoint in file order: every weight, then every named shard's tensors.
template <class Scalar>
std::vector<sharded_tensor<Scalar>> sharded_tensors(fsdp_engine<Scalar>& engine,
                                                    std::span<const named_shard<Scalar>> shards,
                                                    std::string_view function) {
  const shard_plan& plan = engine.plan();
  std::vector<std::pair<std::string, Kokkos::View<Scalar*>>> groups{{"", engine.shards().flat()}};
  for (const named_shard<Scalar>& shard : shards) {
    if (shard.name.empty())
      throw std::invalid_argument(fmt::format("{}: a named shard has an empty name, expected a "
                                              "prefix such as \"optimizer.exp_avg\"",
                                              function));
    for (const auto& [seen, view] : groups)
      if (seen == shard.name)
        throw std::invalid_argument(
            fmt::format("{}: named shard '{}' appears twice, expected unique names", function, seen));
    if (shard.flat.extent(0) != plan.shard_numel)
      throw std::invalid_argument(fmt::format(
          "{}: named shard '{}' has {} elements, expected {} (the engine's flat shard)", function,
          shard.name, shard.flat.extent(0), plan.shard_numel));
    groups.emplace_back(shard.name, shard.flat);
  }
  std::vector<sharded_tensor<Scalar>> tensors;
  std::uint64_t staging = 0;
  const auto rank = static_cast<std::size_t>(engine.rank());
  for (const auto& [prefix, view] : groups)
    for (std::size_t p = 0; p < engine.params().size(); ++p) {
      const param_shard& shard = plan.params[p];
      const std::uint64_t bytes = shard.valid_rows(rank) * shard.row_numel * sizeof(Scalar);
      std::string name(engine.params()[p].name.view());
      tensors.push_back({prefix.empty() ? name : prefix + "." + name, p, view, staging, bytes});
      staging += bytes;
    }
  return tensors;
}

std::vector<std::uint64_t> shape_of(const param_info& param) {
  return {param.shape.begin(), param.shape.begin() + param.rank};
}

// The absolute file offset of this rank's first row of `tensor`.
template <class Scalar>
std::uint64_t first_row_offset(const tensor_info& tensor, const param_shard& shard, std::size_t rank) {
  return tensor.begin + rank * shard.chunk_rows * shard.row_numel * sizeof(Scalar);
}

// Every tensor's checksum over all ranks: the ranks' pieces combined in rank order.
std::vector<checksum_state> combine_checksums(MPI_Comm comm, std::span<const checksum_state> local,
                                              std::string_view function, const std::filesystem::path& path) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<std::uint64_t> mine;
  for (const checksum_state& state : local) mine.insert(mine.end(), {state.polynomial, state.length});
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(size));
  together(comm, [&] {
    check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(),
                            static_cast<int>(mine.size()), MPI_UINT64_T, comm),
              function, "MPI_Allgather of the checksums", path);
  });
  std::vector<checksum_state> combined(local.size());
  for (int r = 0; r < size; ++r)
    for (std::size_t t = 0; t < local.size(); ++t) {
      const std::size_t at = static_cast<std::size_t>(r) * mine.size() + 2 * t;
      combined[t] = checksum_combine(combined[t], {all[at], all[at + 1]});
    }
  return combined;
}

template <class Scalar>
void check_communicator(fsdp_engine<Scalar>& engine, comm::mpi& comm, std::string_view function) {
  if (comm.size() != engine.world_size() || comm.rank() != engine.rank())
    throw std::invalid_argument(fmt::format(
        "{}: the communicator is rank {} of {}, expected the engine's rank {} of {}", function,
        comm.rank(), comm.size(), engine.rank(), engine.world_size()));
}

// Every rank's `metadata` must be the same (its fingerprint is compared over ranks).
void check_same_metadata(MPI_Comm comm, const metadata_map& metadata,
                         std::span<const std::string> shard_names, std::string_view function) {
  checksum_state state;
  for (const auto& [key, value] : metadata) {
    checksum_update(state, bytes_of(key));
    checksum_update(state, bytes_of(std::string_view("\0", 1)));
    checksum_update(state, bytes_of(value));
    checksum_update(state, bytes_of(std::string_view("\0", 1)));
  }
  for (const std::string& name : shard_names) checksum_update(state, bytes_of(name + '\n'));
  const std::uint64_t digest = checksum_digest(state);
  std::uint64_t extremes[2] = {digest, ~digest};  // max of both gives the max and the min
  MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_UINT64_T, MPI_MAX, comm);
  if (extremes[0] != ~extremes[1])
    throw std::invalid_argument(fmt::format(
        "{}: the ranks pass different metadata or named shards, expected the same on every rank",
        function));
}

// ------------------------------------------------------------------ the parallel writer

template <class Scalar>
void write_sharded_file(std::string_view function, const std::filesystem::path& requested,
                        fsdp_engine<Scalar>& engine, comm::mpi& comm,
                        std::span<const named_shard<Scalar>> shards, const metadata_map& metadata) {
  const MPI_Comm native = comm.native();
  const int rank = comm.rank();
  std::vector<sharded_tensor<Scalar>> tensors;
  std::vector<std::byte> staging;
  std::vector<checksum_state> local_checksums;
  std::filesystem::path path;
  together(native, [&] {
    path = save_target(requested, function);  // every rank refuses the same bad path
    check_communicator(engine, comm, function);
    check_user_metadata(metadata, function);
    tensors = sharded_tensors(engine, shards, function);
    // This rank's rows of every tensor, back to back in file order, on the host.
    staging.resize(tensors.empty() ? 0 : tensors.back().staging_offset + tensors.back().local_bytes);
    std::vector<Scalar> host;
    Kokkos::View<Scalar*> copied;
    for (const sharded_tensor<Scalar>& tensor : tensors) {
      if (copied.data() != tensor.flat.data()) {
        host.resize(tensor.flat.extent(0));
        Kokkos::deep_copy(Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                              host.data(), host.size()),
                          tensor.flat);
        copied = tensor.flat;
      }
      const std::size_t first = engine.plan().params[tensor.param].storage_offset;
      std::memcpy(staging.data() + tensor.staging_offset, host.data() + first, tensor.local_bytes);
      local_checksums.push_back(
          checksum_of(std::span(staging).subspan(tensor.staging_offset, tensor.local_bytes)));
    }
  });
  std::vector<std::string> shard_names;
  for (const named_shard<Scalar>& shard : shards) shard_names.push_back(shard.name);
  together(native, [&] { check_same_metadata(native, metadata, shard_names, function); });
  const std::vector<checksum_state> checksums = combine_checksums(native, local_checksums, function, path);

  file_layout layout;
  std::vector<file_piece> pieces;
  together(native, [&] {
    std::vector<tensor_entry> entries;
    std::uint64_t weight_numel = 0;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const param_info& param = engine.params()[tensors[t].param];
      entries.push_back({tensors[t].name, dtype_of<Scalar>, shape_of(param)});
      if (t < engine.params().size()) weight_numel += param.numel;  // the weights come first
    }
    layout = checkpoint_layout(entries, checksums, metadata, engine.params().size(), weight_numel,
                               dtype_name(dtype_of<Scalar>));
    for (std::size_t t = 0; t < tensors.size(); ++t)
      if (tensors[t].local_bytes > 0)
        pieces.push_back({first_row_offset<Scalar>(layout.tensors[t], engine.plan().params[tensors[t].param],
                                                   static_cast<std::size_t>(rank)),
                          tensors[t].local_bytes});
  });

  if (rank == 0) remove_leftover_temporaries(path);
  const std::filesystem::path temporary =
      broadcast_string(native, rank == 0 ? temporary_name(path).string() : std::string());
  MPI_File file = MPI_FILE_NULL;
  together(native, [&] {
    check_mpi(MPI_File_open(native, temporary.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY,
                            MPI_INFO_NULL, &file),
              function, "MPI_File_open", temporary);
  });
  try {
    together(native, [&] {
      check_mpi(MPI_File_set_size(file, static_cast<MPI_Offset>(layout.file_size)), function,
                "MPI_File_set_size", temporary);
    });
    together(native, [&] {
      MPI_Status status;
      check_mpi(MPI_File_write_at_all(file, 0, layout.prefix.data(),
                                      rank == 0 ? static_cast<int>(layout.prefix.size()) : 0,
                                      MPI_BYTE, &status),
                function, "MPI_File_write_at_all of the header", temporary);
    });
    bool stop = false;
    together(native, [&] { stop = stop_after_header_hook() && stop_after_header_hook()(temporary); });
    int stop_anywhere = stop ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &stop_anywhere, 1, MPI_INT, MPI_MAX, native);
    if (stop_anywhere)
      throw simulated_kill(fmt::format("{}: stopped by the test hook after the header of {} (a "
                                       "simulated kill: {} left as it was)",
                                       function, quoted(temporary), quoted(path)));
    agree(native, transfer_pieces(file, native, pieces, staging.data(), true, function, temporary));
    together(native, [&] { check_mpi(MPI_File_sync(file), function, "MPI_File_sync", temporary); });
    const int closed = MPI_File_close(&file);
    file = MPI_FILE_NULL;
    together(native, [&] { check_mpi(closed, function, "MPI_File_close", temporary); });
    // Every rank's data is synced: only now may the new file replace the old one.
    together(native, [&] {
      if (rank == 0) rename_over(temporary, path, function);
    });
  } catch (const simulated_kill&) {
    if (file != MPI_FILE_NULL) MPI_File_close(&file);
    throw std::runtime_error(
        fmt::format("{}: stopped by the test hook after the header of {} (a simulated kill)",
                    function, quoted(temporary)));
  } catch (...) {
    if (file != MPI_FILE_NULL) MPI_File_close(&file);
    if (rank == 0) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
    }
    throw;
  }
}

// ------------------------------------------------------------------ the parallel reader

// With `lenient`, tensors missing from the file are skipped and named there, with the file's
// tensors the model lacks, instead of being an error.
template <class Scalar>
metadata_map read_sharded_file(std::string_view function, const std::filesystem::path& path,
                               fsdp_engine<Scalar>& engine, comm::mpi& comm,
                               std::span<const named_shard<Scalar>> shards,
                               import_report* lenient = nullptr) {
  const MPI_Comm native = comm.native();
  const int rank = comm.rank();
  std::vector<sharded_tensor<Scalar>> tensors;
  together(native, [&] {
    check_communicator(engine, comm, function);
    tensors = sharded_tensors(engine, shards, function);
  });

  // Rank 0 reads the header; every rank parses the same bytes, so all reach the same verdict.
  std::vector<std::byte> prefix;
  std::uint64_t file_size = 0;
  together(native, [&] {
    if (rank == 0) prefix = read_header_bytes(path, file_size, function);
  });
  std::uint64_t sizes[2] = {file_size, prefix.size()};
  MPI_Bcast(sizes, 2, MPI_UINT64_T, 0, native);
  file_size = sizes[0];
  prefix.resize(sizes[1]);
  MPI_Bcast(prefix.data(), static_cast<int>(prefix.size()), MPI_BYTE, 0, native);

  header_table table;
  std::vector<file_piece> pieces;
  together(native, [&] {
    const auto fail = [&](const std::string& tensor, const std::string& what) {
      throw format_error(fmt::format("{}: file {}: tensor '{}': {}", function, quoted(path), tensor, what));
    };
    try {
      table = parse_header(prefix, file_size, path.string());
    } catch (const format_error& invalid) {
      // A tensor deleted from the header leaves its bytes as a hole: name what the model misses first.
      const std::string_view text(reinterpret_cast<const char*>(prefix.data()), prefix.size());
      if (lenient == nullptr)
        for (const sharded_tensor<Scalar>& tensor : tensors)
          if (text.find('"' + tensor.name + '"') == std::string_view::npos)
            fail(tensor.name, fmt::format("missing from the file, expected it (the model has it); {}", invalid.what()));
      throw;
    }
    std::vector<sharded_tensor<Scalar>> present;
    for (const sharded_tensor<Scalar>& tensor : tensors) {
      const param_info& param = engine.params()[tensor.param];
      const tensor_info* found = table.find(tensor.name);
      if (found == nullptr && lenient != nullptr) {
        lenient->missing.push_back(tensor.name);
        continue;
      }
      if (found == nullptr) fail(tensor.name, "missing from the file, expected it (the model has it)");
      if (found->type != dtype_of<Scalar>)
        fail(tensor.name, fmt::format("dtype {} in the file, expected {} (the model's)",
                                      dtype_name(found->type), dtype_name(dtype_of<Scalar>)));
      if (found->shape != shape_of(param))
        fail(tensor.name, fmt::format("shape {} in the file, expected {} for the model",
                                      shape_string(found->shape), shape_string(shape_of(param))));
      if (has_checksums(table) && !table.metadata.contains(std::string(checksum_key_prefix) + tensor.name))
        fail(tensor.name, fmt::format("no '{}{}' in __metadata__, expected its checksum",
                                      checksum_key_prefix, tensor.name));
      if (tensor.local_bytes > 0)
        pieces.push_back({first_row_offset<Scalar>(*found, engine.plan().params[tensor.param],
                                                   static_cast<std::size_t>(rank)),
                          tensor.local_bytes});
      present.push_back(tensor);
    }
    if (lenient != nullptr) {
      std::set<std::string_view> known;
      for (const sharded_tensor<Scalar>& tensor : tensors) known.insert(tensor.name);
      for (const tensor_info& in_file : table.tensors)
        if (!known.contains(in_file.name)) lenient->unexpected.push_back(in_file.name);
      for (const sharded_tensor<Scalar>& tensor : present) lenient->loaded.push_back(tensor.name);
    }
    tensors = std::move(present);
    const auto count = table.metadata.find(parameters_key);
    if (lenient == nullptr && count != table.metadata.end() &&
        count->second != std::to_string(engine.params().size()))
      throw format_error(fmt::format("{}: file {}: holds {} weight tensors ('{}'), expected {} for the model",
                                     function, quoted(path), count->second, parameters_key,
                                     engine.params().size()));
    verify_header_checksum(table, function);
  });
  // The pieces were pushed in the order of `tensors`; the file view needs them in file order.
  std::vector<std::size_t> order(pieces.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return pieces[a].offset < pieces[b].offset; });
  std::vector<file_piece> sorted_pieces;
  std::vector<std::uint64_t> staged_at(pieces.size());  // piece i's place in the read buffer
  std::uint64_t read_offset = 0;
  for (const std::size_t i : order) {
    sorted_pieces.push_back(pieces[i]);
    staged_at[i] = read_offset;
    read_offset += pieces[i].length;
  }

  std::vector<std::byte> staging;
  together(native, [&] { staging.resize(read_offset); });
  MPI_File file = MPI_FILE_NULL;
  together(native, [&] {
    check_mpi(MPI_File_open(native, path.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &file), function,
              "MPI_File_open", path);
  });
  std::optional<failure> read_error =
      transfer_pieces(file, native, sorted_pieces, staging.data(), false, function, path);
  MPI_File_close(&file);
  agree(native, read_error);

  // Checksums over every rank's rows, combined in rank order, against __metadata__.
  std::vector<checksum_state> local_checksums;
  std::vector<std::uint64_t> piece_of_tensor(tensors.size());  // offset in `staging`
  for (std::size_t t = 0, piece = 0; t < tensors.size(); ++t) {
    piece_of_tensor[t] = tensors[t].local_bytes > 0 ? staged_at[piece++] : 0;
    local_checksums.push_back(
        checksum_of(std::span(staging).subspan(piece_of_tensor[t], tensors[t].local_bytes)));
  }
  const std::vector<checksum_state> checksums = combine_checksums(native, local_checksums, function, path);
  together(native, [&] {
    for (std::size_t t = 0; t < tensors.size(); ++t)
      verify_tensor_checksum(table, tensors[t].name, checksums[t], function);
  });

  // Every rank verified everything: commit, padding rows zero.
  together(native, [&] {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const param_shard& shard = engine.plan().params[tensors[t].param];
      const std::size_t first = shard.storage_offset;
      const std::size_t valid = tensors[t].local_bytes / sizeof(Scalar);
      Kokkos::deep_copy(Kokkos::subview(tensors[t].flat, std::make_pair(first, first + valid)),
                        Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            reinterpret_cast<const Scalar*>(staging.data() + piece_of_tensor[t]), valid));
      Kokkos::deep_copy(Kokkos::subview(tensors[t].flat, std::make_pair(first + valid, first + shard.chunk_numel())),
                        Scalar{0});
    }
  });
  return table.metadata;
}

}  // namespace

// ------------------------------------------------------------------ public API

template <class Scalar>
void save_model(const std::filesystem::path& path, fsdp_engine<Scalar>& engine, comm::mpi& comm,
                const metadata_map& metadata) {
  write_sharded_file<Scalar>("kfsdp::io::save_model", path, engine, comm, {}, metadata);
}

template <class Scalar>
void save_checkpoint(const std::filesystem::path& path, fsdp_engine<Scalar>& engine,
                     comm::mpi& comm, const checkpoint_state<Scalar>& state) {
  write_sharded_file<Scalar>("kfsdp::io::save_checkpoint", path, engine, comm, state.shards,
                             state.metadata);
}

template <class Scalar>
metadata_map load_model(const std::filesystem::path& path, fsdp_engine<Scalar>& engine,
                        comm::mpi& comm) {
  return read_sharded_file<Scalar>("kfsdp::io::load_model", path, engine, comm, {});
}

template <class Scalar>
import_report import_weights(const std::filesystem::path& path, fsdp_engine<Scalar>& engine,
                             comm::mpi& comm) {
  import_report report;
  report.metadata = read_sharded_file<Scalar>("kfsdp::io::import_weights", path, engine, comm, {}, &report);
  return report;
}

std::string describe(const import_report& report) {
  const auto names = [](const std::vector<std::string>& list) {
    std::string text;
    for (const std::string& name : list) text += fmt::format("{}'{}'", text.empty() ? "" : ", ", name);
    return text;
  };
  std::string text = fmt::format("loaded {} of {} tensors", report.loaded.size(),
                                 report.loaded.size() + report.missing.size());
  if (!report.missing.empty()) text += "; missing (kept as they were): " + names(report.missing);
  if (!report.unexpected.empty()) text += "; unexpected (ignored): " + names(report.unexpected);
  return text;
}

template <class Scalar>
void load_checkpoint(const std::filesystem::path& path, fsdp_engine<Scalar>& engine,
                     comm::mpi& comm, checkpoint_state<Scalar>& state) {
  state.metadata = read_sharded_file<Scalar>("kfsdp::io::load_checkpoint", path, engine, comm, state.shards);
}

void save_state_dict_file(const std::filesystem::path& requested, const state_dict& full,
                          const metadata_map& metadata) {
  constexpr std::string_view function = "kfsdp::io::save_state_dict_file";
  const std::filesystem::path path = save_target(requested, function);
  check_user_metadata(metadata, function);
  std::vector<tensor_entry> entries;
  std::vector<checksum_state> checksums;
  std::uint64_t numel = 0;
  std::string weight_dtype;
  for (const tensor& t : full) {
    if (t.bytes.size() != t.numel() * dtype_size(t.type))
      throw std::invalid_argument(fmt::format("{}: tensor '{}' of shape {} holds {} bytes, expected {}",
                                              function, t.name, shape_string(t.shape), t.bytes.size(),
                                              t.numel() * dtype_size(t.type)));
    entries.push_back({t.name, t.type, {t.shape.begin(), t.shape.end()}});
    checksums.push_back(checksum_of(t.bytes));
    numel += t.numel();
    const std::string name(dtype_name(t.type));
    weight_dtype = weight_dtype.empty() || weight_dtype == name ? name : "mixed";
  }
  const file_layout layout = checkpoint_layout(entries, checksums, metadata, full.size(), numel, weight_dtype);

  remove_leftover_temporaries(path);
  const std::filesystem::path temporary = temporary_name(path);
  file_descriptor file{::open(temporary.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644)};
  if (file.value < 0) throw_errno(function, "open of", temporary);
  try {
    write_fully(file.value, layout.prefix, function, temporary);
    if (stop_after_header_hook() && stop_after_header_hook()(temporary))
      throw simulated_kill(fmt::format("{}: stopped by the test hook after the header of {} (a simulated kill)",
                                       function, quoted(temporary)));
    for (const tensor& t : full) write_fully(file.value, t.bytes, function, temporary);
    if (::fsync(file.value) != 0) throw_errno(function, "fsync of", temporary);
    const int descriptor = std::exchange(file.value, -1);
    if (::close(descriptor) != 0) throw_errno(function, "close of", temporary);
    rename_over(temporary, path, function);
  } catch (const simulated_kill& stopped) {
    throw std::runtime_error(stopped.what());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
}

state_dict load_state_dict_file(const std::filesystem::path& path, metadata_map* metadata) {
  constexpr std::string_view function = "kfsdp::io::load_state_dict_file";
  std::uint64_t file_size = 0;
  const std::vector<std::byte> prefix = read_header_bytes(path, file_size, function);
  const header_table table = parse_header(prefix, file_size, path.string());
  verify_header_checksum(table, function);
  file_descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.value < 0) throw_errno(function, "open of", path);
  state_dict full;
  for (const tensor_info& info : table.tensors) {
    if (info.type != dtype::F32 && info.type != dtype::F64)
      throw format_error(fmt::format("{}: file {}: tensor '{}': dtype {}, expected F32 or F64",
                                     function, quoted(path), info.name, dtype_name(info.type)));
    tensor t{info.name, {info.shape.begin(), info.shape.end()},
             info.type, {}};
    t.bytes.resize(info.size_bytes());
    if (read_fully(file.value, t.bytes, info.begin, function, path) != info.size_bytes())
      throw format_error(fmt::format("{}: file {}: tensor '{}': the file ended inside it",
                                     function, quoted(path), info.name));
    verify_tensor_checksum(table, info.name, checksum_of(t.bytes), function);
    full.add(std::move(t));
  }
  if (metadata != nullptr) *metadata = table.metadata;
  return full;
}

namespace testing {
void set_stop_after_header(std::function<bool(const std::filesystem::path&)> hook) {
  stop_after_header_hook() = std::move(hook);
}
}  // namespace testing

#define KFSDP_CHECKPOINT_INSTANTIATE(Scalar)                                                      \
  template void save_model<Scalar>(const std::filesystem::path&, fsdp_engine<Scalar>&,           \
                                   comm::mpi&, const metadata_map&);                              \
  template void save_checkpoint<Scalar>(const std::filesystem::path&, fsdp_engine<Scalar>&,      \
                                        comm::mpi&, const checkpoint_state<Scalar>&);             \
  template metadata_map load_model<Scalar>(const std::filesystem::path&, fsdp_engine<Scalar>&,   \
                                           comm::mpi&);                                           \
  template import_report import_weights<Scalar>(const std::filesystem::path&,                    \
                                                fsdp_engine<Scalar>&, comm::mpi&);                \
  template void load_checkpoint<Scalar>(const std::filesystem::path&, fsdp_engine<Scalar>&,      \
                                        comm::mpi&, checkpoint_state<Scalar>&);
KFSDP_CHECKPOINT_INSTANTIATE(float)
KFSDP_CHECKPOINT_INSTANTIATE(double)
#undef KFSDP_CHECKPOINT_INSTANTIATE

}  // namespace kfsdp::io
