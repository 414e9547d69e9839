#pragma once
// What every dataset of samples (rows of features [count, in] and targets [count, out]) shares:
// the shuffled order of micro-batches (io::shuffled_micro_batch, the same at any world size), the
// concept io::dataset that fit and distributed_sampler take (io::array_dataset in memory,
// io::hdf5_dataset read per batch), and io::dataset_ref, a reference to any of them (fit's eval_data).
//
//   io::shuffled_micro_batch(4, /*seed=*/0, /*index=*/1, /*global_batch=*/2)   // {2, 0}
//   static_assert(io::dataset<io::array_dataset>);
//   io::dataset_ref eval = &test;  eval.rows<double>(0, eval.count())
//
// Core header: no MPI.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <kfsdp/nn/views.hpp>

namespace kfsdp::io {

namespace detail {

inline std::uint64_t splitmix64(std::uint64_t z) {  // splitmix64's finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace detail

/// Epoch `epoch`'s order of `count` samples: Fisher–Yates where draw k is splitmix64(key + k·γ),
/// key from (seed, epoch). O(count) time and indices, never the samples themselves.
inline std::vector<std::size_t> epoch_permutation(std::size_t count, std::uint64_t seed, std::size_t epoch) {
  std::vector<std::size_t> order(count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (count < 2) return order;
  const std::uint64_t key = detail::splitmix64(seed ^ detail::splitmix64(static_cast<std::uint64_t>(epoch)));
  std::uint64_t counter = key;
  for (std::size_t i = count - 1; i > 0; --i) {
    counter += 0x9e3779b97f4a7c15ull;
    // Modulo bias is below count / 2⁶⁴: negligible for any dataset.
    const std::size_t j = static_cast<std::size_t>(detail::splitmix64(counter) % (static_cast<std::uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

/// Sample indices of global micro-batch `index` (step · grad_accum + k) of `global_batch` samples
/// out of `count`: positions [index·B, (index+1)·B) of the concatenated epochs, epoch e being
/// epoch_permutation(count, seed, e) — so any micro-batch is drawn without replaying earlier ones,
/// and every rank draws the same. Throws std::invalid_argument for a zero count or global_batch.
inline std::vector<std::size_t> shuffled_micro_batch(std::size_t count, std::uint64_t seed, std::size_t index,
                                                     std::size_t global_batch) {
  if (global_batch == 0)
    throw std::invalid_argument("kfsdp::io::shuffled_micro_batch: global_batch is 0, expected at least 1");
  if (count == 0) throw std::invalid_argument("kfsdp::io::shuffled_micro_batch: count is 0, expected at least 1");
  // The last epoch's order, kept: consecutive micro-batches mostly share an epoch, and shuffling
  // a million samples costs milliseconds a step.
  struct cached_order {
    std::size_t count = 0, epoch = 0;
    std::uint64_t seed = 0;
    std::vector<std::size_t> order;
  };
  thread_local cached_order cache;
  std::vector<std::size_t> samples(global_batch);
  for (std::size_t i = 0; i < global_batch; ++i) {
    const std::size_t position = index * global_batch + i;
    const std::size_t epoch = position / count;
    if (cache.order.empty() || cache.count != count || cache.seed != seed || cache.epoch != epoch)
      cache = {count, epoch, seed, epoch_permutation(count, seed, epoch)};
    samples[i] = cache.order[position % count];
  }
  return samples;
}

/// Rank `rank`'s contiguous share of a micro-batch's samples (global_batch / world_size of them),
/// checked; `who` names the caller in the error.
///   rank_share({7, 2, 5, 0}, 1, 2, "my_dataset::rank_slice") -> {5, 0}
[[nodiscard]] inline std::vector<std::size_t> rank_share(const std::vector<std::size_t>& samples, std::size_t rank,
                                                         std::size_t world_size, std::string_view who) {
  if (world_size == 0 || samples.size() % world_size != 0)
    throw std::invalid_argument(fmt::format(
        "{}: global_batch {} does not split evenly over world_size {}, expected a multiple of world_size", who,
        samples.size(), world_size));
  if (rank >= world_size)
    throw std::invalid_argument(fmt::format("{}: rank is {}, expected less than world_size = {}", who, rank, world_size));
  const std::size_t local = samples.size() / world_size;
  return {samples.begin() + std::ptrdiff_t(rank * local), samples.begin() + std::ptrdiff_t((rank + 1) * local)};
}

/// A dataset fit and distributed_sampler train on: its size and widths, the samples of a
/// micro-batch (shuffled_micro_batch), a rank's contiguous share of them and a range of rows, as
/// device matrices [rows, in] and [rows, out]. rank_slice and rows may be collective (every rank
/// calls them, in the same order: io::hdf5_dataset), which is how fit calls them.
template <class Data>
concept dataset = requires(const Data& data, std::uint64_t seed, std::size_t n,
                           const std::vector<std::size_t>& samples) {
  { data.count() } -> std::convertible_to<std::size_t>;
  { data.in_features() } -> std::convertible_to<std::size_t>;
  { data.out_features() } -> std::convertible_to<std::size_t>;
  { data.micro_batch(seed, n, n) } -> std::same_as<std::vector<std::size_t>>;
  { data.template rank_slice<double>(samples, n, n) } -> std::same_as<std::pair<nn::matrix<double>, nn::matrix<double>>>;
  { data.template rows<double>(n, n) } -> std::same_as<std::pair<nn::matrix<double>, nn::matrix<double>>>;
};

/// A reference to any io::dataset for reading rows (fit_options::eval_data): implicit from a
/// pointer to one, or null. The dataset must outlive it. rows<Scalar> for Scalar other than double
/// reads doubles and converts them, as the datasets themselves do.
class dataset_ref {
 public:
  dataset_ref() = default;
  dataset_ref(std::nullptr_t) {}  // NOLINT: null, as the pointer it replaces
  template <dataset Data>
  dataset_ref(const Data* data)  // NOLINT: implicit, so that `.eval_data = &test` reads as a pointer
  {
    if (data == nullptr) return;
    count_ = data->count();
    in_ = data->in_features();
    out_ = data->out_features();
    rows_ = [data](std::size_t first, std::size_t count) { return data->template rows<double>(first, count); };
  }

  explicit operator bool() const noexcept { return static_cast<bool>(rows_); }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_; }

  template <class Scalar>
  [[nodiscard]] std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> rows(std::size_t first, std::size_t count) const {
    if (!rows_) throw std::invalid_argument("kfsdp::io::dataset_ref::rows: the reference is null, expected a dataset");
    auto read = rows_(first, count);
    if constexpr (std::is_same_v<Scalar, double>) {
      return read;
    } else {
      return {converted<Scalar>(read.first), converted<Scalar>(read.second)};
    }
  }

 private:
  template <class Scalar>
  static nn::matrix<Scalar> converted(const nn::matrix<double>& values) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values);
    nn::matrix<Scalar> result(values.label(), values.extent(0), values.extent(1));
    auto host_result = Kokkos::create_mirror_view(result);
    for (std::size_t r = 0; r < values.extent(0); ++r)
      for (std::size_t c = 0; c < values.extent(1); ++c) host_result(r, c) = static_cast<Scalar>(host(r, c));
    Kokkos::deep_copy(result, host_result);
    return result;
  }

  std::size_t count_ = 0, in_ = 0, out_ = 0;
  std::function<std::pair<nn::matrix<double>, nn::matrix<double>>(std::size_t, std::size_t)> rows_{};
};

}  // namespace kfsdp::io
