#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io checkpoint — the full model (and the training state beside it) in ONE standard
// safetensors file, written and read in parallel with MPI-IO (opt-in: this header includes mpi.h).
//
// Because kfsdp shards along dim 0, rank r's rows of a parameter are one contiguous byte range of
// the full row-major tensor: every rank writes (MPI_File_write_at_all) and reads
// (MPI_File_read_at_all) only its own rows, padding left out, so no rank ever holds the full model,
// the file is the same at every world size, and a file written at 3 ranks loads at 1, 2 or 4.
//
//   file  = [header: tensors in model order, then each named shard group | __metadata__]
//           [transformer.wte.weight][...][lm_head.weight]                     the weights
//           [optimizer.exp_avg.transformer.wte.weight][...]                   save_checkpoint only
//   __metadata__: "checksum.<tensor>" per tensor, "kfsdp.parameters", "kfsdp.numel",
//                 "kfsdp.dtype", "kfsdp.header_checksum", and the caller's keys (step, rng, ...)
//
// Nothing lost: the file is written under a temporary name in the same directory, synced, and
// renamed over `path` by rank 0 only after every rank reported success; a job killed mid-write
// leaves the previous file intact. On load every tensor's checksum (combined over the ranks' rows)
// is verified, and every malformed file raises format_error naming the file and the tensor on
// EVERY rank, with the engine's shards (and the caller's views) left as they were.
//
//   kfsdp::comm::mpi world;
//   kfsdp::fsdp_engine<float> engine(kfsdp::make_param_table(model), world, {});
//   kfsdp::optim::adamw<float> optimizer(engine);
//   kfsdp::io::save_training_state("run/ckpt.safetensors", engine, {{"step", "1000"}}, optimizer);
//   ...                                                  // later, at any world size:
//   const auto metadata = kfsdp::io::load_training_state("run/ckpt.safetensors", engine, optimizer);
//   const std::size_t step = kfsdp::io::metadata_count(metadata, "step");
// (the optimizer's moments are tensors "optimizer.exp_avg.<parameter>", restored in place; its
// kind and step count are metadata: the checkpoint protocol, tensor/stateful.hpp)

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/checkpoint/checksum.hpp>
#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>  // one process: save_state_dict_file, load_state_dict_file
#include <kfsdp/io/checkpoint/sharded_engine.hpp>  // the engine, by a concept
#include <kfsdp/tensor/state_dict.hpp>
#include <kfsdp/tensor/stateful.hpp>

