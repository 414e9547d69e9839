#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Byte-level text data for the example GPT: the text cut into non-overlapping windows of seq + 1
// bytes from offset 0 (inputs are the first seq bytes, targets the last seq), and which windows a
// step uses — the same on every rank, each rank taking its contiguous slice of the global batch.
//
//   text of 10 bytes "abcdefghij", seq 2 -> windows "abc" "def" "ghi" (3 windows; "j" unused)
//   sequential sampling, batch 2: step 0 -> windows 0, 1; step 1 -> windows 2, 0 (modulo 3)
//   at world size 2, rank 1 of step 0 gets window 1: tokens "de", targets "ef"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace kfsdp::io {

KFSDP_EXPORT enum class window_sampling { sequential, random };

KFSDP_EXPORT inline window_sampling parse_sampling(const std::string& text) {
  if (text == "sequential") return window_sampling::sequential;
  if (text == "random") return window_sampling::random;
  throw std::invalid_argument("kfsdp: sampling '" + text + "' is not one of random, sequential");
}

/// Rank `rank`'s share of a micro-batch's windows: batch / world_size of them, contiguous
/// (text_windows and token_windows slice alike). Throws std::invalid_argument for a world size
/// of 0, a batch it does not divide, or a rank outside it.
inline std::span<const std::size_t> rank_windows(const std::vector<std::size_t>& windows, std::size_t rank,
                                                 std::size_t world_size) {
  if (world_size == 0 || windows.size() % world_size != 0)
    throw std::invalid_argument(fmt::format("kfsdp: the batch of {} windows does not split evenly over {} ranks",
                                            windows.size(), world_size));
  if (rank >= world_size)
    throw std::invalid_argument(fmt::format("kfsdp: rank is {}, expected less than world_size = {}", rank, world_size));
  const std::size_t local = windows.size() / world_size;
  return {windows.data() + rank * local, local};
}

/// The windows (of `count`) of global micro-batch `micro` (step · grad_accum + k) of `batch`
/// windows: the same on every rank, at any world size (text_windows and token_windows draw them so).
inline std::vector<std::size_t> window_micro_batch(std::size_t count, window_sampling sampling, std::uint64_t seed,
                                                    std::size_t micro, std::size_t batch) {
  const auto mix = [](std::uint64_t z) {  // splitmix64's finaliser
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::vector<std::size_t> windows(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    if (sampling == window_sampling::sequential) {
      windows[i] = (micro * batch + i) % count;
    } else {  // counter-based, so a restart at any step draws the same windows
      windows[i] = mix(seed ^ mix(micro * 0x9e3779b97f4a7c15ull + i)) % count;
    }
  }
  return windows;
}

KFSDP_EXPORT class text_windows {
 public:
  text_windows(std::vector<std::uint8_t> bytes, std::size_t seq, std::string origin = "text")
      : bytes_(std::move(bytes)), seq_(seq), origin_(std::move(origin)) {
    if (seq_ == 0) throw std::invalid_argument("kfsdp::text_windows: seq is 0, expected at least 1");
    if (count() == 0)
      throw std::invalid_argument(fmt::format("kfsdp::text_windows: {} has {} bytes, fewer than one window of seq + 1 = {}",
                                              origin_, bytes_.size(), seq_ + 1));
  }

  static text_windows from_file(const std::filesystem::path& path, std::size_t seq) {
    std::error_code error;
    if (std::filesystem::exists(path, error) && !std::filesystem::is_regular_file(path, error))
      throw std::runtime_error(fmt::format("kfsdp: the data file '{}' is not a regular file (a directory?)", path.string()));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(fmt::format("kfsdp: cannot open the data file '{}'", path.string()));
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return text_windows(std::move(bytes), seq, fmt::format("'{}'", path.string()));
  }

  [[nodiscard]] std::size_t count() const noexcept { return bytes_.size() / (seq_ + 1); }
  [[nodiscard]] std::size_t seq() const noexcept { return seq_; }

  // Appends window w's inputs and targets (seq bytes each) to tokens and targets.
  void append(std::size_t w, std::vector<int>& tokens, std::vector<int>& targets) const {
    if (w >= count())
      throw std::out_of_range(fmt::format("kfsdp::text_windows: window {} of {}, expected less than {}", w, origin_, count()));
    const std::uint8_t* first = bytes_.data() + w * (seq_ + 1);
    tokens.insert(tokens.end(), first, first + seq_);
    targets.insert(targets.end(), first + 1, first + seq_ + 1);
  }

  // The windows of global micro-batch `micro` (step · grad_accum + k) of `batch` windows.
  [[nodiscard]] std::vector<std::size_t> micro_batch(window_sampling sampling, std::uint64_t seed,
                                                     std::size_t micro, std::size_t batch) const {
    return window_micro_batch(count(), sampling, seed, micro, batch);
  }

  // Rank `rank`'s slice (batch / world_size windows) of a micro-batch, as tokens and targets.
  void rank_slice(const std::vector<std::size_t>& windows, std::size_t rank, std::size_t world_size,
                  std::vector<int>& tokens, std::vector<int>& targets) const {
    tokens.clear();
    targets.clear();
    for (const std::size_t window : rank_windows(windows, rank, world_size)) append(window, tokens, targets);
  }

 private:
  std::vector<std::uint8_t> bytes_;
  std::size_t seq_;
  std::string origin_;
};

}  // namespace kfsdp::io
