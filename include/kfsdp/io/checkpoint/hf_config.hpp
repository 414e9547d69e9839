#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// A Hugging Face Llama directory's config.json, read into kfsdp::llama_config and written from it
// (no MPI, no Kokkos). The weights beside it: io/checkpoint/hf_checkpoint.hpp.
//
//   config.json (transformers' LlamaConfig)        kfsdp::llama_config
//   "vocab_size": 256                        ->    .vocab = 256
//   "hidden_size": 64                        ->    .dim = 64
//   "intermediate_size": 176                 ->    .hidden = 176
//   "num_hidden_layers": 2                   ->    .layers = 2
//   "num_attention_heads": 4                 ->    .heads = 4
//   "num_key_value_heads": 2                 ->    .kv_heads = 2        (absent: = heads)
//   "max_position_embeddings": 64            ->    .seq = 64            (absent: 2048)
//   "rope_theta": 5000, or (transformers 5)
//   "rope_parameters": {"rope_theta": 5000}  ->    .rope_theta = 5000   (absent: 10000)
//   "rms_norm_eps": 1e-6                     ->    .rms_norm_eps = 1e-6 (absent: 1e-6)
//   "tie_word_embeddings": false             ->    .tie_weights = false (absent: false)
//   "head_dim": 16 (Mistral's, not 64 / 4)   ->    .head_width = 16     (absent or 64 / 4: 0)
//   "rope_scaling" or "rope_parameters":
//     {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
//      "original_max_position_embeddings": 8192}  ->  .rope (model/rope_scaling.hpp; also "linear")
//   "model_type": "llama" | "qwen2" | "mistral"  ->  .family
//   "attention_bias": true (llama)           ->    .qkv_bias = .o_bias = true; qwen2: .qkv_bias alone
//   "sliding_window": 4096 (mistral)         ->    .sliding_window = 4096 (null: 0; absent: 4096; make_llama checks it)
// Refused, naming the key, the value and what was expected, because the model would compute
// something else: another "model_type", "hidden_act" other than "silu", "mlp_bias" true, another
// "rope_type", "partial_rotary_factor" below 1, "use_sliding_window" true, "layer_types" other
// than "full_attention".
//
//   kfsdp::llama_config config = kfsdp::io::read_llama_config("tiny-llama");   // tiny-llama/config.json
//   std::string json = kfsdp::io::llama_config_json(config, kfsdp::dtype::F32);

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/io/checkpoint/safetensors.hpp>
#include <kfsdp/model/llama_config.hpp>

namespace kfsdp::io {

/// The config of config.json's text; `origin` names it in messages. Throws format_error naming
/// the origin and the key for text that is not JSON, a missing or mistyped key, an unsupported
/// setting (above) or sizes that llama_config::validate refuses.
[[nodiscard]] llama_config parse_llama_config(std::string_view json, std::string_view origin = "config.json");

/// The config of `path`: a directory (its config.json) or the file itself. Throws format_error as
/// parse_llama_config, std::runtime_error naming the file when it cannot be read.
KFSDP_EXPORT [[nodiscard]] llama_config read_llama_config(const std::filesystem::path& path);

/// config.json for `config` that transformers' from_pretrained reads as a LlamaForCausalLM,
/// Qwen2ForCausalLM or MistralForCausalLM (by config.family): model_type, architectures,
/// torch_dtype (F32 -> "float32", F64 "float64", BF16 "bfloat16", F16 "float16": the dtype of the
/// weights beside it), the sizes and settings above as read. Throws std::invalid_argument for a
/// config that validate refuses, biases its family cannot say (Llama: both or none; Qwen2: q/k/v
/// alone; Mistral: none), a sliding_window outside Mistral, or another dtype.
KFSDP_EXPORT [[nodiscard]] std::string llama_config_json(const llama_config& config, dtype stored = dtype::F32);

/// The token ids that end a generation: generation_config.json's "eos_token_id", an int or a list
/// of ints as transformers writes it ({"eos_token_id": 2} or [128001, 128009]); null or absent: none.
/// Throws format_error naming the origin and the key for text that is not JSON or an id that is not
/// an integer in 0 .. 2^31 - 1.
[[nodiscard]] std::vector<int> parse_eos_token_ids(std::string_view json, std::string_view origin = "generation_config.json");

/// parse_eos_token_ids of `directory`/generation_config.json; a missing file means no eos (none).
/// Throws std::runtime_error naming the file when it is there but cannot be read.
///
///   std::vector<int> eos = kfsdp::io::read_eos_token_ids("tiny-llama");   // {255, 254}
KFSDP_EXPORT [[nodiscard]] std::vector<int> read_eos_token_ids(const std::filesystem::path& directory);

}  // namespace kfsdp::io
