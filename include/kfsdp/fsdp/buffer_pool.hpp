#pragma once
// buffer_pool<Scalar> — the unsharded buffers of an FSDP rank (gathered and unpacked parameters,
// full, packed and reduced gradients): allocation, reuse and the byte counts memory() reports.
//
// A freed buffer waits for the next request of the same size: a fresh allocation of a large buffer
// costs page faults on the host and a device malloc on GPUs, every step. The buffers kept and those
// in use never exceed together the most ever in use at once (the oldest kept go first), so the pool
// costs no memory beyond the step's own peak, and a step in steady state allocates nothing: ZeRO2
// keeps every bucket's buffers, ZeRO3 about a unit's.
//
//   kfsdp::buffer_pool<float> pool;
//   auto g = pool.acquire("kfsdp::gathered", n);       // not zero-filled: the all-gather writes it all
//   ...
//   pool.release(g);                                   // g is empty; its memory waits for reuse

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>
#include <Kokkos_Core.hpp>

namespace kfsdp {

template <class Scalar>
class buffer_pool {
 public:
  using view = Kokkos::View<Scalar*>;
  // Buffers that are wholly overwritten skip the zero fill; accumulated ones start at zero.
  enum class fill { zeros, none };

  [[nodiscard]] view acquire(const std::string& label, std::size_t numel, fill how = fill::none) {
    view v;
    const auto same_size = std::find_if(spare_.begin(), spare_.end(), [&](const view& s) { return s.extent(0) == numel; });
    if (same_size != spare_.end()) {
      v = *same_size;
      spare_.erase(same_size);
      cached_bytes_ -= bytes(v);
      if (how == fill::zeros) Kokkos::deep_copy(v, Scalar(0));
    } else {
      v = how == fill::zeros ? view(label, numel) : view(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), numel);
    }
    live_bytes_ += bytes(v);
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
    most_live_bytes_ = std::max(most_live_bytes_, live_bytes_);
    while (!spare_.empty() && live_bytes_ + cached_bytes_ > most_live_bytes_) {  // a fresh one came: drop the oldest kept
      cached_bytes_ -= bytes(spare_.front());
      spare_.erase(spare_.begin());
    }
    return v;
  }

  // Gives `v` back (it is empty afterwards). Its memory is reused only when no subview of it is
  // still alive elsewhere; otherwise it is freed with the last of them.
  void release(view& v) {
    if (v.data() == nullptr) return;
    live_bytes_ -= bytes(v);
    if (v.use_count() == 1) {
      spare_.push_back(v);
      cached_bytes_ += bytes(v);
    }
    v = view();
  }

  [[nodiscard]] std::size_t live_bytes() const noexcept { return live_bytes_; }      // acquired, not released
  [[nodiscard]] std::size_t peak_bytes() const noexcept { return peak_bytes_; }      // most live at once
  [[nodiscard]] std::size_t cached_bytes() const noexcept { return cached_bytes_; }  // waiting for reuse
  void reset_peak() noexcept { peak_bytes_ = live_bytes_; }

 private:
  static std::size_t bytes(const view& v) noexcept { return v.extent(0) * sizeof(Scalar); }

  std::vector<view> spare_;
  std::size_t live_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t most_live_bytes_ = 0;  // peak_bytes_ since the start (reset_peak leaves it)
  std::size_t cached_bytes_ = 0;
};

}  // namespace kfsdp
