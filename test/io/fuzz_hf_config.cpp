// libFuzzer target for kfsdp::io::parse_llama_config, config.json's text (clang builds):
//   CXX=clang++-19 meson setup build-fuzz -Dbenches=false && ninja -C build-fuzz test/io/fuzz_hf_config
//   mkdir -p fuzz-work && build-fuzz/test/io/fuzz_hf_config fuzz-work test/io/corpus_hf_config -dict=test/io/hf_config.dict
// Any input may be refused with format_error; anything else (a crash, a sanitizer report, another
// exception, an accepted config that llama_config_json does not write back as the same config) is a bug.
#include <kfsdp/io/checkpoint/hf_config.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kfsdp::llama_config config;
  try {
    config = kfsdp::io::parse_llama_config(text, "fuzz/config.json");
  } catch (const kfsdp::io::format_error&) {
    return 0;
  }
  const kfsdp::llama_config again = kfsdp::io::parse_llama_config(kfsdp::io::llama_config_json(config), "rewrite");
  if (again.vocab != config.vocab || again.dim != config.dim || again.hidden != config.hidden ||
      again.layers != config.layers || again.heads != config.heads || again.kv_heads != config.kv_heads ||
      again.seq != config.seq || again.rope_theta != config.rope_theta || again.rms_norm_eps != config.rms_norm_eps ||
      again.tie_weights != config.tie_weights || again.rope != config.rope || again.head_dim() != config.head_dim() ||
      again.qkv_bias != config.qkv_bias || again.o_bias != config.o_bias || again.family != config.family ||
      again.sliding_window != config.sliding_window)
    __builtin_trap();
  return 0;
}
