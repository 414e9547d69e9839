// Tests of include/kfsdp/io/data/array_dataset.hpp: the worked example, epochs of a seeded permutation,
// rank slices, rows, statistics and normalisation, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <stdexcept>
#include <utility>
#include <vector>

#include <kfsdp/io/data/array_dataset.hpp>

#include "../support/messages.hpp"

using kfsdp::io::array_dataset;

namespace {
array_dataset example() { return array_dataset({0, 1, 2, 3, 4, 5, 6, 7}, 2, {10, 11, 12, 13}, 1); }

// `count` samples, in 3, out 2: feature c of sample s is 10s + c, target c is −(10s + c).
array_dataset numbered(std::size_t count) {
  std::vector<double> x, y;
  for (std::size_t s = 0; s < count; ++s) {
    for (std::size_t c = 0; c < 3; ++c) x.push_back(10.0 * static_cast<double>(s) + static_cast<double>(c));
    for (std::size_t c = 0; c < 2; ++c) y.push_back(-(10.0 * static_cast<double>(s) + static_cast<double>(c)));
  }
  return array_dataset(std::move(x), 3, std::move(y), 2);
}

// A device matrix back on the host, row-major.
template <class Scalar>
std::vector<double> host(const kfsdp::nn::matrix<Scalar>& m) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  std::vector<double> values;
  for (std::size_t r = 0; r < h.extent(0); ++r)
    for (std::size_t c = 0; c < h.extent(1); ++c) values.push_back(static_cast<double>(h(r, c)));
  return values;
}
}  // namespace

TEST_CASE("the worked example") {
  const array_dataset d = example();
  CHECK(d.count() == 4);
  CHECK(d.in_features() == 2);
  CHECK(d.out_features() == 1);
  CHECK(d.micro_batch(0, 0, 2) == std::vector<std::size_t>{1, 3});
  CHECK(d.micro_batch(0, 1, 2) == std::vector<std::size_t>{2, 0});
  CHECK(d.micro_batch(0, 2, 2) == std::vector<std::size_t>{3, 2});
  const auto [x, y] = d.rank_slice<double>({1, 3}, 1, 2);
  CHECK(x.extent(0) == 1);
  CHECK(host(x) == std::vector<double>{6, 7});
  CHECK(host(y) == std::vector<double>{13});
  const auto [rx, ry] = d.rows<float>(1, 2);
  CHECK(host(rx) == std::vector<double>{2, 3, 4, 5});
  CHECK(host(ry) == std::vector<double>{11, 12});
}

TEST_CASE("micro-batches cover each epoch exactly once, also when a batch straddles two epochs") {
  const array_dataset d = numbered(10);
  for (std::size_t batch : {1, 3, 4, 10, 25}) {
    std::vector<std::size_t> drawn;
    for (std::size_t index = 0; index < 10; ++index) {  // 10 · batch positions: batch whole epochs
      const std::vector<std::size_t> b = d.micro_batch(42, index, batch);
      CHECK(b.size() == batch);
      drawn.insert(drawn.end(), b.begin(), b.end());
    }
    for (std::size_t epoch = 0; epoch < batch; ++epoch) {
      std::vector<std::size_t> e(drawn.begin() + static_cast<std::ptrdiff_t>(epoch * 10),
                                 drawn.begin() + static_cast<std::ptrdiff_t>(epoch * 10 + 10));
      std::sort(e.begin(), e.end());
      for (std::size_t s = 0; s < 10; ++s) CHECK(e[s] == s);
    }
  }
}

TEST_CASE("micro-batches depend only on (seed, index): same seed same, another seed or epoch different") {
  const array_dataset d = numbered(64);
  CHECK(d.micro_batch(7, 5, 16) == d.micro_batch(7, 5, 16));
  CHECK(d.micro_batch(7, 5, 16) == numbered(64).micro_batch(7, 5, 16));  // another rank's copy
  CHECK(d.micro_batch(7, 5, 16) != d.micro_batch(8, 5, 16));
  CHECK(d.micro_batch(7, 0, 64) != d.micro_batch(7, 1, 64));  // epoch 0 and epoch 1 differ
  std::vector<std::size_t> identity(64);
  for (std::size_t s = 0; s < 64; ++s) identity[s] = s;
  CHECK(d.micro_batch(7, 0, 64) != identity);  // actually shuffled
}

