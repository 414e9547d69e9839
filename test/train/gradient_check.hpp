// The trainer's gradients against central differences of its loss, at world size 1 (double).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include <Kokkos_Core.hpp>

#include <kfsdp/optim/sgd.hpp>

namespace kfsdp::testing {

// Checks `samples` elements spread over every parameter: d(loss)/d(p_i) from one step against
// (loss(p_i + h) − loss(p_i − h)) / 2h, each within 1e-6 of the gradient's scale.
template <class Trainer, class Batch>
void check_gradients(Trainer& t, const Batch& batch, std::size_t samples = 40, double h = 1e-5) {
  optim::sgd<double> frozen(t.engine().plan().shard_numel, {.lr = 0.0});  // gradients only
  t.step({batch}, frozen);
  const auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.engine().grads().flat());
  auto shards = t.engine().shards().flat();
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), shards);
  double scale = 0;
  for (std::size_t i = 0; i < grads.extent(0); ++i) scale = std::max(scale, std::abs(grads(i)));
  REQUIRE(scale > 0);
  const std::size_t n = host.extent(0), stride = std::max<std::size_t>(1, n / samples);
  for (std::size_t i = stride / 2; i < n; i += stride) {
    const double original = host(i);
    auto loss_at = [&](double value) {
      host(i) = value;
      Kokkos::deep_copy(shards, host);
      return t.forward_loss(batch);
    };
    const double numeric = (loss_at(original + h) - loss_at(original - h)) / (2 * h);
    loss_at(original);
    CAPTURE(i);
    CHECK(std::abs(numeric - grads(i)) <= 1e-6 * scale);
  }
}

}  // namespace kfsdp::testing