namespace kfsdp::io {

// named_shard and checkpoint_state (the checkpoint protocol's parts) are in tensor/stateful.hpp; the
// metadata keys kfsdp writes and the one-process reader and writer, in safetensors_file.hpp.
// Each function takes any sharded_engine (an fsdp_engine, the trainer's engine) and passes its
// sharded_view to the overload compiled in kfsdp_checkpoint (for float and double). Each is
// collective over the engine's own communicator, which must run over comm::mpi (itself, a
// comm::threaded of one, or comm::nccl's host channel): MPI-IO writes the file. An engine over
// comm::self or another backend is refused (std::invalid_argument, every rank alike); one process
// without MPI writes with save_state_dict_file (safetensors_file.hpp).

/// Writes the full model as one safetensors file at `path` (collective over the engine's
/// communicator). `metadata` must be the same on every rank (checked).
/// Byte-identical to save_state_dict_file(path, engine.original_state_dict(), metadata).
/// `stored` F32 writes a double engine's weights as float (rounded; a value beyond float's range
/// is refused as not finite); load_pretrained (io/checkpoint/hf_checkpoint.hpp) reads such a file back.
/// Throws on every rank: std::invalid_argument (a reserved or non-UTF-8 metadata key, ranks that
/// disagree), std::runtime_error (the file system); `path` is then left as it was.
///
///   kfsdp::io::save_model("gpt.safetensors", engine, {{"model.layers", "4"}});
template <class Scalar>
void save_model(const std::filesystem::path& path, const sharded_view<Scalar>& engine,
                const metadata_map& metadata = {}, dtype stored = dtype_of<Scalar>);
KFSDP_EXPORT template <sharded_engine Engine>
void save_model(const std::filesystem::path& path, Engine& engine,
                const metadata_map& metadata = {}, dtype stored = dtype_of<engine_scalar_t<Engine>>) {
  save_model(path, view_of(engine), metadata, stored);
}

/// save_model plus every view of state.shards as full tensors and state.metadata, in the same
/// file (one rename, so weights and optimizer state can never come from two different saves).
/// Both save under HSDP too (the engine's options().replica_group; its communicator is then the
/// shard group): the first shard group writes the flat file, which loads at any world size, flat
/// or HSDP; every rank of every group returns, or throws, together.
///
///   kfsdp::io::save_checkpoint("ckpt.safetensors", engine, state);
template <class Scalar>
void save_checkpoint(const std::filesystem::path& path, const sharded_view<Scalar>& engine,
                     const checkpoint_state<Scalar>& state);
KFSDP_EXPORT template <sharded_engine Engine>
void save_checkpoint(const std::filesystem::path& path, Engine& engine,
                     const checkpoint_state<engine_scalar_t<Engine>>& state) {
  save_checkpoint(path, view_of(engine), state);
}

/// Loads the weights of `path` into the engine's shards: each rank reads only its rows, at any
/// world size; padding rows are set to zero; checksums are verified. Strict, as PyTorch's
/// load_state_dict(strict=True): the file's weights must be the model's (a kfsdp file's count of
/// them, every tensor of a standard safetensors file); a checkpoint's optimizer state beside them
/// is ignored. Returns the file's `__metadata__`.
/// Throws format_error on every rank for a malformed file, a missing tensor, a tensor the model
/// does not have (import_weights is the lenient load that reports them), a dtype or shape that
/// is not the model's, a checksum mismatch, or a NaN or an infinity in a tensor (a file without
/// checksums is checked too; the message names the file and the tensor); the shards are then
/// unchanged.
///
///   kfsdp::io::load_model("gpt.safetensors", engine);
template <class Scalar>
metadata_map load_model(const std::filesystem::path& path, const sharded_view<Scalar>& engine);
KFSDP_EXPORT template <sharded_engine Engine>
metadata_map load_model(const std::filesystem::path& path, Engine& engine) {
  return load_model(path, view_of(engine));
}

/// The `__metadata__` of `path` alone, to check a file before loading it (collective over `comm`:
/// rank 0 reads the header, every rank parses it). Throws format_error on every rank for a header
/// that does not parse or verify, naming the file.
///
///   const auto metadata = kfsdp::io::read_metadata("ckpt.safetensors", world);
///   const auto same = kfsdp::io::read_metadata("ckpt.safetensors", engine);  // over the engine's ranks
KFSDP_EXPORT [[nodiscard]] metadata_map read_metadata(const std::filesystem::path& path, comm::mpi& comm);
template <class Scalar>
[[nodiscard]] metadata_map read_metadata(const std::filesystem::path& path, const sharded_view<Scalar>& engine);
KFSDP_EXPORT template <sharded_engine Engine>
[[nodiscard]] metadata_map read_metadata(const std::filesystem::path& path, Engine& engine) {
  return read_metadata(path, view_of(engine));
}

/// What import_weights did, by tensor name: what it loaded, what the model has and the file lacks
/// (left as they were, e.g. freshly initialised), what the file has and the model lacks (ignored).
struct import_report {
  std::vector<std::string> loaded;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  metadata_map metadata;  // the file's __metadata__
};

/// "loaded 10 of 12 tensors; missing (kept as they were): 'head.weight', 'head.bias'; unexpected
/// (ignored): 'optimizer.exp_avg.fc.weight'", for a log line.
[[nodiscard]] std::string describe(const import_report& report);

/// Fine-tuning: loads by name the weights of `path` that the model has (like PyTorch's
/// load_state_dict(strict=False)), at any world size; a tensor the file lacks keeps its current
/// value, a tensor the model lacks is ignored, and the report names both. A tensor present in both
/// with another dtype or shape is still a format_error, as is a corrupt file; nothing is changed
/// unless everything checked out on every rank. Export the weights alone with save_model.
///
///   kfsdp::io::save_model("pretrained.safetensors", engine);                // weights only
///   ...                                                                       // a new run:
///   const kfsdp::io::import_report report = kfsdp::io::import_weights("pretrained.safetensors", engine);
///   if (engine.rank() == 0) fmt::print("{}\n", kfsdp::io::describe(report));
KFSDP_EXPORT template <class Scalar>
[[nodiscard]] import_report import_weights(const std::filesystem::path& path,
                                           const sharded_view<Scalar>& engine);
template <sharded_engine Engine>
[[nodiscard]] import_report import_weights(const std::filesystem::path& path, Engine& engine) {
  return import_weights(path, view_of(engine));
}

/// load_model plus every view of state.shards (restored in place from "<name>.<parameter>"), and
/// state.metadata replaced by the file's `__metadata__`. Nothing is changed unless everything
/// verified on every rank.
///
///   kfsdp::io::load_checkpoint("ckpt.safetensors", engine, state);
///   std::int64_t step = std::stoll(state.metadata.at("step"));
template <class Scalar>
void load_checkpoint(const std::filesystem::path& path, const sharded_view<Scalar>& engine,
                     checkpoint_state<Scalar>& state);
KFSDP_EXPORT template <sharded_engine Engine>
void load_checkpoint(const std::filesystem::path& path, Engine& engine,
                     checkpoint_state<engine_scalar_t<Engine>>& state) {
  load_checkpoint(path, view_of(engine), state);
}

/// The checkpoint protocol (tensor/stateful.hpp) over save_checkpoint: the weights, the state of every
/// part (an optimizer, a sampler) and `metadata`, in one file; the caller names no tensor.
///
///   kfsdp::io::save_training_state("run.safetensors", engine, {{"step", "20"}}, optimizer);
KFSDP_EXPORT template <sharded_engine Engine, class... Parts>
  requires(stateful<Parts, engine_scalar_t<Engine>> && ...)
void save_training_state(const std::filesystem::path& path, Engine& engine,
                         const metadata_map& metadata, const Parts&... parts) {
  checkpoint_state<engine_scalar_t<Engine>> state{.metadata = metadata};
  (parts.add_state(state), ...);
  save_checkpoint(path, engine, state);
}

/// What save_training_state wrote, into the engine and every part: the views in place, then each
/// part's restore_state; returns the file's metadata. A malformed file throws format_error with
/// nothing changed; a part that refuses the file (another optimizer, say) std::invalid_argument
/// naming the key, after the weights and views were read.
///
///   const auto metadata = kfsdp::io::load_training_state("run.safetensors", engine, optimizer);
///   const std::size_t step = kfsdp::io::metadata_count(metadata, "step");
KFSDP_EXPORT template <sharded_engine Engine, class... Parts>
  requires(stateful<Parts, engine_scalar_t<Engine>> && ...)
metadata_map load_training_state(const std::filesystem::path& path, Engine& engine,
                                 Parts&... parts) {
  checkpoint_state<engine_scalar_t<Engine>> state;
  (parts.add_state(state), ...);
  load_checkpoint(path, engine, state);
  (parts.restore_state(state.metadata), ...);
  return std::move(state.metadata);
}

namespace testing {
/// Test hook standing in for a kill: called on every rank once the temporary file holds the header
/// but not the data, with the temporary file's path. When it returns true on any rank, the writers
/// stop there as a killed job would (no sync, no rename, the partial temporary file left behind)
/// and throw std::runtime_error on every rank. An empty function (the default) disables it.
///
///   kfsdp::io::testing::set_stop_after_header([](const std::filesystem::path&) { return true; });
void set_stop_after_header(std::function<bool(const std::filesystem::path&)> hook);
}  // namespace testing

}  // namespace kfsdp::io
