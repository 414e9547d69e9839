#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Array data for regression examples (an MLP surrogate): samples are rows of two row-major host
// arrays, features [count, in] and targets [count, out]; which samples a step uses is the same on
// every rank, each rank taking its contiguous slice of the global batch as device matrices.
//
//   4 samples, in 2, out 1: features {0,1, 2,3, 4,5, 6,7}, targets {10, 11, 12, 13}
//   micro_batch(0, index, 2) takes positions [2·index, 2·index + 2) of the epochs, each a
//     permutation of 0..3 fixed by (seed, epoch): seed 0 has epochs {1, 3, 2, 0} {3, 2, 1, 0} ...
//     so index 0 -> {1, 3}, index 1 -> {2, 0}, index 2 -> {3, 2}
//   rank_slice<double>({1, 3}, 1, 2) -> features [[6, 7]], targets [[13]] (rank 1 of 2: sample 3)
//   rows<float>(1, 2)                -> features [[2, 3], [4, 5]], targets [[11], [12]]
//   normalize(feature_stats(), target_stats()) -> every column has mean 0 and stddev 1

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kfsdp/io/data/dataset.hpp>
#include <kfsdp/io/checkpoint/safetensors.hpp>  // metadata_map
#include <kfsdp/nn/views.hpp>

namespace kfsdp::io {

KFSDP_EXPORT class array_dataset {
 public:
  // Throws naming the array whose size is not count · width, or a zero width or zero count.
  array_dataset(std::vector<double> features, std::size_t in_features, std::vector<double> targets,
                std::size_t out_features)
      : features_(std::move(features)), targets_(std::move(targets)), in_(in_features), out_(out_features) {
    if (in_ == 0) throw std::invalid_argument("kfsdp::array_dataset: in_features is 0, expected at least 1");
    if (out_ == 0) throw std::invalid_argument("kfsdp::array_dataset: out_features is 0, expected at least 1");
    if (features_.size() % in_ != 0)
      throw std::invalid_argument(fmt::format(
          "kfsdp::array_dataset: features has {} values, expected a multiple of in_features = {}", features_.size(), in_));
    count_ = features_.size() / in_;
    if (count_ == 0)
      throw std::invalid_argument("kfsdp::array_dataset: features has 0 values, expected at least one sample");
    if (targets_.size() != count_ * out_)
      throw std::invalid_argument(
          fmt::format("kfsdp::array_dataset: targets has {} values, expected count · out_features = {} · {} = {}",
                      targets_.size(), count_, out_, count_ * out_));
  }

  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_; }

  // Sample indices of global micro-batch `index` (step · grad_accum + k) of `global_batch` samples:
  // io::shuffled_micro_batch over this set's samples (dataset.hpp), the same on every rank.
  [[nodiscard]] std::vector<std::size_t> micro_batch(std::uint64_t seed, std::size_t index,
                                                     std::size_t global_batch) const {
    if (global_batch == 0)
      throw std::invalid_argument("kfsdp::array_dataset::micro_batch: global_batch is 0, expected at least 1");
    return shuffled_micro_batch(count_, seed, index, global_batch);
  }

  // Rank `rank`'s contiguous slice (global_batch / world_size samples) of a micro-batch, as device
  // matrices [local, in] and [local, out].
  template <class Scalar>
  [[nodiscard]] std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> rank_slice(const std::vector<std::size_t>& samples,
                                                                             std::size_t rank,
                                                                             std::size_t world_size) const {
    const auto mine = rank_share(samples, rank, world_size, "kfsdp::array_dataset::rank_slice");
    return gather<Scalar>(mine.size(), [&](std::size_t r) { return mine[r]; });
  }

  // All samples [first, first + count) in order (evaluation), as device matrices.
  template <class Scalar>
  [[nodiscard]] std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> rows(std::size_t first, std::size_t count) const {
    if (first > count_ || count > count_ - first)
      throw std::out_of_range(fmt::format(
          "kfsdp::array_dataset::rows: first + count is {} + {}, expected at most the {} samples", first, count, count_));
    return gather<Scalar>(count, [first](std::size_t r) { return first + r; });
  }

  // Per-column mean and standard deviation (population, 1/count) for normalising.
  struct column_stats {
    std::vector<double> mean, stddev;
  };
  [[nodiscard]] column_stats feature_stats() const { return stats(features_, in_); }
  [[nodiscard]] column_stats target_stats() const { return stats(targets_, out_); }

