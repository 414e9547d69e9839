// Tests for include/kfsdp/io/checkpoint/hf_config.hpp: transformers' config.json (the fixture's, written by
// transformers 5; Llama 3.2's, Qwen2.5's and Mistral's keys as published) read into llama_config,
// kfsdp's config.json read back the same, and every setting kfsdp's Llama cannot compute refused
// with the key named.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>

#include <kfsdp/io/checkpoint/hf_config.hpp>
#include <kfsdp/model/llama.hpp>

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

// Llama 3.2 1B's config.json as published (transformers 4), its sizes scaled down.
const std::string llama32 = config_with(R"("rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0, "tie_word_embeddings": true,
    "max_position_embeddings": 131072, "head_dim": 16, "attention_bias": false, "mlp_bias": false)");

TEST_CASE("the families' configs: llama3 and linear RoPE scaling, head_dim, attention_bias, qwen2, mistral") {
  const llama_config llama3 = kfsdp::io::parse_llama_config(llama32);
  CHECK(llama3.rope == kfsdp::rope_scaling{.type = kfsdp::rope_type::llama3, .factor = 32, .low_freq_factor = 1,
                                           .high_freq_factor = 4, .original_max_position_embeddings = 8192});
  CHECK(llama3.rope_theta == 500000.0);
  CHECK(llama3.tie_weights);
  CHECK(llama3.family == kfsdp::llama_family::llama);
  // transformers 5 writes the same in rope_parameters; transformers 4.3x wrote "type" for "rope_type".
  CHECK(kfsdp::io::parse_llama_config(config_with(R"("rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0,
      "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"})"))
            .rope == llama3.rope);
  // A rope_parameters without a type gives theta alone; the scaling stays as rope_scaling said.
  CHECK(kfsdp::io::parse_llama_config(llama32.substr(0, llama32.size() - 1) + R"(, "rope_parameters": {"rope_theta": 7.0}})")
            .rope == llama3.rope);
  const llama_config linear = kfsdp::io::parse_llama_config(config_with(R"("rope_scaling": {"type": "linear", "factor": 2.0})"));
  CHECK(linear.rope == kfsdp::rope_scaling{.type = kfsdp::rope_type::linear, .factor = 2});
  CHECK(kfsdp::io::parse_llama_config(config_with(R"("rope_parameters": {"rope_type": "default", "rope_theta": 7.0})")).rope ==
        kfsdp::rope_scaling{});

  const llama_config biased = kfsdp::io::parse_llama_config(config_with(R"("attention_bias": true)"));
  CHECK((biased.qkv_bias && biased.o_bias));
  const llama_config wide = kfsdp::io::parse_llama_config(config_with(R"("head_dim": 32)"));
  CHECK(wide.head_dim() == 32);
  CHECK(wide.head_width == 32);

  // Qwen2.5 0.5B's keys as published: biases on q, k and v with no key saying so, the sliding window off.
  const llama_config qwen = kfsdp::io::parse_llama_config(R"({"model_type": "qwen2", "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_window_layers": 21, "sliding_window": 32768, "use_sliding_window": false, "rope_theta": 1000000.0,
      "layer_types": ["full_attention", "full_attention"], "tie_word_embeddings": true})");
  CHECK(qwen.family == kfsdp::llama_family::qwen2);
  CHECK((qwen.qkv_bias && !qwen.o_bias));
  CHECK(qwen.sliding_window == 0);

  const llama_config mistral = kfsdp::io::parse_llama_config(R"({"model_type": "mistral", "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 32, "sliding_window": 4096, "max_position_embeddings": 32768})");
  CHECK(mistral.family == kfsdp::llama_family::mistral);
  CHECK(mistral.head_dim() == 32);
  CHECK(mistral.sliding_window == 4096);
  CHECK_FALSE((mistral.qkv_bias || mistral.o_bias));
  CHECK(kfsdp::io::parse_llama_config(R"({"model_type": "mistral", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 4,
      "num_hidden_layers": 1, "num_attention_heads": 2, "sliding_window": null})").sliding_window == 0);
  CHECK(kfsdp::io::parse_llama_config(R"({"model_type": "mistral", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 4,
      "num_hidden_layers": 1, "num_attention_heads": 2})").sliding_window == 4096);  // absent: MistralConfig's default
}

