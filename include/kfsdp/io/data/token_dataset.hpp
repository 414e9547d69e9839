#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Token-id corpora for language models: shards of token ids, memory-mapped read-only and never
// read whole, cut into the same windows as text_windows (non-overlapping seq + 1 tokens from the
// stream's start; inputs the first seq, targets the last seq) and drawn in the same order
// (window_micro_batch), so every world size trains on the same global batches. A glob of shards
// is one stream: a window may span two shards. Each rank copies out only its own windows.
//
// The shard formats (token_format::automatic tells them apart: .npy by name, llm.c by its magic,
// text by its name, anything else raw uint16):
//   llm.c      256 little-endian int32 (1024 bytes): magic, version, token count, 0 ... | tokens
//              magic 20240520 version 1: uint16 tokens (GPT-2's format in llm.c's data_common.py)
//              magic 20240801 version 7: uint32 tokens (its "llama-3" format, for vocabularies > 65,536)
//              e.g. 3 tokens 50256 11 198: 88 d8 34 01 | 01 00 00 00 | 03 00 00 00 | 1012 zero bytes |
//                   50 c4 0b 00 c6 00   (1030 bytes)
//   raw uint16 nanoGPT's train.bin: little-endian uint16 tokens, no header
//   .npy       a 1-D array of uint16 or uint32 (numpy.save), read with io's one .npy header parser
//   text       .txt: each byte a token (vocabulary 256), as text_windows reads it
//
// Token ids are checked against the model's vocabulary as they are copied (the corpus is never
// read whole); an id at or above it is refused naming the shard, the token's place and the value.
//
//   auto train = io::token_windows::open("fineweb_train_*.bin", /*seq=*/1024, /*vocab=*/50257);
//   std::vector<int> tokens, targets;
//   train.rank_slice(train.micro_batch(io::window_sampling::random, seed, step, 16), rank, world_size, tokens, targets);
//   train.bytes_copied()   // this rank's windows × (seq + 1) × 2 bytes so far
//
// Core header: no MPI (POSIX open / mmap / glob).

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <kfsdp/io/data/numpy.hpp>  // parse_npy_header: the one .npy header parser
#include <kfsdp/io/data/text_dataset.hpp>  // window_sampling, window_micro_batch, rank_windows