  // value -> (value − mean) / stddev in place, with given statistics (a test set takes the
  // training set's); a zero stddev (a constant column) only centres, so it stays finite.
  void normalize(const column_stats& features, const column_stats& targets) {
    check_stats("features", features, in_, "in_features");
    check_stats("targets", targets, out_, "out_features");
    apply(features_, in_, features);
    apply(targets_, out_, targets);
  }

  // Both columns' statistics, what a normalisation undoes (and a checkpoint keeps: stats_metadata).
  struct normalization {
    column_stats features{}, targets{};
  };
  // Normalises by this set's own statistics and returns them as applied, for a test set to take
  // (and a checkpoint to keep):
  //   const auto stats = train.normalize();  test.normalize(stats);
  normalization normalize() {
    normalization stats = as_applied({feature_stats(), target_stats()});
    normalize(stats);
    return stats;
  }
  // The statistics as normalize applies them: a zero stddev (a constant column, only centred) as 1,
  // so that what a checkpoint keeps divides by what training divided by (and passes
  // stats_from_metadata's stddev > 0).
  [[nodiscard]] static normalization as_applied(normalization stats) {
    for (auto* s : {&stats.features, &stats.targets})
      for (double& v : s->stddev)
        if (v == 0.0) v = 1.0;
    return stats;
  }
  void normalize(const normalization& stats) { normalize(stats.features, stats.targets); }

 private:
  // Device matrices of `rows` samples, row r being sample sample_of(r), filled on the host.
  template <class Scalar, class SampleOf>
  [[nodiscard]] std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> gather(std::size_t rows, SampleOf sample_of) const {
    nn::matrix<Scalar> x("array_dataset::features", rows, in_), y("array_dataset::targets", rows, out_);
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t s = sample_of(r);
      if (s >= count_)
        throw std::out_of_range(fmt::format("kfsdp::array_dataset: sample {}, expected less than the {} samples", s, count_));
      for (std::size_t c = 0; c < in_; ++c) hx(r, c) = static_cast<Scalar>(features_[s * in_ + c]);
      for (std::size_t c = 0; c < out_; ++c) hy(r, c) = static_cast<Scalar>(targets_[s * out_ + c]);
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
    return {x, y};
  }

  [[nodiscard]] column_stats stats(const std::vector<double>& values, std::size_t width) const {
    column_stats s{std::vector<double>(width, 0.0), std::vector<double>(width, 0.0)};
    for (std::size_t k = 0; k < values.size(); ++k) s.mean[k % width] += values[k];
    for (double& m : s.mean) m /= static_cast<double>(count_);
    for (std::size_t k = 0; k < values.size(); ++k) {  // two passes: no cancellation for large means
      const double d = values[k] - s.mean[k % width];
      s.stddev[k % width] += d * d;
    }
    for (double& v : s.stddev) v = std::sqrt(v / static_cast<double>(count_));
    return s;
  }

  static void check_stats(const char* name, const column_stats& s, std::size_t width, const char* width_name) {
    if (s.mean.size() != width || s.stddev.size() != width)
      throw std::invalid_argument(fmt::format(
          "kfsdp::array_dataset::normalize: {} statistics have {} means and {} stddevs, expected {} = {} each", name,
          s.mean.size(), s.stddev.size(), width_name, width));
    for (std::size_t c = 0; c < width; ++c)
      if (!(s.stddev[c] >= 0.0) || !std::isfinite(s.stddev[c]) || !std::isfinite(s.mean[c]))
        throw std::invalid_argument(fmt::format(
            "kfsdp::array_dataset::normalize: {} column {} has mean {} and stddev {}, expected finite and stddev >= 0",
            name, c, s.mean[c], s.stddev[c]));
  }

  static void apply(std::vector<double>& values, std::size_t width, const column_stats& s) {
    for (std::size_t k = 0; k < values.size(); ++k) {
      const std::size_t c = k % width;
      values[k] = (values[k] - s.mean[c]) / (s.stddev[c] > 0.0 ? s.stddev[c] : 1.0);
    }
  }

  std::vector<double> features_, targets_;
  std::size_t in_, out_, count_ = 0;
};

static_assert(dataset<array_dataset>);

