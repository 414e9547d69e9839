#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::evaluate — the metrics of a sharded model over a whole dataset, for a training loop of
// one's own (kfsdp::fit calls it at each evaluation): every rank computes on its contiguous share
// of the samples, and the sums go over the trainer's ranks (its engine's shard group and, under
// HSDP, the replicas), so every rank gets the same numbers. Collective over the trainer's ranks.
//
//   for (std::size_t step = 0; step < steps; ++step) {
//     trainer.step({{x, y}}, adam);
//     if (step % 100 == 0) {
//       const kfsdp::eval_metrics m = kfsdp::evaluate(trainer, test, {{.name = "max_abs_error",
//           .per_sample = [](auto p, auto t) { return std::abs(p[0] - t[0]); }}});
//       if (trainer.engine().rank() == 0) fmt::print("relative L2 {:.3g}\n", m.relative_l2);
//     }
//   }
//
// Metrics, over every sample of the dataset: loss, mse and relative L2 error
// (||prediction - target|| / ||target||) for a model ending in mse; loss, accuracy and perplexity
// (exp(loss)) for one ending in cross_entropy (the target column holds class ids); and each
// fit_metric, the mean over samples of a function of one prediction and its target.
// Core header: no MPI (the trainer's communicator carries the sums).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <Kokkos_Core.hpp>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/io/data/dataset.hpp>
#include <kfsdp/nn/views.hpp>

namespace kfsdp {

/// A user metric: the mean over evaluation samples of per_sample(prediction row, target row).
///
///   kfsdp::fit_metric{.name = "max_abs_error", .per_sample = [](auto p, auto t) { return std::abs(p[0] -
///   t[0]); }}
struct fit_metric {
  std::string name{};  // its JSON key and label: snake_case
  std::function<double(std::span<const double> prediction, std::span<const double> target)> per_sample{};
};

/// Evaluation metrics; those that do not apply to the model's loss are NaN.
struct eval_metrics {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double mse = std::numeric_limits<double>::quiet_NaN();          // mse models
  double relative_l2 = std::numeric_limits<double>::quiet_NaN();  // mse models
  double accuracy = std::numeric_limits<double>::quiet_NaN();     // cross_entropy models
  double perplexity = std::numeric_limits<double>::quiet_NaN();   // cross_entropy models
  std::vector<std::pair<std::string, double>> user{};             // fit_metric's, in order
};

namespace detail {

// Every rank of a trainer: its engine's shard group and, under HSDP, the replicas of each shard.
// rank() is replica · shard-group size + shard rank: the world rank where the session formed the
// groups of consecutive ranks. A communicator for agreement (comm::any_rank) and small host sums.
class trainer_ranks {
 public:
  template <class Engine>
  explicit trainer_ranks(Engine& engine)
      : shards_(engine.communicator()), replicas_(engine.options().replica_group) {}

  [[nodiscard]] int rank() const { return replicas_ ? replicas_->rank() * shards_.size() + shards_.rank() : shards_.rank(); }
  [[nodiscard]] int size() const { return replicas_ ? replicas_->size() * shards_.size() : shards_.size(); }

  // Sums over every rank, in place.
  void all_reduce_sum(std::span<double> values) {
    shards_.iall_reduce_sum(values).wait();
    if (replicas_) replicas_->iall_reduce_sum(values).wait();
  }
  // Rank 0's values on every rank: to each shard group's first rank over the replicas, then within the groups.
  void broadcast_from_first(std::span<double> values) {
    if (replicas_) replicas_->ibroadcast(values, 0).wait();
    shards_.ibroadcast(values, 0).wait();
  }
  // The primitive comm::any_rank and check_agreement build on (comm::has_range_over_ranks).
  [[nodiscard]] comm::value_range range_over_ranks(std::uint64_t value) {
    const comm::value_range group = shards_.range_over_ranks(value);
    if (!replicas_) return group;
    return {replicas_->range_over_ranks(group.lowest).lowest, replicas_->range_over_ranks(group.highest).highest};
  }

