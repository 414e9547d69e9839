// Parallel safetensors checkpoints over MPI-IO, the writer (include/kfsdp/io/checkpoint/checkpoint.hpp):
// save_model, save_checkpoint (save_state_dict_file is in safetensors_file.cpp).
#include "checkpoint_transfer.hpp"

namespace kfsdp::io {

using namespace checkpoint_detail;

namespace {

// ------------------------------------------------------------------ the parallel writer

template <class Scalar>
void write_sharded_file(std::string_view function, const std::filesystem::path& requested,
                        const sharded_view<Scalar>& engine, comm::mpi& comm,
                        std::span<const named_shard<Scalar>> shards, const metadata_map& metadata,
                        dtype stored = dtype_of<Scalar>) {
  const MPI_Comm native = comm.native();
  const int rank = comm.rank();
  std::vector<sharded_tensor<Scalar>> tensors;
  std::vector<std::byte> staging;
  std::vector<checksum_state> local_checksums;
  std::filesystem::path path;
  together(comm, [&] {
    path = save_target(requested, function);  // every rank refuses the same bad path
    check_user_metadata(metadata, function);
    if (stored != dtype_of<Scalar> && !(stored == dtype::F32 && shards.empty()))
      throw std::invalid_argument(fmt::format("{}: stored dtype {}, expected {} (the engine's) or F32 (weights only)",
                                              function, dtype_name(stored), dtype_name(dtype_of<Scalar>)));
    tensors = sharded_tensors(engine, shards, function);
    // In the file's dtype: a double engine's weights stored as F32 take half the bytes.
    for (sharded_tensor<Scalar>& tensor : tensors) {
      tensor.staging_offset = tensor.staging_offset / sizeof(Scalar) * dtype_size(stored);
      tensor.local_bytes = tensor.local_bytes / sizeof(Scalar) * dtype_size(stored);
    }
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
      const std::size_t first = tensor.flat_first, count = tensor.local_bytes / dtype_size(stored);
      check_finite(std::span<const Scalar>(host.data() + first, count), tensor.name, function, requested);
      if (stored == dtype_of<Scalar>) {
        std::memcpy(staging.data() + tensor.staging_offset, host.data() + first, tensor.local_bytes);
      } else {
        std::vector<float> narrowed(host.begin() + static_cast<std::ptrdiff_t>(first),
                                    host.begin() + static_cast<std::ptrdiff_t>(first + count));
        check_finite(std::span<const float>(narrowed), tensor.name, function, requested);  // beyond float's range
        std::memcpy(staging.data() + tensor.staging_offset, narrowed.data(), tensor.local_bytes);
      }
      local_checksums.push_back(
          checksum_of(std::span(staging).subspan(tensor.staging_offset, tensor.local_bytes)));
    }
  });
  std::vector<std::string> shard_names;
  for (const named_shard<Scalar>& shard : shards) shard_names.push_back(shard.name);
  together(comm, [&] { check_same_metadata(comm, metadata, shard_names, function); });
  const std::vector<checksum_state> checksums = combine_checksums(comm, local_checksums, function, path);

  file_layout layout;
  std::vector<file_piece> pieces;
  together(comm, [&] {
    std::vector<tensor_entry> entries;
    std::uint64_t weight_numel = 0;
    const std::size_t weights = engine.selected().size();
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const param_info& param = engine.params[tensors[t].param];
      entries.push_back({tensors[t].name, stored, shape_of(param)});
      if (t < weights) weight_numel += param.numel;  // the weights come first
    }
    layout = checkpoint_layout(entries, checksums, metadata, weights, weight_numel, dtype_name(stored));
    for (std::size_t t = 0; t < tensors.size(); ++t)
      if (tensors[t].local_bytes > 0)
        pieces.push_back({first_row_offset(layout.tensors[t], engine.mapping, tensors[t].param,
                                           static_cast<std::size_t>(rank)),
                          tensors[t].local_bytes});
  });