namespace kfsdp::io {

KFSDP_EXPORT enum class token_format { automatic, llmc, raw_uint16, npy, text };

/// llm.c's shard header: 256 int32, these magics and versions (dev/data/data_common.py).
inline constexpr std::int32_t llmc_magic_uint16 = 20240520, llmc_version_uint16 = 1;
inline constexpr std::int32_t llmc_magic_uint32 = 20240801, llmc_version_uint32 = 7;
inline constexpr std::size_t llmc_header_bytes = 256 * 4;

namespace detail {

// A whole file mapped read-only; pages are read from disk only where a window touches them.
class mapped_file {
 public:
  explicit mapped_file(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw std::runtime_error(fmt::format("kfsdp::token_windows: cannot open the token shard '{}': {}", path, std::strerror(errno)));
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd);
      throw std::invalid_argument(
          fmt::format("kfsdp::token_windows: the data file '{}' is not a regular file (a directory?), expected a token shard", path));
    }
    size_ = std::size_t(info.st_size);
    if (size_ > 0) {
      void* at = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (at == MAP_FAILED) {
        const int error = errno;
        ::close(fd);
        throw std::runtime_error(fmt::format("kfsdp::token_windows: cannot map the token shard '{}' ({} bytes): {}", path,
                                             size_, std::strerror(error)));
      }
      data_ = static_cast<const unsigned char*>(at);
    }
    ::close(fd);  // the mapping keeps the file
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  [[nodiscard]] std::span<const unsigned char> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

// One shard of the stream: its tokens inside the mapping and where they start in the stream.
struct token_shard {
  std::shared_ptr<const mapped_file> file;
  std::size_t data_offset = 0;  // bytes before the first token (the header)
  std::size_t width = 2;        // bytes per token: 1 (text), 2 or 4
  std::size_t count = 0;        // tokens
  std::size_t first = 0;        // the stream position of its first token
};

[[noreturn]] inline void token_refuse(const std::string& file, std::string_view what) {
  throw std::invalid_argument(fmt::format("kfsdp::token_windows: '{}': {}", file, what));
}

inline std::int64_t little_int32(const unsigned char* p) {
  return std::int32_t(std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24);
}

// Where the tokens of one mapped shard lie, after checking its header against its size.
inline token_shard describe_shard(std::shared_ptr<const mapped_file> file, token_format format) {
  const std::string& path = file->path();
  const auto bytes = file->bytes();
  if (format == token_format::automatic) {
    const std::string ext = std::filesystem::path(path).extension().string();
    const std::int64_t magic = bytes.size() >= 4 ? little_int32(bytes.data()) : 0;
    format = ext == ".npy" ? token_format::npy
             : (magic == llmc_magic_uint16 || magic == llmc_magic_uint32) ? token_format::llmc
             : ext == ".txt" ? token_format::text
                             : token_format::raw_uint16;
  }
  token_shard shard{.file = file};
  switch (format) {
    case token_format::llmc: {
      if (bytes.size() < llmc_header_bytes)
        token_refuse(path, fmt::format("the llm.c header is cut short: the file holds {} bytes, expected at least {} (256 int32)",
                                       bytes.size(), llmc_header_bytes));
      const std::int64_t magic = little_int32(bytes.data()), version = little_int32(bytes.data() + 4),
                         count = little_int32(bytes.data() + 8);
      if (magic == llmc_magic_uint16 && version == llmc_version_uint16) shard.width = 2;
      else if (magic == llmc_magic_uint32 && version == llmc_version_uint32) shard.width = 4;
      else if (magic == llmc_magic_uint16 || magic == llmc_magic_uint32)
        token_refuse(path, fmt::format("the llm.c version is {} with magic {}, expected {}", version, magic,
                                       magic == llmc_magic_uint16 ? llmc_version_uint16 : llmc_version_uint32));
      else
        token_refuse(path, fmt::format("the llm.c magic is {}, expected {} (uint16 tokens) or {} (uint32 tokens)", magic,
                                       llmc_magic_uint16, llmc_magic_uint32));
      if (count < 0) token_refuse(path, fmt::format("the llm.c header's token count is {}, expected at least 1", count));
      shard.data_offset = llmc_header_bytes;
      shard.count = std::size_t(count);
      const std::size_t expected = llmc_header_bytes + shard.count * shard.width;
      if (bytes.size() != expected)
        token_refuse(path, fmt::format("the llm.c header's token count is {}, so the file should hold {} + {} · {} = {} bytes; "
                                       "it holds {}", count, llmc_header_bytes, count, shard.width, expected, bytes.size()));
      break;
    }
    case token_format::npy: {
      const npy_header header = detail::parse_npy_header(bytes, path);
      if (header.shape.size() != 1)
        token_refuse(path, fmt::format("the .npy array has {} dimensions, expected 1 (a stream of token ids)", header.shape.size()));
      if (header.kind != 'u' || (header.bytes != 2 && header.bytes != 4) || header.big_endian)
        token_refuse(path, fmt::format("the .npy dtype is '{}', expected uint16 ('<u2') or uint32 ('<u4')", header.dtype));
      shard.data_offset = header.data_offset;
      shard.width = header.bytes;
      shard.count = header.count;
      break;
    }
    case token_format::raw_uint16:
      if (bytes.size() % 2 != 0)
        token_refuse(path, fmt::format("the file holds {} bytes, expected an even number (raw uint16 tokens, nanoGPT's .bin)",
                                       bytes.size()));
      shard.count = bytes.size() / 2;
      break;
    case token_format::text:
      shard.width = 1;
      shard.count = bytes.size();
      break;
    case token_format::automatic:
      break;
  }
  if (shard.count == 0) token_refuse(path, "the shard holds no tokens, expected at least 1");
  return shard;
}

}  // namespace detail

/// Windows of seq + 1 tokens over one or more token shards read as one stream (see above).
KFSDP_EXPORT class token_windows {
 public:
  /// The shards in this order, as one stream. Throws std::invalid_argument naming the shard for
  /// a header that does not fit its file, and for fewer tokens than one window.
  token_windows(const std::vector<std::filesystem::path>& shards, std::size_t seq, std::size_t vocab,
                token_format format = token_format::automatic)
      : seq_(seq), vocab_(vocab) {
    if (seq_ == 0) throw std::invalid_argument("kfsdp::token_windows: seq is 0, expected at least 1");
    if (vocab_ == 0) throw std::invalid_argument("kfsdp::token_windows: vocab is 0, expected at least 1");
    if (shards.empty()) throw std::invalid_argument("kfsdp::token_windows: no shards given, expected at least one file");
    auto stream = std::make_shared<std::vector<detail::token_shard>>();
    std::size_t total = 0;
    for (const auto& path : shards) {
      stream->push_back(detail::describe_shard(std::make_shared<const detail::mapped_file>(path.string()), format));
      stream->back().first = total;
      total += stream->back().count;
    }
    shards_ = std::move(stream);
    count_ = total / (seq_ + 1);
    if (count_ == 0)
      throw std::invalid_argument(fmt::format("kfsdp::token_windows: {} hold{} {} tokens, fewer than one window of seq + 1 = {}",
                                              origin(), shards.size() == 1 ? "s" : "", total, seq_ + 1));
  }

  /// The shards a glob pattern names, sorted ("data/fineweb_train_*.bin"); a plain path is one shard.
  static token_windows open(const std::string& pattern, std::size_t seq, std::size_t vocab,
                            token_format format = token_format::automatic) {
    return token_windows(expand(pattern), seq, vocab, format);
  }

  /// The files a glob pattern matches, sorted. Throws std::invalid_argument when it matches none.
  static std::vector<std::filesystem::path> expand(const std::string& pattern) {
    glob_t found{};
    const int status = ::glob(pattern.c_str(), 0, nullptr, &found);
    std::vector<std::filesystem::path> paths(found.gl_pathv, found.gl_pathv + (status == 0 ? found.gl_pathc : 0));
    ::globfree(&found);
    if (paths.empty())
      throw std::invalid_argument(fmt::format("kfsdp::token_windows: '{}' matches no file, expected one or more token shards", pattern));
    std::sort(paths.begin(), paths.end());
    return paths;
  }

  /// The first windows for training and the last `validation` for validation, over the same mappings.
  [[nodiscard]] std::pair<token_windows, token_windows> split(std::size_t validation) const {
    if (validation == 0 || validation >= count_)
      throw std::invalid_argument(fmt::format("kfsdp::token_windows::split: validation is {} windows of {}, expected 1 to {}",
                                              validation, count_, count_ - 1));
    token_windows train = *this, held_out = *this;
    train.count_ = count_ - validation;
    held_out.first_window_ = first_window_ + train.count_;
    held_out.count_ = validation;
    train.bytes_copied_ = held_out.bytes_copied_ = 0;
    return {std::move(train), std::move(held_out)};
  }

  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t seq() const noexcept { return seq_; }
  [[nodiscard]] std::size_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] std::size_t shards() const noexcept { return shards_->size(); }
  /// The tokens of the whole stream (all shards, windows of a split or not).
  [[nodiscard]] std::size_t tokens() const noexcept { return shards_->back().first + shards_->back().count; }
  /// Whether every shard is text read as bytes (token_format::text): ids are the bytes themselves.
  [[nodiscard]] bool tokens_are_bytes() const noexcept {
    return std::all_of(shards_->begin(), shards_->end(), [](const detail::token_shard& s) { return s.width == 1; });
  }
  /// The bytes this object has copied out of the mappings: windows × (seq + 1) × token bytes.
  [[nodiscard]] std::uint64_t bytes_copied() const noexcept { return bytes_copied_; }

