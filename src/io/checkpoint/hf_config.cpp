// A Hugging Face Llama config.json, read and written (include/kfsdp/io/checkpoint/hf_config.hpp).
#include <kfsdp/io/checkpoint/hf_config.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "json_reader.hpp"

namespace kfsdp::io {

namespace {

using json_detail::json_kind;
using json_detail::json_value;

// Reads the keys of one config.json object, each error naming the origin and the key.
struct config_keys : json_detail::object_keys {
  config_keys(const json_value& object, std::string origin)
      : object_keys(object, "kfsdp::io::read_llama_config", std::move(origin)) {}
};

std::string_view torch_dtype_name(dtype stored) {
  switch (stored) {
    case dtype::F32: return "float32";
    case dtype::F64: return "float64";
    case dtype::BF16: return "bfloat16";
    case dtype::F16: return "float16";
    default: break;
  }
  throw std::invalid_argument(fmt::format("kfsdp::io::llama_config_json: dtype {}, expected F32, F64, BF16 or F16",
                                          dtype_name(stored)));
}

// transformers' partial_rotary_factor (top level or in the RoPE object): RoPE on a part of each head.
void check_partial_rotary(const config_keys& keys) {
  if (const double partial = keys.real("partial_rotary_factor", 1.0); partial != 1.0)
    keys.fail("partial_rotary_factor", fmt::format("{}, expected 1.0 (kfsdp's RoPE turns the whole head)", partial));
}

// The RoPE scaling of a rope_scaling or rope_parameters object: its type under "rope_type" (or
// "type", as transformers 4.3x wrote it) and the factors that type reads.
void read_rope(const config_keys& keys, llama_config& config) {
  check_partial_rotary(keys);
  const std::string_view type_key = keys.find("rope_type", json_kind::string) != nullptr ? "rope_type" : "type";
  if (keys.find(type_key, json_kind::string) == nullptr) return;  // no type: theta alone, the scaling as it was
  const std::string type = keys.text(type_key, "default");
  const auto positive = [&](std::string_view key) {
    if (keys.find(key, json_kind::number) == nullptr)
      keys.fail(key, fmt::format("missing, expected a positive number (rope_type '{}' reads it)", type));
    const double value = keys.real(key, 0.0);
    if (!(value > 0.0)) keys.fail(key, fmt::format("{}, expected a positive number", value));
    return value;
  };
  if (type == "default") {
    config.rope = {};
  } else if (type == "linear") {
    config.rope = {.type = rope_type::linear, .factor = positive("factor")};
  } else if (type == "llama3") {
    config.rope = {.type = rope_type::llama3, .factor = positive("factor"), .low_freq_factor = positive("low_freq_factor"),
                   .high_freq_factor = positive("high_freq_factor"),
                   .original_max_position_embeddings = keys.size("original_max_position_embeddings")};
  } else {
    keys.fail(type_key, fmt::format("'{}', expected \"default\", \"linear\" or \"llama3\" (the RoPE scalings kfsdp "
                                    "computes)", type));
  }
}

std::string_view family_name(llama_family family) {
  switch (family) {
    case llama_family::qwen2: return "qwen2";
    case llama_family::mistral: return "mistral";
    default: return "llama";
  }
}

std::string_view architecture(llama_family family) {
  switch (family) {
    case llama_family::qwen2: return "Qwen2ForCausalLM";
    case llama_family::mistral: return "MistralForCausalLM";
    default: return "LlamaForCausalLM";
  }
}

// A factor as JSON's float ("32.0", not "32"): transformers checks the llama3 factors are floats.
std::string json_float(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

// rope_scaling as Llama 3.1 / 3.2 publish it, or null.
std::string rope_scaling_json(const rope_scaling& rope) {
  switch (rope.type) {
    case rope_type::linear: return fmt::format("{{\"factor\": {}, \"rope_type\": \"linear\"}}", json_float(rope.factor));
    case rope_type::llama3:
      return fmt::format(
          "{{\"factor\": {}, \"high_freq_factor\": {}, \"low_freq_factor\": {}, \"original_max_position_embeddings\": {}, "
          "\"rope_type\": \"llama3\"}}",
          json_float(rope.factor), json_float(rope.high_freq_factor), json_float(rope.low_freq_factor),
          rope.original_max_position_embeddings);
    default: return "null";
  }
}

}  // namespace

llama_config parse_llama_config(std::string_view json, std::string_view origin) {
  const std::string where = fmt::format("'{}'", origin);
  json_value root;
  try {
    root = json_detail::parse_json(json, origin);
  } catch (const format_error& error) {
    throw format_error(fmt::format("kfsdp::io::read_llama_config: config.json {} is not valid JSON: {}",
                                   where, error.what()));
  }
  if (root.kind != json_kind::object)
    throw format_error(
        fmt::format("kfsdp::io::read_llama_config: config.json {} holds {}, expected a JSON object", where,
                    json_detail::kind_name(root.kind)));
  const config_keys keys(root, where);

  llama_config config;
  const std::string type = keys.text("model_type", "");
  if (type == "qwen2") config.family = llama_family::qwen2;
  else if (type == "mistral") config.family = llama_family::mistral;
  else if (type != "llama") keys.fail("model_type", fmt::format("'{}', expected \"llama\", \"qwen2\" or \"mistral\"", type));
  if (const std::string act = keys.text("hidden_act", "silu"); act != "silu")
    keys.fail("hidden_act", fmt::format("'{}', expected \"silu\" (kfsdp's Llama MLP is SwiGLU)", act));
  if (keys.flag("mlp_bias", false)) keys.fail("mlp_bias", "true, expected false (kfsdp's Llama MLP has no bias)");
  // Llama's attention_bias biases q, k, v and o_proj; Qwen2 biases q, k and v always, with no key saying so.
  config.qkv_bias = config.family == llama_family::qwen2 || (config.family == llama_family::llama && keys.flag("attention_bias", false));
  config.o_bias = config.family == llama_family::llama && config.qkv_bias;
  // Mistral's sliding_window: null is none, absent is MistralConfig's 4096.
  if (config.family == llama_family::mistral && root.find("sliding_window") == nullptr) config.sliding_window = 4096;
  else if (config.family == llama_family::mistral) config.sliding_window = keys.size("sliding_window", 0);
  if (keys.flag("use_sliding_window", false))  // Qwen2's switch; off, its sliding_window and max_window_layers do nothing
    keys.fail("use_sliding_window", "true, expected false (kfsdp's attention has no sliding window)");
  if (const json_value* layer_types = keys.find("layer_types", json_kind::array))
    for (std::size_t i = 0; i < layer_types->values.size(); ++i)
      if (const json_value& layer = layer_types->values[i]; layer.kind != json_kind::string || layer.text != "full_attention")
        keys.fail("layer_types", fmt::format("item {} is '{}', expected \"full_attention\" (kfsdp's attention has no "
                                             "sliding window)", i, layer.text));

  config.vocab = keys.size("vocab_size");
  config.dim = keys.size("hidden_size");
  config.hidden = keys.size("intermediate_size");
  config.layers = keys.size("num_hidden_layers");
  config.heads = keys.size("num_attention_heads");
  config.kv_heads = keys.size("num_key_value_heads", config.heads);
  config.seq = keys.size("max_position_embeddings", 2048);
  config.rope_theta = keys.real("rope_theta", 10000.0);
  check_partial_rotary(keys);
  // transformers 4 writes the scaling as rope_scaling; transformers 5 writes RoPE's settings in rope_parameters.
  if (const json_value* rope = keys.find("rope_scaling", json_kind::object))
    read_rope(config_keys(*rope, where + " (rope_scaling)"), config);
  if (const json_value* rope = keys.find("rope_parameters", json_kind::object)) {
    const config_keys inner(*rope, where + " (rope_parameters)");
    config.rope_theta = inner.real("rope_theta", config.rope_theta);
    read_rope(inner, config);
  }
  config.rms_norm_eps = keys.real("rms_norm_eps", 1e-6);
  config.tie_weights = keys.flag("tie_word_embeddings", false);
  // transformers' head_dim defaults to hidden_size // num_attention_heads; another value is the heads' own width.
  if (const std::size_t head_dim = keys.size("head_dim", config.dim / config.heads);
      head_dim != config.dim / config.heads || config.dim % config.heads != 0)
    config.head_width = head_dim;
  try {
    config.validate();
  } catch (const std::invalid_argument& error) {
    throw format_error(fmt::format("kfsdp::io::read_llama_config: {}: {}", where, error.what()));
  }
  return config;
}

llama_config read_llama_config(const std::filesystem::path& path) {
  std::error_code ignored;
  const std::filesystem::path file = std::filesystem::is_directory(path, ignored) ? path / "config.json" : path;
  return parse_llama_config(json_detail::read_text_file(file, "config.json", "kfsdp::io::read_llama_config"), file.string());
}

std::vector<int> parse_eos_token_ids(std::string_view json, std::string_view origin) {
  constexpr std::string_view function = "kfsdp::io::read_eos_token_ids";
  json_value root;
  try {
    root = json_detail::parse_json(json, origin);
  } catch (const format_error& error) {
    throw format_error(fmt::format("{}: '{}' is not valid JSON: {}", function, origin, error.what()));
  }
  if (root.kind != json_kind::object)
    throw format_error(fmt::format("{}: '{}' holds {}, expected a JSON object", function, origin, json_detail::kind_name(root.kind)));
  const json_value* eos = root.find("eos_token_id");
  if (eos == nullptr || eos->kind == json_kind::null) return {};
  const auto id_of = [&](const json_value& value) {
    int parsed = -1;
    const char* end = value.text.data() + value.text.size();
    const auto [stop, error] = std::from_chars(value.text.data(), end, parsed);
    if (value.kind != json_kind::number || error != std::errc() || stop != end || parsed < 0)
      throw format_error(fmt::format("{}: '{}': key 'eos_token_id': {} '{}', expected an integer in 0 .. {} (or a list of them)",
                                     function, origin, json_detail::kind_name(value.kind), value.text,
                                     std::numeric_limits<int>::max()));
    return parsed;
  };
  std::vector<int> ids;
  if (eos->kind == json_kind::array)
    for (const json_value& item : eos->values) ids.push_back(id_of(item));
  else
    ids.push_back(id_of(*eos));
  return ids;
}

std::vector<int> read_eos_token_ids(const std::filesystem::path& directory) {
  const std::filesystem::path file = directory / "generation_config.json";
  std::error_code missing;
  if (!std::filesystem::exists(std::filesystem::symlink_status(file, missing)))
    return {};  // transformers without the file: no eos
  return parse_eos_token_ids(json_detail::read_text_file(file, "generation_config.json", "kfsdp::io::read_eos_token_ids"), file.string());
}

std::string llama_config_json(const llama_config& config, dtype stored) {
  constexpr std::string_view function = "kfsdp::io::llama_config_json";
  config.validate();
  const std::string_view torch_dtype = torch_dtype_name(stored);
  const llama_family family = config.family;
  // Each family's config says its biases its own way (Llama: attention_bias for all four; Qwen2: none).
  const bool biases_fit = family == llama_family::llama    ? config.qkv_bias == config.o_bias
                          : family == llama_family::qwen2 ? config.qkv_bias && !config.o_bias
                                                          : !config.qkv_bias && !config.o_bias;
  if (!biases_fit)
    throw std::invalid_argument(fmt::format(
        "{}: qkv_bias {} and o_bias {}, expected {} for model_type \"{}\"", function, config.qkv_bias, config.o_bias,
        family == llama_family::llama ? "both equal (attention_bias)"
                                      : family == llama_family::qwen2 ? "true and false" : "both false",
        family_name(family)));
  if (family != llama_family::mistral && config.sliding_window != 0)
    throw std::invalid_argument(fmt::format("{}: sliding_window {}, expected 0 for model_type \"{}\" (Mistral's key)",
                                            function, config.sliding_window, family_name(family)));
  // Keys in alphabetical order, as transformers writes them; a Llama without the new settings gives the text it always did.
  std::string json = fmt::format("{{\n  \"architectures\": [\"{}\"],\n  \"model_type\": \"{}\",\n",
                                 architecture(family), family_name(family));
  const auto line = [&json](std::string_view key, const auto& value) { json += fmt::format("  \"{}\": {},\n", key, value); };
  if (family == llama_family::llama) line("attention_bias", config.qkv_bias);
  line("attention_dropout", "0.0");
  line("head_dim", config.head_dim());
  line("hidden_act", "\"silu\"");
  line("hidden_size", config.dim);
  line("intermediate_size", config.hidden);
  line("max_position_embeddings", config.seq);
  if (family == llama_family::llama) line("mlp_bias", false);
  line("num_attention_heads", config.heads);
  line("num_hidden_layers", config.layers);
  line("num_key_value_heads", config.kv_heads);
  // Reals as the shortest text that reads back to the same double ("1e-06", "10000").
  line("rms_norm_eps", config.rms_norm_eps);
  line("rope_scaling", rope_scaling_json(config.rope));
  line("rope_theta", config.rope_theta);
  if (family == llama_family::mistral) line("sliding_window", config.sliding_window == 0 ? "null" : std::to_string(config.sliding_window));
  if (family == llama_family::qwen2) line("sliding_window", "null");
  line("tie_word_embeddings", config.tie_weights);
  line("torch_dtype", fmt::format("\"{}\"", torch_dtype));
  if (family == llama_family::qwen2) line("use_sliding_window", false);
  json += fmt::format("  \"vocab_size\": {}\n}}\n", config.vocab);
  return json;
}

}  // namespace kfsdp::io
