#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io::distributed_sampler — which samples of a dataset each step trains on, the
// same global sequence at any world size: step s takes positions [s·B, (s+1)·B) of the
// concatenated epochs (each epoch a shuffle fixed by (seed, epoch): io::shuffled_micro_batch),
// and rank r of N its contiguous B/N of them. So the loss of every step is the same at 1, 2 or 3
// ranks, and resuming needs only the next step, which is the sampler's checkpoint state. Any
// io::dataset: an array_dataset in memory, an hdf5_dataset read per batch (io/data/hdf5.hpp).
//
//   kfsdp::io::distributed_sampler sampler(data, /*global_batch=*/256, /*seed=*/1);
//   auto [x, y] = sampler.next<double>(data, world.rank(), world.size());   // step 0, this rank's rows
//   sampler.epoch()                                                          // 256 / data.count()
//
// Core header: no MPI.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/io/data/dataset.hpp>
#include <kfsdp/tensor/stateful.hpp>

namespace kfsdp::io {

KFSDP_EXPORT class distributed_sampler {
 public:
  /// Throws std::invalid_argument for a zero global_batch.
  template <dataset Data>
  distributed_sampler(const Data& data, std::size_t global_batch, std::uint64_t seed)
      : samples_(data.count()), global_batch_(global_batch), seed_(seed) {
    if (global_batch == 0)
      throw std::invalid_argument("kfsdp::io::distributed_sampler: global_batch is 0, expected at least 1");
  }

  /// This rank's rows of the next step's global batch, then the step advances. `ranks` must divide
  /// the global batch (the dataset's rank_slice says so otherwise); collective where rank_slice is.
  template <class Scalar, dataset Data>
  [[nodiscard]] std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> next(const Data& data,
                                                                       std::size_t rank, std::size_t ranks) {
    if (data.count() != samples_)
      throw std::invalid_argument(
          fmt::format("kfsdp::io::distributed_sampler::next: data has {} samples, expected the sampler's {}",
                      data.count(), samples_));
    auto slice = data.template rank_slice<Scalar>(data.micro_batch(seed_, step_, global_batch_), rank, ranks);
    ++step_;
    return slice;
  }

  /// The step whose batch next() returns.
  [[nodiscard]] std::size_t step() const noexcept { return step_; }
  /// Passes over the data so far (fractional): step · global_batch / samples.
  [[nodiscard]] double epoch() const noexcept {
    return double(step_) * double(global_batch_) / double(samples_);
  }
  [[nodiscard]] std::size_t global_batch() const noexcept { return global_batch_; }
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  /// Steps that make `epochs` passes over the data (the last batch may reach into the next pass).
  [[nodiscard]] std::size_t steps_for_epochs(std::size_t epochs) const noexcept {
    return (epochs * samples_ + global_batch_ - 1) / global_batch_;
  }

  /// The checkpoint protocol: the next step, and what fixes the sequence (seed, global batch, the
  /// data's size), which a resumed run must share: another value is refused, naming the key.
  template <class Scalar>
  void add_state(checkpoint_state<Scalar>& state) const {
    state.metadata["sampler.step"] = std::to_string(step_);
    state.metadata["sampler.seed"] = std::to_string(seed_);
    state.metadata["sampler.global_batch"] = std::to_string(global_batch_);
    state.metadata["sampler.samples"] = std::to_string(samples_);
  }
  void restore_state(const metadata_map& metadata) {
    check_metadata(metadata, "sampler.seed", std::to_string(seed_));
    check_metadata(metadata, "sampler.global_batch", std::to_string(global_batch_));
    check_metadata(metadata, "sampler.samples", std::to_string(samples_));
    step_ = static_cast<std::size_t>(metadata_count(metadata, "sampler.step"));
  }

 private:
  std::size_t samples_;
  std::size_t global_batch_;
  std::uint64_t seed_;
  std::size_t step_ = 0;
};

static_assert(stateful<distributed_sampler, double>);

}  // namespace kfsdp::io