/// Normalisation statistics as checkpoint metadata (kept with the weights, for inference later):
/// "normalization.features.mean", ".features.stddev", ".targets.mean", ".targets.stddev", the values
/// comma-separated, each in shortest round-trip form.
///
///   kfsdp::io::stats_metadata(train.normalize())
///   // {"normalization.features.mean": "0.5,0.5,...", ..., "normalization.targets.stddev": "0.042"}
KFSDP_EXPORT inline metadata_map stats_metadata(const array_dataset::normalization& stats) {
  metadata_map metadata;
  for (const auto& [name, columns] : {std::pair<std::string_view, const array_dataset::column_stats&>{"features", stats.features},
                                      {"targets", stats.targets}}) {
    metadata[fmt::format("normalization.{}.mean", name)] = fmt::format("{}", fmt::join(columns.mean, ","));
    metadata[fmt::format("normalization.{}.stddev", name)] = fmt::format("{}", fmt::join(columns.stddev, ","));
  }
  return metadata;
}

/// The statistics that stats_metadata wrote (a checkpoint's metadata, say), checked: the one place
/// where saved statistics enter (the predictor, the C API's kfsdp_load, the examples' --eval). Throws
/// std::invalid_argument naming the key, what it holds and what was expected when a key is missing
/// or not a list of numbers; when a mean and its stddev differ in count, or (given) differ from the
/// model's width (in_features for the features, out_features for the targets); when a value is not
/// finite, or a stddev not > 0 (normalising would divide by it: NaN, infinite or constant results).
///
///   const auto stats = kfsdp::io::stats_from_metadata(result.metadata, 6, 1);
///   // 'normalization.features.stddev' has 2 values, expected in_features = 6 (the model's)
KFSDP_EXPORT inline array_dataset::normalization stats_from_metadata(const metadata_map& metadata,
                                                                     std::optional<std::size_t> in_features,
                                                                     std::optional<std::size_t> out_features) {
  const auto numbers = [&](const std::string& key) {
    const auto found = metadata.find(key);
    if (found == metadata.end())
      throw std::invalid_argument(fmt::format("kfsdp::io::stats_from_metadata: no '{}', expected it", key));
    std::vector<double> values;
    const std::string& text = found->second;
    for (std::size_t begin = 0; begin <= text.size();) {
      const std::size_t end = std::min(text.find(',', begin), text.size());
      double value = 0;
      const auto [stop, error] = std::from_chars(text.data() + begin, text.data() + end, value);
      if (error != std::errc() || stop != text.data() + end)
        throw std::invalid_argument(fmt::format(
            "kfsdp::io::stats_from_metadata: '{}' is '{}', expected numbers separated by commas", key, text));
      values.push_back(value);
      begin = end + 1;
    }
    return values;
  };
  const auto column = [&](std::string_view name, std::optional<std::size_t> width, std::string_view width_name) {
    const std::string mean_key = fmt::format("normalization.{}.mean", name),
                      stddev_key = fmt::format("normalization.{}.stddev", name);
    array_dataset::column_stats s{numbers(mean_key), numbers(stddev_key)};
    for (const auto& [key, values] : {std::pair<const std::string&, const std::vector<double>&>{mean_key, s.mean},
                                      {stddev_key, s.stddev}})
      if (width && values.size() != *width)
        throw std::invalid_argument(fmt::format("kfsdp::io::stats_from_metadata: '{}' has {} values, expected {} = {} "
                                                "(the model's)",
                                                key, values.size(), width_name, *width));
    if (s.stddev.size() != s.mean.size())
      throw std::invalid_argument(fmt::format("kfsdp::io::stats_from_metadata: '{}' has {} values, expected {} as '{}' has",
                                              stddev_key, s.stddev.size(), s.mean.size(), mean_key));
    for (std::size_t c = 0; c < s.mean.size(); ++c) {
      if (!std::isfinite(s.mean[c]))
        throw std::invalid_argument(fmt::format("kfsdp::io::stats_from_metadata: '{}' value {} is {}, expected a finite "
                                                "number", mean_key, c, s.mean[c]));
      if (!(std::isfinite(s.stddev[c]) && s.stddev[c] > 0.0))
        throw std::invalid_argument(fmt::format("kfsdp::io::stats_from_metadata: '{}' value {} is {}, expected a finite "
                                                "number > 0", stddev_key, c, s.stddev[c]));
    }
    return s;
  };
  return {column("features", in_features, "in_features"), column("targets", out_features, "out_features")};
}
/// The same checks but the widths' (where the model is not known yet).
KFSDP_EXPORT inline array_dataset::normalization stats_from_metadata(const metadata_map& metadata) {
  return stats_from_metadata(metadata, std::nullopt, std::nullopt);
}

}  // namespace kfsdp::io
