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
class config_keys {
 public:
  config_keys(const json_value& object, std::string origin) : object_(object), origin_(std::move(origin)) {}

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw format_error(fmt::format("kfsdp::io::read_llama_config: {}: key '{}': {}", origin_, key, what));
  }

  // A member of the given kind, or nullptr when absent or null.
  const json_value* find(std::string_view key, json_kind kind) const {
    const json_value* value = object_.find(key);
    if (value == nullptr || value->kind == json_kind::null) return nullptr;
    if (value->kind != kind)
      fail(key, fmt::format("{} '{}', expected {}", json_detail::kind_name(value->kind), value->text,
                            json_detail::kind_name(kind)));
    return value;
  }

  std::size_t size(std::string_view key, std::optional<std::size_t> absent = std::nullopt) const {
    const json_value* value = find(key, json_kind::number);
    if (value == nullptr) {
      if (absent) return *absent;
      fail(key, "missing, expected a positive integer");
    }
    std::size_t parsed = 0;
    const char* end = value->text.data() + value->text.size();
    const auto [stop, error] = std::from_chars(value->text.data(), end, parsed);
    if (error != std::errc() || stop != end || parsed == 0)
      fail(key, fmt::format("{}, expected a positive integer", value->text));
    return parsed;
  }

  double real(std::string_view key, double absent) const {
    const json_value* value = find(key, json_kind::number);
    if (value == nullptr) return absent;
    errno = 0;
    char* stop = nullptr;
    const double parsed = std::strtod(value->text.c_str(), &stop);
    if (errno != 0 || stop != value->text.c_str() + value->text.size() || !std::isfinite(parsed))
      fail(key, fmt::format("{}, expected a finite number", value->text));
    return parsed;
  }

  bool flag(std::string_view key, bool absent) const {
    const json_value* value = find(key, json_kind::boolean);
    return value == nullptr ? absent : value->text == "true";
  }

  std::string text(std::string_view key, std::string_view absent) const {
    const json_value* value = find(key, json_kind::string);
    return value == nullptr ? std::string(absent) : value->text;
  }

 private:
  const json_value& object_;
  std::string origin_;
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

  if (const std::string type = keys.text("model_type", ""); type != "llama")
    keys.fail("model_type", fmt::format("'{}', expected \"llama\"", type));
  if (const std::string act = keys.text("hidden_act", "silu"); act != "silu")
    keys.fail("hidden_act", fmt::format("'{}', expected \"silu\" (kfsdp's Llama MLP is SwiGLU)", act));
  for (const std::string_view bias : {"attention_bias", "mlp_bias"})
    if (keys.flag(bias, false)) keys.fail(bias, "true, expected false (kfsdp's Llama linears have no bias)");
  if (keys.find("rope_scaling", json_kind::object) != nullptr)
    keys.fail("rope_scaling", "set, expected null or absent (kfsdp's RoPE has no scaling)");

  llama_config config;
  config.vocab = keys.size("vocab_size");
  config.dim = keys.size("hidden_size");
  config.hidden = keys.size("intermediate_size");
  config.layers = keys.size("num_hidden_layers");
  config.heads = keys.size("num_attention_heads");
  config.kv_heads = keys.size("num_key_value_heads", config.heads);
  config.seq = keys.size("max_position_embeddings", 2048);
  config.rope_theta = keys.real("rope_theta", 10000.0);
  // transformers 5 writes RoPE's settings in one object instead.
  if (const json_value* rope = keys.find("rope_parameters", json_kind::object)) {
    const config_keys inner(*rope, where + " (rope_parameters)");
    if (const std::string type = inner.text("rope_type", "default"); type != "default")
      inner.fail("rope_type", fmt::format("'{}', expected \"default\" (kfsdp's RoPE has no scaling)", type));
    config.rope_theta = inner.real("rope_theta", config.rope_theta);
  }
  config.rms_norm_eps = keys.real("rms_norm_eps", 1e-6);
  config.tie_weights = keys.flag("tie_word_embeddings", false);
  if (config.heads != 0 && config.dim % config.heads == 0)
    if (const std::size_t head_dim = keys.size("head_dim", config.dim / config.heads); head_dim != config.dim / config.heads)
      keys.fail("head_dim", fmt::format("{}, expected hidden_size / num_attention_heads = {}", head_dim,
                                        config.dim / config.heads));
  try {
    config.validate();
  } catch (const std::invalid_argument& error) {
    throw format_error(fmt::format("kfsdp::io::read_llama_config: {}: {}", where, error.what()));
  }
  return config;
}

llama_config read_llama_config(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  constexpr std::string_view function = "kfsdp::io::read_llama_config";
  std::error_code ignored;
  const fs::path file = fs::is_directory(path, ignored) ? path / "config.json" : path;
  // A directory opens as a stream, then fails inside the read with no path: refused by name first.
  if (const fs::file_status status = fs::status(file, ignored);
      fs::exists(status) && !fs::is_regular_file(status))
    throw std::runtime_error(
        fmt::format("{}: config.json '{}' is {}, expected a regular file (the model's config)", function,
                    file.string(), fs::is_directory(status) ? "a directory" : "not a regular file"));
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw std::runtime_error(
        fmt::format("{}: cannot open config.json '{}': {}", function, file.string(), std::strerror(errno)));
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& error) {
    throw std::runtime_error(
        fmt::format("{}: read of config.json '{}' failed: {}", function, file.string(), error.what()));
  }
  if (in.bad())
    throw std::runtime_error(fmt::format("{}: read of config.json '{}' failed", function, file.string()));
  return parse_llama_config(text, file.string());
}

std::string llama_config_json(const llama_config& config, dtype stored) {
  config.validate();
  const std::string_view torch_dtype = torch_dtype_name(stored);
  // Reals as the shortest text that reads back to the same double ("1e-06", "10000").
  return fmt::format(
      "{{\n"
      "  \"architectures\": [\"LlamaForCausalLM\"],\n"
      "  \"model_type\": \"llama\",\n"
      "  \"attention_bias\": false,\n"
      "  \"attention_dropout\": 0.0,\n"
      "  \"head_dim\": {},\n"
      "  \"hidden_act\": \"silu\",\n"
      "  \"hidden_size\": {},\n"
      "  \"intermediate_size\": {},\n"
      "  \"max_position_embeddings\": {},\n"
      "  \"mlp_bias\": false,\n"
      "  \"num_attention_heads\": {},\n"
      "  \"num_hidden_layers\": {},\n"
      "  \"num_key_value_heads\": {},\n"
      "  \"rms_norm_eps\": {},\n"
      "  \"rope_scaling\": null,\n"
      "  \"rope_theta\": {},\n"
      "  \"tie_word_embeddings\": {},\n"
      "  \"torch_dtype\": \"{}\",\n"
      "  \"vocab_size\": {}\n"
      "}}\n",
      config.head_dim(), config.dim, config.hidden, config.seq, config.heads, config.layers, config.kv_heads,
      config.rms_norm_eps, config.rope_theta, config.tie_weights ? "true" : "false", torch_dtype, config.vocab);
}

}  // namespace kfsdp::io