TEST_CASE("rank slices of world sizes 1, 2, 3 concatenate to the world-size-1 slice") {
  const array_dataset d = numbered(20);
  const std::vector<std::size_t> batch = d.micro_batch(3, 4, 6);
  const auto [x1, y1] = d.rank_slice<double>(batch, 0, 1);
  CHECK(x1.extent(0) == 6);
  CHECK(x1.extent(1) == 3);
  CHECK(y1.extent(1) == 2);
  for (std::size_t c = 0; c < 3; ++c) CHECK(host(x1)[3 + c] == 10.0 * static_cast<double>(batch[1]) + static_cast<double>(c));
  for (std::size_t ws : {1, 2, 3}) {
    std::vector<double> xs, ys;
    for (std::size_t rank = 0; rank < ws; ++rank) {
      const auto [x, y] = d.rank_slice<double>(batch, rank, ws);
      CHECK(x.extent(0) == 6 / ws);
      const std::vector<double> hx = host(x), hy = host(y);
      xs.insert(xs.end(), hx.begin(), hx.end());
      ys.insert(ys.end(), hy.begin(), hy.end());
    }
    CHECK(xs == host(x1));
    CHECK(ys == host(y1));
  }
  CHECK_THROWS_WITH_AS((void)d.rank_slice<double>(batch, 0, 4),
                       "kfsdp::array_dataset::rank_slice: global_batch 6 does not split evenly over world_size 4, "
                       "expected a multiple of world_size",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)d.rank_slice<double>(batch, 2, 2),
                       "kfsdp::array_dataset::rank_slice: rank is 2, expected less than world_size = 2",
                       std::invalid_argument);
  CHECK_THROWS_AS((void)d.rank_slice<double>({0, 20}, 0, 1), std::out_of_range);
}

TEST_CASE("rows gives samples [first, first + count) in order") {
  const array_dataset d = numbered(5);
  const auto [x, y] = d.rows<double>(3, 2);
  CHECK(host(x) == std::vector<double>{30, 31, 32, 40, 41, 42});
  CHECK(host(y) == std::vector<double>{-30, -31, -40, -41});
  CHECK(d.rows<double>(5, 0).first.extent(0) == 0);
  CHECK_THROWS_WITH_AS((void)d.rows<double>(4, 2),
                       "kfsdp::array_dataset::rows: first + count is 4 + 2, expected at most the 5 samples",
                       std::out_of_range);
}

TEST_CASE("column statistics, and normalising a test set with the training set's") {
  // features (1, 5), (3, 5): means (2, 5), stddevs (1, 0); targets 0, 4: mean 2, stddev 2.
  array_dataset train({1, 5, 3, 5}, 2, {0, 4}, 1);
  const array_dataset::column_stats fs = train.feature_stats(), ts = train.target_stats();
  CHECK(fs.mean == std::vector<double>{2, 5});
  CHECK(fs.stddev == std::vector<double>{1, 0});
  CHECK(ts.mean == std::vector<double>{2});
  CHECK(ts.stddev == std::vector<double>{2});

  array_dataset test({4, 7}, 2, {8}, 1);
  test.normalize(fs, ts);
  const auto [tx, ty] = test.rows<double>(0, 1);
  CHECK(host(tx) == std::vector<double>{2, 2});  // (4 − 2)/1; the constant column only centred: 7 − 5
  CHECK(host(ty) == std::vector<double>{3});     // (8 − 2)/2

  train.normalize(fs, ts);
  CHECK(train.feature_stats().mean == std::vector<double>{0, 0});
  CHECK(train.feature_stats().stddev == std::vector<double>{1, 0});
  CHECK(train.target_stats().stddev == std::vector<double>{1});

  // A larger set: after normalising with its own statistics every column has mean 0, stddev 1.
  array_dataset big = numbered(37);
  big.normalize(big.feature_stats(), big.target_stats());
  for (const auto& s : {big.feature_stats(), big.target_stats()})
    for (std::size_t c = 0; c < s.mean.size(); ++c) {
      CHECK(std::abs(s.mean[c]) < 1e-12);
      CHECK(s.stddev[c] == doctest::Approx(1.0).epsilon(1e-12));
    }

  CHECK_THROWS_WITH_AS(test.normalize(ts, ts),
                       "kfsdp::array_dataset::normalize: features statistics have 1 means and 1 stddevs, "
                       "expected in_features = 2 each",
                       std::invalid_argument);
  CHECK_THROWS_AS(test.normalize({{0, 0}, {1, -1}}, ts), std::invalid_argument);
}

TEST_CASE("normalize() by the set's own statistics, kept as checkpoint metadata and read back") {
  array_dataset train({1, 5, 3, 5}, 2, {0, 4}, 1), test({4, 7}, 2, {8}, 1);
  const array_dataset::normalization stats = train.normalize();
  CHECK(stats.features.mean == std::vector<double>{2, 5});
  CHECK(stats.targets.stddev == std::vector<double>{2});
  test.normalize(stats);
  CHECK(host(test.rows<double>(0, 1).second) == std::vector<double>{3});

  CHECK(stats.features.stddev == std::vector<double>{1, 1});  // as applied: the constant column divided by 1
  CHECK(kfsdp::io::stats_from_metadata(kfsdp::io::stats_metadata(stats), 2, 1).features.stddev == stats.features.stddev);

  const kfsdp::io::metadata_map metadata = kfsdp::io::stats_metadata({{{0.1, 1.0 / 3}, {2, 0.5}}, {{-7.5}, {1e-300}}});
  CHECK(metadata.at("normalization.features.mean") == "0.1,0.3333333333333333");
  CHECK(metadata.at("normalization.targets.stddev") == "1e-300");
  const array_dataset::normalization back = kfsdp::io::stats_from_metadata(metadata);  // every bit back
  CHECK(back.features.mean == std::vector<double>{0.1, 1.0 / 3});
  CHECK(back.features.stddev == std::vector<double>{2, 0.5});
  CHECK(back.targets.mean == std::vector<double>{-7.5});
  CHECK(back.targets.stddev == std::vector<double>{1e-300});

  kfsdp::io::metadata_map broken = metadata;
  broken["normalization.targets.mean"] = "1,x";
  CHECK_THROWS_WITH_AS(kfsdp::io::stats_from_metadata(broken),
                       "kfsdp::io::stats_from_metadata: 'normalization.targets.mean' is '1,x', expected numbers "
                       "separated by commas",
                       std::invalid_argument);
  broken.erase("normalization.features.stddev");
  CHECK_THROWS_WITH_AS(kfsdp::io::stats_from_metadata(broken),
                       "kfsdp::io::stats_from_metadata: no 'normalization.features.stddev', expected it",
                       std::invalid_argument);
}

