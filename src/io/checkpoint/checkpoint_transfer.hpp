#pragma once
// Checkpoint internals, part 2: agreement over ranks (every step that can fail on one rank is
// followed by one, so no rank waits alone in a collective), the collective MPI-IO transfers, and
// the engine's shards as the tensors of a file. Included by checkpoint_writer.cpp and
// checkpoint_reader.cpp only.
#include <kfsdp/io/checkpoint/checkpoint.hpp>

#include <algorithm>

#include "checkpoint_files.hpp"

namespace kfsdp::io::checkpoint_detail {

// ------------------------------------------------------------------ agreement over ranks

enum class failure_kind : std::int64_t { format = 1, argument = 2, runtime = 3 };

struct failure {
  failure_kind kind = failure_kind::runtime;
  std::string message;
};

[[noreturn]] inline void throw_failure(const failure& error) {
  switch (error.kind) {
    case failure_kind::format: throw format_error(error.message);
    case failure_kind::argument: throw std::invalid_argument(error.message);
    case failure_kind::runtime: break;
  }
  throw std::runtime_error(error.message);
}

// MPI's error classes for files are coarse (MPI_ERR_IO, MPI_ERR_OTHER); the system's errno, when
// the call left one (together() clears it first), says what went wrong.
inline void check_mpi(int code, std::string_view function, std::string_view call,
               const std::filesystem::path& path) {
  const int cause = errno;
  if (code == MPI_SUCCESS) return;
  throw std::runtime_error(fmt::format(
      "{}: {} on {} failed: {} (MPI error code {}){}", function, call, quoted(path),
      comm::detail::mpi_error_text(code), code,
      cause != 0 ? fmt::format("; the system's last error: {}", std::strerror(cause)) : ""));
}

// Collective: when any rank holds a failure, every rank throws the lowest failing rank's one (the
// same type and text everywhere): comm::first_rank_with names it, two broadcasts carry it.
inline void agree(comm::mpi& comm, const std::optional<failure>& local) {
  const int first_failing = comm::first_rank_with(comm, local.has_value());
  if (first_failing == comm.size()) return;
  std::int64_t shape[2] = {local ? static_cast<std::int64_t>(local->kind) : 0,
                           local ? static_cast<std::int64_t>(local->message.size()) : 0};
  comm::broadcast(comm, std::span<std::int64_t>(shape), first_failing);
  const std::size_t length = static_cast<std::size_t>(shape[1]);
  std::vector<std::uint64_t> words((length + 7) / 8);  // the text, in the element type collectives move
  if (comm.rank() == first_failing) std::memcpy(words.data(), local->message.data(), length);
  comm::broadcast(comm, std::span<std::uint64_t>(words), first_failing);
  std::string message(length, ' ');
  std::memcpy(message.data(), words.data(), length);
  throw_failure({static_cast<failure_kind>(shape[0]), std::move(message)});
}

// Runs `step` on this rank and agrees on the outcome: it throws on every rank or on none. A step
// may hold one collective call, but nothing that can throw before it.
template <class Step>
void together(comm::mpi& comm, Step&& step) {
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
inline std::optional<failure> rewrite_with_pwrite(const std::filesystem::path& path,
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
inline std::optional<failure> transfer_pieces(MPI_File file, MPI_Comm comm, std::span<const file_piece> pieces,
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
inline std::string broadcast_string(MPI_Comm comm, std::string text) {
  std::uint64_t length = text.size();
  MPI_Bcast(&length, 1, MPI_UINT64_T, 0, comm);
  text.resize(length);
  MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, comm);
  return text;
}

// Rank 0 reads the header; every rank parses the same bytes, so all reach the same verdict.
inline std::vector<std::byte> header_on_every_rank(std::string_view function, const std::filesystem::path& path,
                                                   comm::mpi& comm, std::uint64_t& file_size) {
  std::vector<std::byte> prefix;
  together(comm, [&] {
    if (comm.rank() == 0) prefix = read_header_bytes(path, file_size, function);
  });
  std::uint64_t sizes[2] = {file_size, prefix.size()};
  MPI_Bcast(sizes, 2, MPI_UINT64_T, 0, comm.native());
  file_size = sizes[0];
  prefix.resize(sizes[1]);
  MPI_Bcast(prefix.data(), static_cast<int>(prefix.size()), MPI_BYTE, 0, comm.native());
  return prefix;
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
  std::size_t flat_first = 0;        // where the parameter's chunk starts in `flat`
};

// The tensors of a checkpoint in file order: every weight, then every named shard's tensors.
template <class Scalar>
std::vector<sharded_tensor<Scalar>> sharded_tensors(const sharded_view<Scalar>& engine,
                                                    std::span<const named_shard<Scalar>> shards,
                                                    std::string_view function) {
  const shard_plan& plan = engine.plan;
  struct group {
    std::string prefix;
    Kokkos::View<Scalar*> flat;
    std::vector<std::size_t> absent;
  };
  std::vector<group> groups{{"", engine.flat, {}}};
  for (const named_shard<Scalar>& shard : shards) {
    if (shard.name.empty())
      throw std::invalid_argument(fmt::format("{}: a named shard has an empty name, expected a "
                                              "prefix such as \"optimizer.exp_avg\"",
                                              function));
    for (const group& seen : groups)
      if (seen.prefix == shard.name)
        throw std::invalid_argument(
            fmt::format("{}: named shard '{}' appears twice, expected unique names", function, seen.prefix));
    std::size_t absent_numel = 0;
    for (std::size_t i = 0; i < shard.absent.size(); ++i) {
      if (shard.absent[i] >= plan.params.size() || (i > 0 && shard.absent[i] <= shard.absent[i - 1]))
        throw std::invalid_argument(fmt::format(
            "{}: named shard '{}' has absent parameter {} at position {}, expected ascending indices below {}",
            function, shard.name, shard.absent[i], i, plan.params.size()));
      absent_numel += engine.mapping.chunk(shard.absent[i]).count;
    }
    if (shard.flat.extent(0) != plan.shard_numel - absent_numel)
      throw std::invalid_argument(fmt::format(
          "{}: named shard '{}' has {} elements, expected {} (the engine's flat shard less {} absent parameters)",
          function, shard.name, shard.flat.extent(0), plan.shard_numel - absent_numel, shard.absent.size()));
    groups.push_back({shard.name, shard.flat, shard.absent});
  }
  std::vector<sharded_tensor<Scalar>> tensors;
  std::uint64_t staging = 0;
  const auto rank = static_cast<std::size_t>(engine.rank);
  const std::vector<std::size_t> selected = engine.selected();
  for (const group& g : groups)
    for (const std::size_t p : selected) {
      if (std::find(g.absent.begin(), g.absent.end(), p) != g.absent.end()) continue;
      // The chunk's offset less the absent chunks stored before it.
      std::size_t flat_first = engine.mapping.chunk(p).first;
      for (std::size_t q : g.absent)
        if (engine.mapping.chunk(q).first < engine.mapping.chunk(p).first) flat_first -= engine.mapping.chunk(q).count;
      const std::uint64_t bytes = engine.mapping.elements(p, rank).count * sizeof(Scalar);
      std::string name = engine.file_prefix + std::string(engine.params[p].name.view());
      tensors.push_back({g.prefix.empty() ? name : g.prefix + "." + name, p, g.flat, staging, bytes, flat_first});
      staging += bytes;
    }
  return tensors;
}

inline std::vector<std::uint64_t> shape_of(const param_info& param) {
  return {param.shape.begin(), param.shape.begin() + param.rank};
}

// The absolute file offset of this rank's first row of parameter p's `tensor` (full, row-major).
inline std::uint64_t first_row_offset(const tensor_info& tensor, const shard_mapping& map, std::size_t p, std::size_t rank) {
  return tensor.begin + map.elements(p, rank).first * dtype_size(tensor.type);
}

// Every tensor's checksum over all ranks: the ranks' pieces combined in rank order.
inline std::vector<checksum_state> combine_checksums(comm::mpi& comm, std::span<const checksum_state> local,
                                                     std::string_view function, const std::filesystem::path& path) {
  const int size = comm.size();
  std::vector<std::uint64_t> mine;
  for (const checksum_state& state : local) mine.insert(mine.end(), {state.polynomial, state.length});
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(size));
  together(comm, [&] {
    check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(),
                            static_cast<int>(mine.size()), MPI_UINT64_T, comm.native()),
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

// The MPI communicator the engine's own runs over: MPI-IO needs one. Every rank of an engine has
// the same backend, so every rank throws alike.
template <class Scalar>
comm::mpi& mpi_of(const sharded_view<Scalar>& engine, std::string_view function) {
  comm::mpi* found = engine.communicator != nullptr ? engine.communicator->template find_backend<comm::mpi>() : nullptr;
  if (found == nullptr)
    throw std::invalid_argument(fmt::format(
        "{}: the engine's communicator is {}, expected one over kfsdp::comm::mpi (comm::mpi, a comm::threaded "
        "of one, comm::nccl): the file is written with MPI-IO (one process without MPI: save_state_dict_file)",
        function, engine.communicator != nullptr ? "not over MPI (comm::self, say)" : "missing"));
  if (found->size() != engine.world_size || found->rank() != engine.rank)
    throw std::invalid_argument(fmt::format(
        "{}: the engine's MPI communicator is rank {} of {}, expected the engine's rank {} of {}", function,
        found->rank(), found->size(), engine.rank, engine.world_size));
  return *found;
}

// Every rank's `metadata` must be the same (its fingerprint is compared over ranks).
inline void check_same_metadata(comm::mpi& comm, const metadata_map& metadata,
                                std::span<const std::string> shard_names, std::string_view function) {
  checksum_state state;
  for (const auto& [key, value] : metadata) {
    checksum_update(state, bytes_of(key));
    checksum_update(state, bytes_of(std::string_view("\0", 1)));
    checksum_update(state, bytes_of(value));
    checksum_update(state, bytes_of(std::string_view("\0", 1)));
  }
  for (const std::string& name : shard_names) checksum_update(state, bytes_of(name + '\n'));
  const comm::value_range range = comm::range_over_ranks(comm, checksum_digest(state));
  if (range.lowest != range.highest)
    throw std::invalid_argument(fmt::format(
        "{}: the ranks pass different metadata or named shards, expected the same on every rank",
        function));
}

}  // namespace kfsdp::io::checkpoint_detail