  if (rank == 0) remove_leftover_temporaries(path);
  const std::filesystem::path temporary =
      broadcast_string(native, rank == 0 ? temporary_name(path).string() : std::string());
  MPI_File file = MPI_FILE_NULL;
  together(comm, [&] {
    check_mpi(MPI_File_open(native, temporary.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY,
                            MPI_INFO_NULL, &file),
              function, "MPI_File_open", temporary);
  });
  try {
    together(comm, [&] {
      check_mpi(MPI_File_set_size(file, static_cast<MPI_Offset>(layout.file_size)), function,
                "MPI_File_set_size", temporary);
    });
    together(comm, [&] {
      MPI_Status status;
      check_mpi(MPI_File_write_at_all(file, 0, layout.prefix.data(),
                                      rank == 0 ? static_cast<int>(layout.prefix.size()) : 0,
                                      MPI_BYTE, &status),
                function, "MPI_File_write_at_all of the header", temporary);
    });
    bool stop = false;
    together(comm, [&] { stop = stop_after_header_hook() && stop_after_header_hook()(temporary); });
    if (comm::any_rank(comm, stop))
      throw simulated_kill(fmt::format("{}: stopped by the test hook after the header of {} (a "
                                       "simulated kill: {} left as it was)",
                                       function, quoted(temporary), quoted(path)));
    agree(comm, transfer_pieces(file, native, pieces, staging.data(), true, function, temporary));
    together(comm, [&] { check_mpi(MPI_File_sync(file), function, "MPI_File_sync", temporary); });
    const int closed = MPI_File_close(&file);
    file = MPI_FILE_NULL;
    together(comm, [&] { check_mpi(closed, function, "MPI_File_close", temporary); });
    // Every rank's data is synced: only now may the new file replace the old one.
    together(comm, [&] {
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

// HSDP (the engine's options().replica_group): every shard group holds the same shards, so the
// first group writes the file, the same flat file flat FSDP writes, and the others wait for its
// verdict, sent over the replica groups: every rank returns, or throws, together.
template <class Scalar, class Write>
void written_by_first_group(std::string_view function, const std::filesystem::path& path,
                            const sharded_view<Scalar>& engine, const Write& write) {
  if (!engine.replica_group || engine.replica_group->size() == 1) {
    write();
    return;
  }
  comm::any_communicator replicas = *engine.replica_group;
  std::exception_ptr error;
  if (replicas.rank() == 0) {
    try {
      write();  // its ranks agree on the outcome among themselves
    } catch (...) {
      error = std::current_exception();
    }
  }
  double failed[1] = {error != nullptr ? 1.0 : 0.0};
  comm::broadcast(replicas, std::span<double>(failed), 0);
  if (error) std::rethrow_exception(error);
  if (failed[0] != 0)
    throw std::runtime_error(fmt::format("{}: {}: the first shard group could not write it (its ranks say why)",
                                         function, quoted(path)));
}

}  // namespace

// ------------------------------------------------------------------ public API

template <class Scalar>
void save_model(const std::filesystem::path& path, const sharded_view<Scalar>& engine,
                const metadata_map& metadata, dtype stored) {
  constexpr std::string_view function = "kfsdp::io::save_model";
  comm::mpi& comm = mpi_of(engine, function);
  written_by_first_group(function, path, engine,
                         [&] { write_sharded_file<Scalar>(function, path, engine, comm, {}, metadata, stored); });
}

template <class Scalar>
void save_checkpoint(const std::filesystem::path& path, const sharded_view<Scalar>& engine,
                     const checkpoint_state<Scalar>& state) {
  constexpr std::string_view function = "kfsdp::io::save_checkpoint";
  comm::mpi& comm = mpi_of(engine, function);
  written_by_first_group(function, path, engine, [&] {
    write_sharded_file<Scalar>(function, path, engine, comm, state.shards, state.metadata);
  });
}

namespace testing {
void set_stop_after_header(std::function<bool(const std::filesystem::path&)> hook) {
  stop_after_header_hook() = std::move(hook);
}
}  // namespace testing

#define KFSDP_CHECKPOINT_INSTANTIATE(Scalar)                                                      \
  template void save_model<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&,           \
                                   const metadata_map&, dtype);                                   \
  template void save_checkpoint<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&,      \
                                        const checkpoint_state<Scalar>&);
KFSDP_CHECKPOINT_INSTANTIATE(float)
KFSDP_CHECKPOINT_INSTANTIATE(double)
#undef KFSDP_CHECKPOINT_INSTANTIATE

}  // namespace kfsdp::io