 private:
  comm::any_communicator shards_;
  std::optional<comm::any_communicator> replicas_;
};

template <class Trainer>
inline constexpr bool classifies = std::is_same_v<typename Trainer::target_type, nn::const_index_vector>;

// The trainer's targets from a dataset's target matrix: the matrix, or its first column as class ids.
template <class Trainer, class Scalar>
typename Trainer::target_type targets_of(const nn::matrix<Scalar>& y) {
  if constexpr (classifies<Trainer>) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    nn::index_vector ids(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::fit::class_ids"),
                         y.extent(0));
    const auto host_ids = Kokkos::create_mirror_view(ids);
    for (std::size_t r = 0; r < y.extent(0); ++r)
      host_ids(r) = static_cast<int>(std::lround(double(host(r, 0))));
    Kokkos::deep_copy(ids, host_ids);
    return ids;
  } else {
    return y;
  }
}

// Every metric over every sample of `data`, each rank computing on its contiguous share; `what`
// names the data in errors ("fit: eval_data").
template <class Trainer>
eval_metrics evaluate(Trainer& trainer, const io::dataset_ref& data, const std::vector<fit_metric>& user,
                      std::string_view what) {
  using Scalar = typename Trainer::scalar_type;
  if (!data) throw std::invalid_argument(fmt::format("{} is null, expected a dataset", what));
  for (const fit_metric& metric : user)
    if (metric.name.empty() || !metric.per_sample)
      throw std::invalid_argument(
          fmt::format("{}: a metric named '{}' has {}, expected a name and a per_sample function", what,
                      metric.name, metric.per_sample ? "a function" : "no function"));
  trainer_ranks world(trainer.engine());
  const std::size_t samples = data.count(), ranks = std::size_t(world.size()),
                    rank = std::size_t(world.rank());
  if (samples < ranks)
    throw std::invalid_argument(fmt::format(
        "{} has {} samples, expected at least one per rank ({} ranks)", what, samples, ranks));
  const std::size_t first = samples * rank / ranks, last = samples * (rank + 1) / ranks;
  auto [x, y] = data.template rows<Scalar>(first, last - first);
  const typename Trainer::batch batch{x, targets_of<Trainer>(y)};
  eval_metrics result;
  result.loss = trainer.evaluate({batch});
  const auto predictions = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), trainer.predict(x));
  const auto targets = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  // [squared error, squared target, correct, elements, samples, user metrics...]
  std::vector<double> sums(5 + user.size(), 0.0);
  std::vector<double> prediction_row(predictions.extent(1)), target_row(targets.extent(1));
  for (std::size_t r = 0; r < predictions.extent(0); ++r) {
    for (std::size_t c = 0; c < prediction_row.size(); ++c) prediction_row[c] = double(predictions(r, c));
    for (std::size_t c = 0; c < target_row.size(); ++c) target_row[c] = double(targets(r, c));
    if constexpr (classifies<Trainer>) {
      const auto best =
          std::max_element(prediction_row.begin(), prediction_row.end()) - prediction_row.begin();
      sums[2] += best == std::lround(target_row[0]) ? 1.0 : 0.0;
    } else {
      for (std::size_t c = 0; c < target_row.size(); ++c) {
        const double error = prediction_row[c] - target_row[c];
        sums[0] += error * error;
        sums[1] += target_row[c] * target_row[c];
      }
      sums[3] += double(target_row.size());
    }
    sums[4] += 1.0;
    for (std::size_t m = 0; m < user.size(); ++m)
      sums[5 + m] += user[m].per_sample(prediction_row, target_row);
  }
  world.all_reduce_sum(std::span<double>(sums));
  if constexpr (classifies<Trainer>) {
    result.accuracy = sums[2] / sums[4];
    result.perplexity = std::exp(result.loss);
  } else {
    result.mse = sums[0] / sums[3];
    result.relative_l2 = std::sqrt(sums[0] / sums[1]);
  }
  for (std::size_t m = 0; m < user.size(); ++m) result.user.emplace_back(user[m].name, sums[5 + m] / sums[4]);
  return result;
}

}  // namespace detail

/// The metrics of `trainer`'s model over every sample of `data` (any io::dataset: an array_dataset,
/// an hdf5_dataset), with `metrics` besides the built-in ones; the same result on every rank.
/// Collective over the trainer's ranks: every rank calls it with the same data. Throws
/// std::invalid_argument for fewer samples than ranks, or a metric without a name or function.
KFSDP_EXPORT template <class Trainer, io::dataset Data>
[[nodiscard]] eval_metrics evaluate(Trainer& trainer, const Data& data, const std::vector<fit_metric>& metrics = {}) {
  return detail::evaluate(trainer, io::dataset_ref(&data), metrics, "kfsdp::evaluate: data");
}

}  // namespace kfsdp
