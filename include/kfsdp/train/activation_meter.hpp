#pragma once
// activation_meter — the bytes of activation memory alive now and at the peak, measured by
// Kokkos' allocation hooks: every Kokkos allocation labelled "kfsdp::nn::..." (the layers'
// outputs, caches and gradients) counts from its allocation to its deallocation.
//
//   kfsdp::activation_meter::install();   // once, after Kokkos::initialize (the trainer does it)
//   kfsdp::activation_meter::reset_peak();
//   ... forward, backward ...
//   std::size_t peak = kfsdp::activation_meter::peak();

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kfsdp {

class activation_meter {
 public:
  static void install() {
    if (installed().exchange(true)) return;
    Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_deallocate);
  }
  // Allocations made before install() are not counted (nor their deallocations, below zero).
  [[nodiscard]] static std::size_t live() noexcept { return std::size_t(std::max<std::int64_t>(0, live_bytes().load())); }
  [[nodiscard]] static std::size_t peak() noexcept { return std::size_t(std::max<std::int64_t>(0, peak_bytes().load())); }
  static void reset_peak() noexcept { peak_bytes().store(live_bytes().load()); }

 private:
  static bool counted(const char* label) { return label != nullptr && std::strncmp(label, "kfsdp::nn::", 11) == 0; }
  static void on_allocate(Kokkos::Profiling::SpaceHandle, const char* label, const void*, std::uint64_t size) {
    if (!counted(label)) return;
    const std::int64_t now = live_bytes().fetch_add(std::int64_t(size)) + std::int64_t(size);
    std::int64_t peak = peak_bytes().load();
    while (now > peak && !peak_bytes().compare_exchange_weak(peak, now)) {
    }
  }
  static void on_deallocate(Kokkos::Profiling::SpaceHandle, const char* label, const void*, std::uint64_t size) {
    if (counted(label)) live_bytes().fetch_sub(std::int64_t(size));
  }
  static std::atomic<bool>& installed() {
    static std::atomic<bool> flag{false};
    return flag;
  }
  static std::atomic<std::int64_t>& live_bytes() {
    static std::atomic<std::int64_t> bytes{0};
    return bytes;
  }
  static std::atomic<std::int64_t>& peak_bytes() {
    static std::atomic<std::int64_t> bytes{0};
    return bytes;
  }
};

}  // namespace kfsdp
