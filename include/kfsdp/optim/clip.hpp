#pragma once
// kfsdp::optim clip — gradient clipping by the GLOBAL norm over all ranks' shards, without any
// communication here: each rank reduces its own shard, the engine all-reduces (sums) the squared
// norms with its communicator, and every rank applies the same scale.
//
//   double squared = kfsdp::optim::local_squared_norm(shard_grads);        // this rank
//   comm::all_reduce_sum(comm, std::span(&squared, 1));                     // the engine's job
//   double scale = kfsdp::optim::clip_scale(std::sqrt(squared), 1.0);       // same on all ranks
//   kfsdp::optim::scale_in_place(shard_grads, scale);                       // or fold into lr
//
// Padding rows of a shard are zero in the gradients, so they add nothing to the norm.

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kfsdp::optim {

/// Sum of squares of a flat shard, accumulated in double whatever Scalar is (a Kokkos
/// parallel_reduce), so that float gradients lose no precision in the global sum.
///
///   double squared = local_squared_norm(grads);   // grads: Kokkos::View<float*>
template <class Scalar>
[[nodiscard]] double local_squared_norm(const Kokkos::View<const Scalar*>& grads);

template <class Scalar>
[[nodiscard]] double local_squared_norm(const Kokkos::View<Scalar*>& grads) {
  return local_squared_norm<Scalar>(Kokkos::View<const Scalar*>(grads));
}

/// PyTorch's clip_grad_norm_ coefficient: min(1, max_norm / (global_norm + 1e-6)).
/// Throws std::invalid_argument for max_norm < 0 or a global_norm that is negative or not finite
/// (a NaN or Inf gradient somewhere), naming the value seen.
///
///   clip_scale(10.0, 1.0) -> 0.0999999...;   clip_scale(0.5, 1.0) -> 1.0
[[nodiscard]] double clip_scale(double global_norm, double max_norm);

/// values[i] *= factor over a flat shard (one Kokkos kernel); a factor of exactly 1 does nothing.
///
///   scale_in_place(grads, clip_scale(global_norm, max_norm));
template <class Scalar>
void scale_in_place(const Kokkos::View<Scalar*>& values, double factor);

// ---------------------------------------------------------------- definitions

template <class Scalar>
double local_squared_norm(const Kokkos::View<const Scalar*>& grads) {
  // Blocks of 256 elements, each summed in 8 independent lanes: one running sum would chain every
  // addition to the last (a latency-bound pass, 3 % of a GPT step); the lanes vectorise. The order is
  // fixed by the length alone, so every run sums alike.
  //   length 20, lanes 8: one block; lane j adds g(j)² and g(8 + j)², lanes 0-3 add g(16..19)², then the lanes.
  constexpr std::size_t block = 256, lanes = 8;
  const std::size_t length = grads.extent(0);
  double squared = 0.0;
  const auto g = grads;
  Kokkos::parallel_reduce(
      "kfsdp::optim::local_squared_norm", Kokkos::RangePolicy<>(0, (length + block - 1) / block),
      KOKKOS_LAMBDA(const std::size_t b, double& sum) {
        const std::size_t first = b * block, last = first + block < length ? first + block : length;
        double lane[lanes] = {};
        std::size_t i = first;
        for (; i + lanes <= last; i += lanes)
          for (std::size_t j = 0; j < lanes; ++j) {
            const double value = static_cast<double>(g(i + j));
            lane[j] += value * value;
          }
        for (std::size_t j = 0; i < last; ++i, ++j) {
          const double value = static_cast<double>(g(i));
          lane[j] += value * value;
        }
        double block_sum = 0.0;
        for (std::size_t j = 0; j < lanes; ++j) block_sum += lane[j];
        sum += block_sum;
      },
      squared);
  return squared;
}

extern template double local_squared_norm<float>(const Kokkos::View<const float*>&);
extern template double local_squared_norm<double>(const Kokkos::View<const double*>&);
extern template void scale_in_place<float>(const Kokkos::View<float*>&, double);
extern template void scale_in_place<double>(const Kokkos::View<double*>&, double);

}  // namespace kfsdp::optim
