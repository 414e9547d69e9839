// The worked example of text_dataset.hpp, and its errors.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <kfsdp/io/data/text_dataset.hpp>

using kfsdp::io::text_windows;
using kfsdp::io::window_sampling;

namespace {
text_windows abc() {
  const std::string text = "abcdefghij";
  return text_windows(std::vector<std::uint8_t>(text.begin(), text.end()), 2);
}
std::string as_text(const std::vector<int>& ids) { return std::string(ids.begin(), ids.end()); }
}  // namespace

TEST_CASE("non-overlapping windows of seq + 1 bytes from offset 0") {
  const text_windows w = abc();
  CHECK(w.count() == 3);  // "abc" "def" "ghi"; "j" unused
  std::vector<int> tokens, targets;
  w.append(1, tokens, targets);
  CHECK(as_text(tokens) == "de");
  CHECK(as_text(targets) == "ef");
  CHECK_THROWS_AS(w.append(3, tokens, targets), std::out_of_range);
}

TEST_CASE("sequential sampling wraps modulo the window count; ranks take contiguous slices") {
  const text_windows w = abc();
  CHECK(w.micro_batch(window_sampling::sequential, 0, 0, 2) == std::vector<std::size_t>{0, 1});
  CHECK(w.micro_batch(window_sampling::sequential, 0, 1, 2) == std::vector<std::size_t>{2, 0});
  std::vector<int> tokens, targets;
  w.rank_slice({0, 1}, 1, 2, tokens, targets);
  CHECK(as_text(tokens) == "de");
  CHECK_THROWS_WITH_AS(w.rank_slice({0, 1, 2}, 0, 2, tokens, targets),
                       "kfsdp: the batch of 3 windows does not split evenly over 2 ranks", std::invalid_argument);
  // A rank past the world read past the batch, a world of 0 divided by zero: both refused.
  CHECK_THROWS_WITH_AS(w.rank_slice({0, 1}, 2, 2, tokens, targets), "kfsdp: rank is 2, expected less than world_size = 2",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(w.rank_slice({0, 1}, 0, 0, tokens, targets),
                       "kfsdp: the batch of 2 windows does not split evenly over 0 ranks", std::invalid_argument);
}

TEST_CASE("random sampling depends only on (seed, micro-batch): a restart draws the same windows") {
  const text_windows w = abc();
  CHECK(w.micro_batch(window_sampling::random, 7, 5, 4) == w.micro_batch(window_sampling::random, 7, 5, 4));
  for (std::size_t i : w.micro_batch(window_sampling::random, 7, 5, 64)) CHECK(i < w.count());
  CHECK(w.micro_batch(window_sampling::random, 7, 5, 64) != w.micro_batch(window_sampling::random, 8, 5, 64));
}

TEST_CASE("too little text or a bad name is a clear error") {
  CHECK_THROWS_WITH_AS(text_windows(std::vector<std::uint8_t>(2), 2),
                       "kfsdp::text_windows: text has 2 bytes, fewer than one window of seq + 1 = 3",
                       std::invalid_argument);
  CHECK_THROWS_AS(text_windows::from_file("no/such/file.txt", 4), std::runtime_error);
  CHECK_THROWS_WITH_AS(kfsdp::io::parse_sampling("shuffled"), "kfsdp: sampling 'shuffled' is not one of random, sequential",
                       std::invalid_argument);
}
