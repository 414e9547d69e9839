#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io LoRA adapters as peft saves and loads them, and the merge of an adapter into its base
// (collective over the engine's communicator, which must run over comm::mpi: this header includes
// mpi.h, as hf_checkpoint.hpp). A model with adapters is one built with a lora_config
// (make_llama(config, window, lora)); its adapters are the parameters peft names
// "<module>.lora_A.weight" and "<module>.lora_B.weight".
//
//   tuned-adapter/adapter_config.json         peft's LoraConfig: r, lora_alpha, target_modules, ...
//   tuned-adapter/adapter_model.safetensors   the adapters alone, as "base_model.model.<name>"
//
//   const kfsdp::lora_config lora{.rank = 8, .alpha = 16, .targets = {"q_proj", "v_proj"}};
//   kfsdp::trainer<double> trainer(kfsdp::make_llama(config, 0, lora), world, options, groups);  // base frozen
//   kfsdp::io::load_pretrained("llama", trainer);             // the base; the adapters keep their start
//   ...                                                         // train
//   kfsdp::io::save_adapter("tuned-adapter", trainer, lora, "llama");   // PeftModel.from_pretrained reads it
//   kfsdp::io::save_merged("tuned-llama", trainer, lora, kfsdp::io::llama_config_json(config));  // W + (alpha/r)·B·A
//
// An adapter made elsewhere continues to train: its config gives the model, then its tensors load.
//   const kfsdp::lora_config lora = kfsdp::io::read_lora_config("peft-adapter");
//   ... make_llama(config, 0, lora) ..., load_pretrained("llama", trainer), load_adapter("peft-adapter", trainer);

#include <filesystem>
#include <string>
#include <string_view>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/io/checkpoint/sharded_engine.hpp>  // the engine, by a concept
#include <kfsdp/model/lora_config.hpp>

namespace kfsdp::io {

/// The lora_config of adapter_config.json's text; `origin` names it in messages. Throws
/// format_error naming the origin and the key for text that is not JSON, a peft_type other than
/// "LORA", a missing r or target_modules, or a setting kfsdp does not compute (bias other than
/// "none", use_rslora, use_dora, fan_in_fan_out, modules_to_save, layers_to_transform,
/// rank_pattern, alpha_pattern, exclude_modules, lora_bias, target_parameters, a target_modules
/// string other than "all-linear": peft reads it as a regular expression). lora_dropout is kept
/// (kfsdp trains without dropout). Keys peft adds that change nothing computed are ignored.
[[nodiscard]] lora_config parse_lora_config(std::string_view json, std::string_view origin = "adapter_config.json");

/// The lora_config of `path`: a directory (its adapter_config.json) or the file itself.
KFSDP_EXPORT [[nodiscard]] lora_config read_lora_config(const std::filesystem::path& path);

/// adapter_config.json for `lora`, as peft writes it for a causal LM: peft_type "LORA",
/// task_type "CAUSAL_LM", r, lora_alpha, target_modules, lora_dropout, bias "none", and
/// base_model_name_or_path (`base_model`, or null when empty). Throws std::invalid_argument for a
/// config without an adapter (rank 0).
KFSDP_EXPORT [[nodiscard]] std::string lora_config_json(const lora_config& lora, std::string_view base_model = "");

/// Writes the engine's adapters as peft's adapter directory: adapter_model.safetensors (each
/// adapter as "base_model.model.<name>", stored as F32 or the engine's scalar) and
/// adapter_config.json for `lora`, each renamed into place on its own (config last); nothing
/// else in the directory changes. Throws std::invalid_argument for a model without adapters, or
/// as save_pretrained.
template <class Scalar>
void save_adapter(const std::filesystem::path& directory, const sharded_view<Scalar>& engine, const lora_config& lora,
                  std::string_view base_model = "", dtype stored = dtype::F32);
KFSDP_EXPORT template <sharded_engine Engine>
void save_adapter(const std::filesystem::path& directory, Engine& engine, const lora_config& lora,
                  std::string_view base_model = "", dtype stored = dtype::F32) {
  save_adapter(directory, view_of(engine), lora, base_model, stored);
}

/// Loads the engine's adapters from a peft adapter directory (adapter_model.safetensors), strictly:
/// every adapter of the model must be there in its shape, and nothing else. The base is left as it
/// is. Throws as load_pretrained (format_error naming the file and the tensor), and
/// std::invalid_argument for a model without adapters.
template <class Scalar>
void load_adapter(const std::filesystem::path& directory, const sharded_view<Scalar>& engine);
KFSDP_EXPORT template <sharded_engine Engine>
void load_adapter(const std::filesystem::path& directory, Engine& engine) {
  load_adapter(directory, view_of(engine));
}

/// Writes the model with its adapters merged as a Hugging Face model directory (save_pretrained's
/// files and guarantees): each adapted weight as W + (alpha / r) · B A, the adapters left out.
/// Each rank merges its own rows (A gathered whole: rank · in elements per module). The engine's
/// parameters are as they were afterwards, bit for bit, whether the save succeeded or threw.
/// Throws std::invalid_argument for a model without adapters, an adapter without its base weight,
/// or `lora` without a rank; otherwise as save_pretrained.
template <class Scalar>
void save_merged(const std::filesystem::path& directory, const sharded_view<Scalar>& engine, const lora_config& lora,
                 std::string_view config_json, dtype stored = dtype_of<Scalar>);
KFSDP_EXPORT template <sharded_engine Engine>
void save_merged(const std::filesystem::path& directory, Engine& engine, const lora_config& lora, std::string_view config_json,
                 dtype stored = dtype_of<engine_scalar_t<Engine>>) {
  save_merged(directory, view_of(engine), lora, config_json, stored);
}

}  // namespace kfsdp::io
