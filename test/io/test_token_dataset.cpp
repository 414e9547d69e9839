// Token shards (include/kfsdp/io/data/token_dataset.hpp): each format parses, a glob is one stream,
// the windows and their order are text_windows', every bad input is refused naming the file, the
// value seen and the value expected, and the byte counter is windows × (seq + 1) × token bytes.
// The shards are written here byte by byte, as llm.c, nanoGPT and numpy write them.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/io/data/token_dataset.hpp>

namespace fs = std::filesystem;
using kfsdp::io::text_windows;
using kfsdp::io::token_format;
using kfsdp::io::token_windows;
using kfsdp::io::window_sampling;

namespace {

// A folder of this test's own, removed at the end.
struct scratch {
  fs::path dir = fs::temp_directory_path() / ("kfsdp_tokens_" + std::to_string(::getpid()));
  scratch() { fs::create_directories(dir); }
  ~scratch() { fs::remove_all(dir); }
  fs::path operator/(const std::string& name) const { return dir / name; }
};

void put(std::string& out, std::uint64_t value, std::size_t width) {  // little-endian
  for (std::size_t i = 0; i < width; ++i) out.push_back(char((value >> (8 * i)) & 0xff));
}

void write(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// llm.c's shard: 256 int32 (magic, version, count, zeros), then the tokens.
std::string llmc(const std::vector<std::uint32_t>& ids, std::int32_t magic = 20240520, std::int32_t version = 1,
                 std::int64_t count = -1) {
  std::string out;
  put(out, std::uint32_t(magic), 4);
  put(out, std::uint32_t(version), 4);
  put(out, std::uint32_t(count < 0 ? std::int64_t(ids.size()) : count), 4);
  out.resize(1024, '\0');
  for (auto id : ids) put(out, id, magic == 20240801 ? 4 : 2);
  return out;
}

// numpy.save's format 1.0 of a 1-D array: magic, version, header length, the dict padded with spaces
// and a newline to a multiple of 64 bytes.
std::string npy(const std::vector<std::uint32_t>& ids, const std::string& descr, const std::string& shape = "") {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" +
                     (shape.empty() ? std::to_string(ids.size()) + "," : shape) + "), }";
  dict.resize((10 + dict.size() + 1 + 63) / 64 * 64 - 10 - 1, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  put(out, dict.size(), 2);
  out += dict;
  for (auto id : ids) put(out, id, std::size_t(descr.back() - '0'));  // "<u2": 2 bytes a value
  return out;
}

std::string raw16(const std::vector<std::uint32_t>& ids) {
  std::string out;
  for (auto id : ids) put(out, id, 2);
  return out;
}

std::vector<std::uint32_t> iota(std::size_t n, std::uint32_t from = 0) {
  std::vector<std::uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), from);
  return ids;
}

std::vector<int> window(const token_windows& data, std::size_t w, bool targets = false) {
  std::vector<int> in, out;
  data.append(w, in, out);
  return targets ? out : in;
}

std::string what(auto&& make) {
  try {
    make();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace

TEST_CASE("llm.c's uint16 shard: windows of seq + 1 tokens from the stream's start") {
  scratch tmp;
  write(tmp / "a.bin", llmc(iota(10, 100)));  // tokens 100 .. 109
  const auto data = token_windows::open((tmp / "a.bin").string(), /*seq=*/2, /*vocab=*/256);
  CHECK(data.count() == 3);  // 100-102, 103-105, 106-108; 109 unused
  CHECK(window(data, 1) == std::vector<int>{103, 104});
  CHECK(window(data, 1, true) == std::vector<int>{104, 105});
  std::vector<int> in, out;
  CHECK_THROWS_AS(data.append(3, in, out), std::out_of_range);
}

TEST_CASE("the header's worked example: 3 tokens 50256 11 198 in 1030 bytes") {
  const std::string shard = llmc({50256, 11, 198});
  CHECK(shard.size() == 1030);
  CHECK(shard.substr(0, 12) == std::string("\x88\xd8\x34\x01\x01\x00\x00\x00\x03\x00\x00\x00", 12));
  CHECK(shard.substr(1024) == std::string("\x50\xc4\x0b\x00\xc6\x00", 6));
  scratch tmp;
  write(tmp / "a.bin", shard);
  CHECK(window(token_windows::open((tmp / "a.bin").string(), 2, 50257), 0) == std::vector<int>{50256, 11});
}

TEST_CASE("llm.c's uint32 variant (magic 20240801, version 7): Llama 3's and Qwen2.5's vocabularies") {
  scratch tmp;
  write(tmp / "a.bin", llmc({128000, 9906, 151935, 0, 70000}, 20240801, 7));
  const auto data = token_windows::open((tmp / "a.bin").string(), 4, 151936);
  CHECK(window(data, 0) == std::vector<int>{128000, 9906, 151935, 0});
  CHECK(window(data, 0, true) == std::vector<int>{9906, 151935, 0, 70000});
}

TEST_CASE("nanoGPT's raw uint16 .bin and numpy's 1-D uint16 and uint32 .npy read alike") {
  scratch tmp;
  const auto ids = iota(50, 60000);
  write(tmp / "raw.bin", raw16(ids));
  write(tmp / "u2.npy", npy(ids, "<u2"));
  write(tmp / "u4.npy", npy(ids, "<u4"));
  write(tmp / "llmc.bin", llmc(ids));
  const auto reference = token_windows::open((tmp / "llmc.bin").string(), 6, 65536);
  for (const char* name : {"raw.bin", "u2.npy", "u4.npy"}) {
    CAPTURE(name);
    const auto data = token_windows::open((tmp / name).string(), 6, 65536);
    REQUIRE(data.count() == 7);
    for (std::size_t w = 0; w < data.count(); ++w) CHECK(window(data, w, true) == window(reference, w, true));
  }
  // A format named outright reads a raw file whose first tokens happen to look like no magic.
  CHECK(token_windows::open((tmp / "raw.bin").string(), 6, 65536, token_format::raw_uint16).count() == 7);
}

TEST_CASE("a glob of shards is one stream, sorted; a window may span two shards") {
  scratch tmp;
  write(tmp / "s_000.bin", llmc(iota(5, 0)));
  write(tmp / "s_001.bin", llmc(iota(4, 5)));
  write(tmp / "s_002.npy", npy(iota(6, 9), "<u4"));  // formats and widths may mix
  write(tmp / "whole.bin", llmc(iota(15, 0)));
  const auto data = token_windows::open((tmp / "s_*").string(), 3, 256);
  const auto whole = token_windows::open((tmp / "whole.bin").string(), 3, 256);
  CHECK(data.shards() == 3);
  CHECK(data.tokens() == 15);
  REQUIRE(data.count() == whole.count());  // 3 windows of 4
  for (std::size_t w = 0; w < data.count(); ++w) {
    CHECK(window(data, w) == window(whole, w));
    CHECK(window(data, w, true) == window(whole, w, true));
  }
  CHECK(window(data, 1) == std::vector<int>{4, 5, 6});  // tokens 4 | 5 6 7: s_000 | s_001
  CHECK(window(data, 2, true) == std::vector<int>{9, 10, 11});  // 8 | 9 10 11: s_001 | s_002
}

TEST_CASE("text as bytes: the same windows and the same batches as text_windows") {
  scratch tmp;
  const std::string text = "In the beginning God created the heaven and the earth.\n";
  write(tmp / "t.txt", text);
  const auto tokens = token_windows::open((tmp / "t.txt").string(), 8, 256);
  const auto bytes = text_windows::from_file(tmp / "t.txt", 8);
  REQUIRE(tokens.count() == bytes.count());
  for (auto sampling : {window_sampling::random, window_sampling::sequential})
    for (std::size_t micro = 0; micro < 4; ++micro) {
      const auto windows = tokens.micro_batch(sampling, 1337, micro, 6);
      CHECK(windows == bytes.micro_batch(sampling, 1337, micro, 6));
      for (std::size_t rank = 0; rank < 3; ++rank) {
        std::vector<int> a, b, c, d;
        tokens.rank_slice(windows, rank, 3, a, b);
        bytes.rank_slice(windows, rank, 3, c, d);
        CHECK(a == c);
        CHECK(b == d);
      }
    }
}

TEST_CASE("the ranks' slices at any world size make up the same global batch") {
  scratch tmp;
  write(tmp / "a.bin", llmc(iota(1000, 0), 20240520, 1));
  const auto data = token_windows::open((tmp / "a.bin").string(), 16, 1000);
  const auto windows = data.micro_batch(window_sampling::random, 7, 3, 6);
  std::vector<int> whole, whole_targets;
  data.rank_slice(windows, 0, 1, whole, whole_targets);
  for (std::size_t ws : {2, 3}) {
    std::vector<int> joined;
    for (std::size_t rank = 0; rank < ws; ++rank) {
      std::vector<int> in, out;
      data.rank_slice(windows, rank, ws, in, out);
      joined.insert(joined.end(), in.begin(), in.end());
    }
    CHECK(joined == whole);
  }
  std::vector<int> in, out;  // a rank outside the world is refused, not read past the batch
  CHECK_THROWS_WITH_AS(data.rank_slice(windows, 3, 3, in, out), "kfsdp: rank is 3, expected less than world_size = 3",
                       std::invalid_argument);
}

TEST_CASE("the byte counter is windows × (seq + 1) × token bytes, per object (per rank)") {
  scratch tmp;
  write(tmp / "u16.bin", llmc(iota(5000, 0)));
  write(tmp / "u32.bin", llmc(iota(5000, 70000), 20240801, 7));
  for (const auto& [name, width] : {std::pair<std::string, std::size_t>{"u16.bin", 2}, {"u32.bin", 4}}) {
    CAPTURE(name);
    const std::size_t seq = 31, batch = 6, ws = 3, steps = 5;
    const auto data = token_windows::open((tmp / name).string(), seq, 80000);
    CHECK(data.bytes_copied() == 0);
    std::vector<int> in, out;
    for (std::size_t step = 0; step < steps; ++step)
      data.rank_slice(data.micro_batch(window_sampling::random, 1, step, batch), /*rank=*/1, ws, in, out);
    CHECK(data.bytes_copied() == steps * (batch / ws) * (seq + 1) * width);
  }
}

TEST_CASE("train and validation: a split holds out the last windows, or separate files") {
  scratch tmp;
  write(tmp / "a.bin", llmc(iota(40, 0)));
  const auto data = token_windows::open((tmp / "a.bin").string(), 3, 256);  // 10 windows
  const auto [train, validation] = data.split(2);
  CHECK(train.count() == 8);
  CHECK(validation.count() == 2);
  CHECK(window(validation, 0) == window(data, 8));
  CHECK(window(train, 7) == window(data, 7));
  CHECK_THROWS_WITH_AS(static_cast<void>(data.split(10)), "kfsdp::token_windows::split: validation is 10 windows of 10, expected 1 to 9",
                       std::invalid_argument);
}

TEST_CASE("a token id at or above the vocabulary is refused, naming the shard, the place, the id and the vocabulary") {
  scratch tmp;
  auto ids = iota(20, 0);
  ids[13] = 300;
  const std::string path = (tmp / "a.bin").string();
  write(path, llmc(ids));
  const auto data = token_windows::open(path, 4, 256);
  CHECK_NOTHROW(window(data, 1));  // tokens 5 .. 9: only the windows copied are read
  CHECK(what([&] { window(data, 2); }) ==
        "kfsdp::token_windows: '" + path + "' holds token id 300 at token 13 (byte offset 1050), expected less than the vocabulary 256");
}

TEST_CASE("bad shards are refused, naming the file, the value seen and the value expected") {
  scratch tmp;
  const auto refused = [&](const std::string& name, const std::string& bytes, std::size_t seq = 2,
                           token_format format = token_format::automatic) {
    write(tmp / name, bytes);
    return what([&] { token_windows::open((tmp / name).string(), seq, 256, format); });
  };
  const auto prefix = [&](const std::string& name) { return "kfsdp::token_windows: '" + (tmp / name).string() + "': "; };
  CHECK(refused("short.bin", llmc({1, 2, 3}).substr(0, 100), 2, token_format::llmc) ==
        prefix("short.bin") + "the llm.c header is cut short: the file holds 100 bytes, expected at least 1024 (256 int32)");
  CHECK(refused("magic.bin", llmc({1, 2, 3}, 1234), 2, token_format::llmc) ==
        prefix("magic.bin") + "the llm.c magic is 1234, expected 20240520 (uint16 tokens) or 20240801 (uint32 tokens)");
  CHECK(refused("version.bin", llmc({1, 2, 3}, 20240520, 7)) ==
        prefix("version.bin") + "the llm.c version is 7 with magic 20240520, expected 1");
  CHECK(refused("count.bin", llmc({1, 2, 3}, 20240520, 1, 5)) ==
        prefix("count.bin") + "the llm.c header's token count is 5, so the file should hold 1024 + 5 · 2 = 1034 bytes; it holds 1030");
  CHECK(refused("cut.bin", llmc({1, 2, 3}).substr(0, 1029)) ==
        prefix("cut.bin") + "the llm.c header's token count is 3, so the file should hold 1024 + 3 · 2 = 1030 bytes; it holds 1029");
  CHECK(refused("empty.bin", llmc({})) == prefix("empty.bin") + "the shard holds no tokens, expected at least 1");
  CHECK(refused("zero.bin", "") == prefix("zero.bin") + "the shard holds no tokens, expected at least 1");
  CHECK(refused("odd.bin", "abc") ==
        prefix("odd.bin") + "the file holds 3 bytes, expected an even number (raw uint16 tokens, nanoGPT's .bin)");
  CHECK(refused("f4.npy", npy({1, 2, 3}, "<f4")) == prefix("f4.npy") + "the .npy dtype is '<f4', expected uint16 ('<u2') or uint32 ('<u4')");
  CHECK(refused("2d.npy", npy({1, 2, 3, 4}, "<u2", "2, 2")) ==
        prefix("2d.npy") + "the .npy array has 2 dimensions, expected 1 (a stream of token ids)");
  CHECK(refused("cut.npy", npy({1, 2, 3}, "<u2").substr(0, 130)).find("needs 6 bytes of data, the file holds 2 (cut short?)") !=
        std::string::npos);  // io's .npy header parser's own words
  CHECK(refused("few.bin", llmc({1, 2, 3, 4}), 4) ==
        "kfsdp::token_windows: '" + (tmp / "few.bin").string() + "' holds 4 tokens, fewer than one window of seq + 1 = 5");
  CHECK(what([&] { token_windows::open((tmp / "none_*.bin").string(), 2, 256); }) ==
        "kfsdp::token_windows: '" + (tmp / "none_*.bin").string() + "' matches no file, expected one or more token shards");
  CHECK(what([&] { token_windows::open((tmp / "few.bin").string(), 0, 256); }) ==
        "kfsdp::token_windows: seq is 0, expected at least 1");
  CHECK(what([&] { token_windows::open((tmp / "few.bin").string(), 2, 0); }) ==
        "kfsdp::token_windows: vocab is 0, expected at least 1");
  CHECK(what([&] { token_windows({tmp.dir}, 2, 256); }) ==
        "kfsdp::token_windows: the data file '" + tmp.dir.string() + "' is not a regular file (a directory?), expected a token shard");
  CHECK(what([&] { token_windows({tmp / "missing.bin"}, 2, 256); })
            .starts_with("kfsdp::token_windows: cannot open the token shard '" + (tmp / "missing.bin").string() + "': "));
}
