// Feeds the fuzzer's seed corpus (test/io/corpus/) through parse_header, so that builds without
// libFuzzer run it too: files named valid_* must parse, invalid_* must throw format_error, any
// other file (an input the fuzzer found) must do one or the other.
#include <doctest/doctest.h>
#include <kfsdp/io/checkpoint/safetensors.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#ifndef KFSDP_IO_CORPUS_DIR
#error "KFSDP_IO_CORPUS_DIR: the build passes the corpus folder (test/io/meson.build)"
#endif

TEST_CASE("every corpus file is accepted or rejected as its name says") {
  std::size_t files_seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(KFSDP_IO_CORPUS_DIR)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<char> text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto bytes = std::as_bytes(std::span(text));
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    ++files_seen;
    if (name.starts_with("valid_")) {
      CHECK_NOTHROW((void)kfsdp::io::parse_header(bytes, bytes.size(), name));
    } else if (name.starts_with("invalid_")) {
      CHECK_THROWS_AS((void)kfsdp::io::parse_header(bytes, bytes.size(), name), kfsdp::io::format_error);
    } else {
      try {
        (void)kfsdp::io::parse_header(bytes, bytes.size(), name);
      } catch (const kfsdp::io::format_error&) {
      }
    }
  }
  CHECK(files_seen >= 10);
}
