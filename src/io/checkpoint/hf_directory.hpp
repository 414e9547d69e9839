#pragma once
// What Hugging Face directories share (hf_checkpoint.cpp, peft_adapter.cpp): a weights file, maybe
// an index of shards, a JSON config beside them, each saved and loaded as load_pretrained and
// save_pretrained do; and which of a model's parameters are LoRA adapters (peft's names).
//   model:   config.json,         model.safetensors (or model.safetensors.index.json and its shards)
//   adapter: adapter_config.json, adapter_model.safetensors, names prefixed "base_model.model."

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/io/checkpoint/sharded_engine.hpp>
#include <kfsdp/model/lora_config.hpp>  // is_lora_adapter

namespace kfsdp::io {

struct hf_files {
  std::string_view weights;  // the single weights file
  std::string_view index;    // the index of a sharded save; "" when there is none
  std::string_view config;   // the JSON written beside the weights, renamed into place last
  std::string_view what;     // what the directory is, for messages
};
inline constexpr hf_files model_files{"model.safetensors", "model.safetensors.index.json", "config.json",
                                      "a Hugging Face model directory (save_pretrained's)"};
inline constexpr hf_files adapter_files{"adapter_model.safetensors", "", "adapter_config.json",
                                        "a peft adapter directory (save_adapter's, or PeftModel.save_pretrained's)"};
inline constexpr std::string_view peft_prefix = "base_model.model.";  // peft's names: the model inside a PeftModel

// The engine's adapters (or everything but them) as a part of its view; the view itself when the
// model has no adapter and the base is asked for.
template <class Scalar>
sharded_view<Scalar> lora_part(const sharded_view<Scalar>& engine, bool adapters) {
  std::vector<std::size_t> chosen;
  for (const std::size_t p : engine.selected())
    if (is_lora_adapter(engine.params[p].name.view()) == adapters) chosen.push_back(p);
  if (!adapters && chosen.size() == engine.selected().size()) return engine;
  sharded_view<Scalar> part = engine;
  part.part = std::make_shared<const std::vector<std::size_t>>(std::move(chosen));
  return part;
}

// load_pretrained and save_pretrained, for any of the directories above (hf_checkpoint.cpp).
template <class Scalar>
void load_hf_weights(const std::filesystem::path& directory, const hf_files& files, const sharded_view<Scalar>& engine,
                     const std::vector<std::string>& ignore, std::string_view function);
template <class Scalar>
void save_hf_weights(const std::filesystem::path& directory, const hf_files& files, const sharded_view<Scalar>& engine,
                     std::string_view config_json, dtype stored, std::string_view function);

}  // namespace kfsdp::io