TEST_CASE("llama_config_json writes the scaling, head_dim, biases and model_type back as read") {
  for (const std::string& json :
       {llama32, config_with(R"("rope_scaling": {"type": "linear", "factor": 2.5}, "attention_bias": true, "head_dim": 32)"),
        std::string(R"({"model_type": "qwen2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 176,
            "num_hidden_layers": 2, "num_attention_heads": 4, "use_sliding_window": false, "sliding_window": 131072})"),
        std::string(R"({"model_type": "mistral", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 176,
            "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8, "sliding_window": 4096})")}) {
    const llama_config c = kfsdp::io::parse_llama_config(json);
    const std::string written = kfsdp::io::llama_config_json(c);
    const llama_config back = kfsdp::io::parse_llama_config(written, "written");
    INFO(written);
    CHECK(back.rope == c.rope);
    CHECK(back.head_dim() == c.head_dim());
    CHECK(back.qkv_bias == c.qkv_bias);
    CHECK(back.o_bias == c.o_bias);
    CHECK(back.family == c.family);
    CHECK(back.sliding_window == c.sliding_window);
  }
  const std::string written = kfsdp::io::llama_config_json(kfsdp::io::parse_llama_config(llama32));
  CHECK(written.find(R"("rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, )"
                     R"("original_max_position_embeddings": 8192, "rope_type": "llama3"})") != std::string::npos);
  const std::string qwen = kfsdp::io::llama_config_json(
      {.vocab = 8, .dim = 8, .hidden = 4, .layers = 1, .heads = 2, .kv_heads = 1, .qkv_bias = true, .family = kfsdp::llama_family::qwen2});
  CHECK(qwen.find(R"("architectures": ["Qwen2ForCausalLM"])") != std::string::npos);
  CHECK(qwen.find(R"("use_sliding_window": false)") != std::string::npos);
  CHECK(qwen.find("attention_bias") == std::string::npos);  // Qwen2's biases are its architecture's, not a key's
  // Biases a family's config cannot say are refused, naming both flags.
  CHECK_THROWS_WITH_AS((void)kfsdp::io::llama_config_json({.vocab = 8, .dim = 8, .hidden = 4, .layers = 1, .heads = 2,
                                                           .kv_heads = 1, .qkv_bias = true}),
                       doctest::Contains("qkv_bias true and o_bias false, expected both equal (attention_bias)"),
                       std::invalid_argument);
}

TEST_CASE("settings kfsdp's Llama cannot compute are refused, naming the key, the value and what was expected") {
  CHECK(refusal(config_with(R"("rope_scaling": null)")) == "(accepted)");
  CHECK(refusal(config_with(R"("rope_scaling": {"type": "dynamic", "factor": 2.0})"))
            .find("(rope_scaling): key 'type': 'dynamic', expected \"default\", \"linear\" or \"llama3\"") != std::string::npos);
  CHECK(refusal(config_with(R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5})"))
            .find("(rope_parameters): key 'rope_type': 'yarn', expected \"default\", \"linear\" or \"llama3\"") != std::string::npos);
  CHECK(refusal(config_with(R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5})"))
            .find("key 'factor': missing, expected a positive number (rope_type 'llama3' reads it)") != std::string::npos);
  CHECK(refusal(config_with(R"("rope_scaling": {"rope_type": "linear", "factor": -2.0})"))
            .find("key 'factor': -2, expected a positive number") != std::string::npos);
  CHECK(refusal(config_with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
      "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})"))
            .find("high_freq_factor is 1.000000, expected a finite number above low_freq_factor") != std::string::npos);
  CHECK(refusal(config_with(R"("partial_rotary_factor": 0.5)"))
            .find("key 'partial_rotary_factor': 0.5, expected 1.0") != std::string::npos);
  CHECK(refusal(config_with(R"("hidden_act": "gelu")")).find("key 'hidden_act': 'gelu', expected \"silu\"") != std::string::npos);
  CHECK(refusal(config_with(R"("mlp_bias": true)")).find("key 'mlp_bias': true, expected false") != std::string::npos);
  CHECK(refusal(R"({"model_type": "gemma"})").find("key 'model_type': 'gemma', expected \"llama\", \"qwen2\" or \"mistral\"") !=
        std::string::npos);
  CHECK(refusal(R"({"model_type": "qwen2", "use_sliding_window": true})")
            .find("key 'use_sliding_window': true, expected false") != std::string::npos);
  CHECK(refusal(config_with(R"("layer_types": ["full_attention", "sliding_attention"])"))
            .find("key 'layer_types': item 1 is 'sliding_attention', expected \"full_attention\"") != std::string::npos);
}

TEST_CASE("a Mistral sliding_window narrower than the window is refused by make_llama, naming it") {
  const llama_config mistral = kfsdp::io::parse_llama_config(R"({"model_type": "mistral", "vocab_size": 256,
      "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "sliding_window": 32,
      "max_position_embeddings": 64})");
  CHECK_THROWS_WITH_AS((void)kfsdp::make_llama(mistral),
                       "kfsdp::make_llama: sliding_window is 32, expected null or at least the window 64 (kfsdp's "
                       "attention sees the whole window)",
                       std::invalid_argument);
  CHECK_NOTHROW((void)kfsdp::make_llama(mistral, 32));  // the mask of a window of 32 slides nothing away
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
                       "' is a directory, expected a regular file");
}
