#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// One safetensors file from one process (no MPI): the full state dict written with checksums,
// temporary name, fsync and rename, and read back verified; and the metadata keys kfsdp's files
// carry. Parallel checkpoints over MPI-IO (io/checkpoint/checkpoint.hpp) write the same files.
//
//   kfsdp::io::save_state_dict_file("model.safetensors", full, {{"step", "100"}});
//   kfsdp::io::metadata_map metadata;
//   kfsdp::state_dict again = kfsdp::io::load_state_dict_file("model.safetensors", &metadata);

#include <filesystem>
#include <string_view>

#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/tensor/state_dict.hpp>

namespace kfsdp::io {

/// Metadata keys that the writer sets itself; a caller's key equal to one of these (or starting
/// with "checksum.") is an error.
inline constexpr std::string_view checksum_key_prefix = "checksum.";
KFSDP_EXPORT inline constexpr std::string_view header_checksum_key = "kfsdp.header_checksum";
inline constexpr std::string_view parameters_key = "kfsdp.parameters";  // weight tensors in the file
inline constexpr std::string_view numel_key = "kfsdp.numel";            // elements of the weights
inline constexpr std::string_view dtype_key = "kfsdp.dtype";            // "F32" or "F64"

/// The plain sequential writer of a full (gathered) state dict, from one process (rank 0): the
/// same bytes as save_model for the same weights and metadata; also temporary name + fsync +
/// rename. Throws std::invalid_argument for a reserved metadata key, std::runtime_error for I/O.
///
///   auto full = engine.original_state_dict(/*rank0_only=*/true);
///   if (world.rank() == 0) kfsdp::io::save_state_dict_file("gathered.safetensors", full, {});
void save_state_dict_file(const std::filesystem::path& path, const state_dict& full,
                          const metadata_map& metadata = {});

/// Reads a whole file written by save_model, save_checkpoint or save_state_dict_file from one
/// process, every tensor checksum-verified (F64, F32, BF16 and F16 tensors, kept in their dtype);
/// a standard safetensors file without kfsdp's checksum keys loads after the layout checks,
/// unverified (load_model likewise). Throws format_error naming the file and the tensor.
///
///   kfsdp::state_dict full = kfsdp::io::load_state_dict_file("gpt.safetensors");
[[nodiscard]] state_dict load_state_dict_file(const std::filesystem::path& path,
                                              metadata_map* metadata = nullptr);

/// The `__metadata__` of a file alone (its header read and verified), to size a model before
/// loading it. Throws format_error naming the file.
///
///   const auto metadata = kfsdp::io::read_file_metadata("surrogate.safetensors");
KFSDP_EXPORT [[nodiscard]] metadata_map read_file_metadata(const std::filesystem::path& path);

}  // namespace kfsdp::io
