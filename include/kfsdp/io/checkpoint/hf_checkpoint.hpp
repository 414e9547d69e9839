#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io Hugging Face checkpoints — a model directory as transformers' save_pretrained writes it
// and from_pretrained reads it, loaded into and saved from a trainer's sharded parameters over
// MPI-IO (opt-in: this header includes mpi.h). Parameters are matched by name, so the model's
// names must be the checkpoint's (make_llama names them as transformers' LlamaForCausalLM does).
//
//   tiny-llama/config.json                  the model's config (io/checkpoint/hf_config.hpp reads and writes it)
//   tiny-llama/model.safetensors            every tensor in one file, or
//   tiny-llama/model.safetensors.index.json {"metadata": {...}, "weight_map": {"lm_head.weight":
//   tiny-llama/model-00001-of-00002.safetensors   "model-00002-of-00002.safetensors", ...}}
//   tiny-llama/model-00002-of-00002.safetensors   the shards the index names
//
// Each rank reads only its own rows of each tensor (kfsdp shards along dim 0, so they are one byte
// range of the row-major tensor) from the file that holds it, at any world size, and converts them
// to the engine's scalar (F64, F32, BF16 and F16 files load into float and double engines).
//
//   kfsdp::comm::mpi world;
//   const kfsdp::llama_config config = kfsdp::io::read_llama_config("tiny-llama");
//   kfsdp::fsdp_engine<double> engine(kfsdp::make_param_table(kfsdp::make_llama(config)), world, {});
//   kfsdp::io::load_pretrained("tiny-llama", engine);
//   ...                                                                 // train
//   kfsdp::io::save_pretrained("tuned-llama", engine, kfsdp::io::llama_config_json(config), kfsdp::dtype::F32);

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/checkpoint/hf_config.hpp>
#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/io/checkpoint/sharded_engine.hpp>  // the engine, by a concept

namespace kfsdp::io {

/// Loads every parameter of the engine by name from a Hugging Face directory (collective over the
/// engine's communicator, which must run over comm::mpi, as checkpoint.hpp's functions):
/// model.safetensors.index.json and the files it names when the index is there, model.safetensors
/// otherwise. Strict: every parameter must be in the
/// directory with the same shape, and every tensor of the directory must be a parameter, except
/// those named in `ignore` (a tied model's "lm_head.weight", which some writers keep). Files
/// written by kfsdp carry checksums, which are verified. Padding rows are set to zero.
/// Throws format_error on every rank, naming the file and the tensor, for a missing or unexpected
/// tensor, another shape, a dtype that is not F64, F32, BF16 or F16, a NaN or an infinity (in the
/// engine's scalar: an F64 value beyond float's range loaded into float is one), a malformed file or index;
/// std::runtime_error for the file system. The shards are then unchanged. A model with LoRA adapters
/// (io/checkpoint/peft_adapter.hpp) loads its base: the adapters keep their values (load_adapter reads them).
///
///   kfsdp::io::load_pretrained("tiny-llama", engine);
///   kfsdp::io::load_pretrained("tied-llama", engine, {"lm_head.weight"});
template <class Scalar>
void load_pretrained(const std::filesystem::path& directory, const sharded_view<Scalar>& engine,
                     const std::vector<std::string>& ignore = {});
KFSDP_EXPORT template <sharded_engine Engine>
void load_pretrained(const std::filesystem::path& directory, Engine& engine, const std::vector<std::string>& ignore = {}) {
  load_pretrained(directory, view_of(engine), ignore);
}

/// Writes the engine's parameters as a Hugging Face directory (collective over the engine's
/// communicator):
/// `config_json` as config.json and every parameter under its name in model.safetensors, stored as
/// `stored` (F32 or the engine's scalar; metadata {"format": "pt"}, as transformers expects, and
/// kfsdp's checksums). The directory is made when missing. As transformers' save_pretrained, it
/// changes only its own files: config.json, model.safetensors, and the stale
/// model.safetensors.index.json and model-*-of-*.safetensors of an earlier sharded save, which it
/// removes (so no old index is loaded instead of the new weights); everything else in the
/// directory (tokenizer.json, generation_config.json, folders) stays as it was. Each file is
/// written under a temporary name beside it, synced and renamed into place on its own, in an
/// order that keeps the directory loadable as the old model or the new one at every instant:
/// model.safetensors, then the stale index, the stale shards, config.json last (between the last
/// two, the new weights sit beside the old config.json). A killed save's temporary files are
/// removed by the next save. Throws std::invalid_argument for a stored dtype other than F32 or the
/// engine's scalar, a parameter that is not finite, a model with LoRA adapters (save_adapter or
/// save_merged write those), or a config.json or model.safetensors that is a folder; std::runtime_error naming the file for the file system (a failed write leaves the
/// old files as they were).
///
///   kfsdp::io::save_pretrained("tuned-llama", engine, kfsdp::io::llama_config_json(config));
template <class Scalar>
void save_pretrained(const std::filesystem::path& directory, const sharded_view<Scalar>& engine,
                     std::string_view config_json, dtype stored = dtype_of<Scalar>);
KFSDP_EXPORT template <sharded_engine Engine>
void save_pretrained(const std::filesystem::path& directory, Engine& engine, std::string_view config_json,
                     dtype stored = dtype_of<engine_scalar_t<Engine>>) {
  save_pretrained(directory, view_of(engine), config_json, stored);
}

namespace testing {
/// Test hook standing in for a kill between save_pretrained's changes to the directory: called on
/// the writing rank before each stale file is removed and before config.json is renamed into
/// place, with that file's path. When it returns true, the save stops there as a killed job would
/// (what was done stays, config.json's temporary file is left behind) and throws
/// std::runtime_error on every rank. An empty function (the default) disables it. A kill while the
/// weights are written: checkpoint.hpp's set_stop_after_header.
///
///   kfsdp::io::testing::set_stop_before_change([](const std::filesystem::path&) { return true; });
void set_stop_before_change(std::function<bool(const std::filesystem::path&)> hook);
}  // namespace testing

}  // namespace kfsdp::io
