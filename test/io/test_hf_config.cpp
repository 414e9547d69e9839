// Tests for include/kfsdp/io/checkpoint/hf_config.hpp: transformers' config.json (the fixture's, written by
// transformers 5) read into llama_config, kfsdp's config.json read back the same, and every setting
// kfsdp's Llama cannot compute refused with the key named.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>

#include <kfsdp/io/checkpoint/hf_config.hpp>

using kfsdp::llama_config;
using kfsdp::io::format_error;

namespace {

const std::string fixture = KFSDP_LLAMA_FIXTURE;

// A valid config.json with `extra` members added before the closing brace.
std::string config_with(const std::string& extra) {
  return R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 176,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

std::string refusal(const std::string& json) {
  try {
    (void)kfsdp::io::parse_llama_config(json, "test/config.json");
  } catch (const format_error& error) {
    return error.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("transformers' config.json reads into llama_config, rope_theta from rope_parameters") {
  const llama_config c = kfsdp::io::read_llama_config(fixture + "/tiny-f32");
  CHECK(c.vocab == 256);
  CHECK(c.dim == 64);
  CHECK(c.hidden == 176);
  CHECK(c.layers == 2);
  CHECK(c.heads == 4);
  CHECK(c.kv_heads == 2);
  CHECK(c.seq == 64);
  CHECK(c.rope_theta == 5000.0);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK_FALSE(c.tie_weights);
  // The file itself names the same config.
  CHECK(kfsdp::io::read_llama_config(fixture + "/tiny-f64-sharded/config.json").rope_theta == 5000.0);
}

TEST_CASE("absent keys take transformers' defaults; a top-level rope_theta is read (transformers 4)") {
  const llama_config c = kfsdp::io::parse_llama_config(config_with(R"("rope_theta": 500000.0, "tie_word_embeddings": true)"));
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.tie_weights);
  CHECK(c.seq == 2048);
  CHECK(c.rms_norm_eps == 1e-6);
  const llama_config mha = kfsdp::io::parse_llama_config(R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2})");
  CHECK(mha.kv_heads == 2);
  CHECK(mha.rope_theta == 10000.0);
}

TEST_CASE("llama_config_json reads back as the same config") {
  const llama_config c{.vocab = 300, .dim = 96, .hidden = 256, .layers = 3, .heads = 6, .kv_heads = 3, .seq = 128,
                       .rope_theta = 123456.5, .rms_norm_eps = 1e-5, .tie_weights = true};
  const std::string json = kfsdp::io::llama_config_json(c, kfsdp::io::dtype::F64);
  CHECK(json.find(R"("torch_dtype": "float64")") != std::string::npos);
  CHECK(json.find(R"("architectures": ["LlamaForCausalLM"])") != std::string::npos);
  const llama_config back = kfsdp::io::parse_llama_config(json);
  CHECK(back.vocab == c.vocab);
  CHECK(back.dim == c.dim);
  CHECK(back.hidden == c.hidden);
  CHECK(back.layers == c.layers);
  CHECK(back.heads == c.heads);
  CHECK(back.kv_heads == c.kv_heads);
  CHECK(back.seq == c.seq);
  CHECK(back.rope_theta == c.rope_theta);
  CHECK(back.rms_norm_eps == c.rms_norm_eps);
  CHECK(back.tie_weights == c.tie_weights);
  CHECK_THROWS_AS((void)kfsdp::io::llama_config_json(c, kfsdp::io::dtype::I32), std::invalid_argument);
}

TEST_CASE("settings kfsdp's Llama cannot compute are refused, naming the key") {
  CHECK(refusal(config_with(R"("rope_scaling": {"type": "linear", "factor": 2.0})")).find("key 'rope_scaling'") != std::string::npos);
  CHECK(refusal(config_with(R"("rope_scaling": null)")) == "(accepted)");
  CHECK(refusal(config_with(R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5})")).find("key 'rope_type'") != std::string::npos);
  CHECK(refusal(config_with(R"("hidden_act": "gelu")")).find("key 'hidden_act': 'gelu', expected \"silu\"") != std::string::npos);
  CHECK(refusal(config_with(R"("attention_bias": true)")).find("key 'attention_bias'") != std::string::npos);
  CHECK(refusal(config_with(R"("mlp_bias": true)")).find("key 'mlp_bias'") != std::string::npos);
  CHECK(refusal(config_with(R"("head_dim": 32)")).find("key 'head_dim': 32, expected hidden_size / num_attention_heads = 16") != std::string::npos);
  CHECK(refusal(R"({"model_type": "mistral"})").find("key 'model_type': 'mistral'") != std::string::npos);
}

TEST_CASE("a missing, mistyped or invalid size is refused, naming the file and the key") {
  const std::string missing = refusal(R"({"model_type": "llama", "hidden_size": 64})");
  CHECK(missing.find("'test/config.json'") != std::string::npos);
  CHECK(missing.find("key 'vocab_size': missing") != std::string::npos);
  CHECK(refusal(config_with(R"("max_position_embeddings": "64")")).find("key 'max_position_embeddings': a string '64', expected a number") != std::string::npos);
  CHECK(refusal(config_with(R"("max_position_embeddings": 6.5)")).find("key 'max_position_embeddings': 6.5, expected a positive integer") != std::string::npos);
  // Sizes llama_config::validate refuses: 4 heads, 3 key/value heads.
  CHECK(refusal(config_with(R"("num_key_value_heads": 3)")).find("duplicate key") != std::string::npos);
  CHECK(refusal(R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 4,
                  "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3})")
            .find("kv_heads is 3, expected a divisor of heads = 4") != std::string::npos);
  CHECK(refusal("{\"model_type\": \"llama\",").find("is not valid JSON") != std::string::npos);
  CHECK(refusal("[1]").find("holds an array, expected a JSON object") != std::string::npos);
  CHECK_THROWS_AS((void)kfsdp::io::read_llama_config(fixture + "/no-such-directory"), std::runtime_error);
}

TEST_CASE("a config.json that is a directory or not JSON is refused as config.json, naming its path") {
  namespace fs = std::filesystem;
  // Not a safetensors header: the message is about config.json, where its text breaks.
  const std::string syntax = refusal("{\"model_type\": \"llama\",");
  CAPTURE(syntax);
  CHECK(syntax.find(
            "kfsdp::io::read_llama_config: config.json 'test/config.json' is not valid JSON: at byte 23: "
            "expected a string, found the end of the text") != std::string::npos);
  CHECK(syntax.find("safetensors") == std::string::npos);
  CHECK(syntax.find("header") == std::string::npos);
  CHECK(refusal("[1]").find("config.json 'test/config.json' holds an array, expected a JSON object") !=
        std::string::npos);

  // A directory where config.json should be: named, not a stream's "basic_filebuf::underflow".
  std::random_device entropy;
  const fs::path model = fs::temp_directory_path() / ("kfsdp-hf-config-test-" + std::to_string(entropy()));
  fs::create_directories(model / "config.json");
  std::string message = "(accepted)";
  try {
    (void)kfsdp::io::read_llama_config(model);
  } catch (const std::runtime_error& error) {
    message = error.what();
  }
  fs::remove_all(model);
  CAPTURE(message);
  CHECK(message == "kfsdp::io::read_llama_config: config.json '" + (model / "config.json").string() +
                       "' is a directory, expected a regular file (the model's config)");
}