  /// Appends window w's inputs and targets (seq tokens each) to tokens and targets.
  void append(std::size_t w, std::vector<int>& tokens, std::vector<int>& targets) const {
    if (w >= count_)
      throw std::out_of_range(fmt::format("kfsdp::token_windows: window {} of {}, expected less than {}", w, origin(), count_));
    const std::size_t begin = (first_window_ + w) * (seq_ + 1), end = begin + seq_ + 1;
    // The first shard holding `begin`: the last whose first token is at or before it.
    auto shard = std::upper_bound(shards_->begin(), shards_->end(), begin,
                                  [](std::size_t at, const detail::token_shard& s) { return at < s.first; }) - 1;
    tokens.reserve(tokens.size() + seq_);
    targets.reserve(targets.size() + seq_);
    for (std::size_t at = begin; at < end; ++shard) {
      const std::size_t stop = std::min(end, shard->first + shard->count);
      const unsigned char* bytes = shard->file->bytes().data() + shard->data_offset;
      bytes_copied_ += (stop - at) * shard->width;
      for (; at < stop; ++at) {
        const std::size_t index = at - shard->first;
        const std::uint32_t id = read_token(bytes + index * shard->width, shard->width);
        if (id >= vocab_)
          throw std::invalid_argument(fmt::format(
              "kfsdp::token_windows: '{}' holds token id {} at token {} (byte offset {}), expected less than the vocabulary {}",
              shard->file->path(), id, index, shard->data_offset + index * shard->width, vocab_));
        if (at + 1 < end) tokens.push_back(int(id));
        if (at > begin) targets.push_back(int(id));
      }
    }
  }

  /// The windows of global micro-batch `micro` (step · grad_accum + k) of `batch` windows.
  [[nodiscard]] std::vector<std::size_t> micro_batch(window_sampling sampling, std::uint64_t seed, std::size_t micro,
                                                     std::size_t batch) const {
    return window_micro_batch(count_, sampling, seed, micro, batch);
  }

  /// Rank `rank`'s slice (batch / world_size windows) of a micro-batch, as tokens and targets.
  void rank_slice(const std::vector<std::size_t>& windows, std::size_t rank, std::size_t world_size,
                  std::vector<int>& tokens, std::vector<int>& targets) const {
    tokens.clear();
    targets.clear();
    for (const std::size_t window : rank_windows(windows, rank, world_size)) append(window, tokens, targets);
  }

 private:
  static std::uint32_t read_token(const unsigned char* p, std::size_t width) {  // little-endian, any host
    std::uint32_t id = 0;
    for (std::size_t i = 0; i < width; ++i) id |= std::uint32_t(p[i]) << (8 * i);
    return id;
  }
  [[nodiscard]] std::string origin() const {
    return shards_->size() == 1 ? fmt::format("'{}'", shards_->front().file->path())
                                : fmt::format("{} shards ('{}' ...)", shards_->size(), shards_->front().file->path());
  }

  std::shared_ptr<const std::vector<detail::token_shard>> shards_;
  std::size_t seq_ = 0, vocab_ = 0, first_window_ = 0, count_ = 0;
  mutable std::uint64_t bytes_copied_ = 0;
};

}  // namespace kfsdp::io