TEST_CASE("stats_from_metadata refuses statistics that cannot normalise: counts, widths, non-finite, stddev <= 0") {
  const kfsdp::io::metadata_map good = kfsdp::io::stats_metadata({{{0.1, 0.2, 0.3}, {1, 2, 3}}, {{-7.5}, {4}}});
  CHECK(kfsdp::io::stats_from_metadata(good, 3, 1).features.stddev == std::vector<double>{1, 2, 3});
  const auto refused = [&](const std::string& key, const std::string& value, std::optional<std::size_t> in,
                           std::optional<std::size_t> out) {
    kfsdp::io::metadata_map edited = good;
    edited.at(key) = value;
    return kfsdp::test::error_message([&] { (void)kfsdp::io::stats_from_metadata(edited, in, out); });
  };
  const std::string p = "kfsdp::io::stats_from_metadata: ";
  // The means counted, the stddevs not: a predictor read past its buffer.
  CHECK(refused("normalization.features.stddev", "1,2", std::nullopt, std::nullopt) ==
        p + "'normalization.features.stddev' has 2 values, expected 3 as 'normalization.features.mean' has");
  CHECK(refused("normalization.features.stddev", "1,2", 3, 1) ==
        p + "'normalization.features.stddev' has 2 values, expected in_features = 3 (the model's)");
  CHECK(refused("normalization.features.mean", "1,2", 3, 1) ==
        p + "'normalization.features.mean' has 2 values, expected in_features = 3 (the model's)");
  CHECK(refused("normalization.targets.mean", "1,2", 3, 1) ==
        p + "'normalization.targets.mean' has 2 values, expected out_features = 1 (the model's)");
  CHECK(kfsdp::test::error_message([&] { (void)kfsdp::io::stats_from_metadata(good, 6, 1); }) ==
        p + "'normalization.features.mean' has 3 values, expected in_features = 6 (the model's)");
  // Values: finite, stddev > 0.
  CHECK(refused("normalization.features.stddev", "1,nan,3", 3, 1) ==
        p + "'normalization.features.stddev' value 1 is nan, expected a finite number > 0");
  CHECK(refused("normalization.features.stddev", "1,2,0", 3, 1) ==
        p + "'normalization.features.stddev' value 2 is 0, expected a finite number > 0");
  CHECK(refused("normalization.targets.stddev", "-inf", 3, 1) ==
        p + "'normalization.targets.stddev' value 0 is -inf, expected a finite number > 0");
  CHECK(refused("normalization.targets.stddev", "-1", std::nullopt, std::nullopt) ==
        p + "'normalization.targets.stddev' value 0 is -1, expected a finite number > 0");
  CHECK(refused("normalization.features.mean", "0,inf,0", 3, 1) ==
        p + "'normalization.features.mean' value 1 is inf, expected a finite number");
  CHECK(refused("normalization.targets.mean", "nan", std::nullopt, std::nullopt) ==
        p + "'normalization.targets.mean' value 0 is nan, expected a finite number");
}

TEST_CASE("bad sizes are clear errors naming the array") {
  CHECK_THROWS_WITH_AS(array_dataset({1, 2, 3, 4, 5, 6, 7}, 3, {1, 2}, 1),
                       "kfsdp::array_dataset: features has 7 values, expected a multiple of in_features = 3",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(array_dataset({1, 2, 3, 4, 5, 6}, 3, {1, 2, 3}, 1),
                       "kfsdp::array_dataset: targets has 3 values, expected count · out_features = 2 · 1 = 2",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(array_dataset({1, 2}, 0, {1}, 1), "kfsdp::array_dataset: in_features is 0, expected at least 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(array_dataset({1, 2}, 2, {1}, 0), "kfsdp::array_dataset: out_features is 0, expected at least 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(array_dataset({}, 2, {}, 1),
                       "kfsdp::array_dataset: features has 0 values, expected at least one sample",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)example().micro_batch(0, 0, 0),
                       "kfsdp::array_dataset::micro_batch: global_batch is 0, expected at least 1", std::invalid_argument);
}
