#pragma once
// kfsdp::detail::vector_for(name, n, f): f(i) for every i in [0, n), the loop of an element or row
// kernel. On the host, with GCC on x86-64, the loop is a function compiled three times (AVX-512,
// AVX2 + FMA, the x86-64 baseline) of which the CPU's widest is picked when the program loads
// (target_clones), so that a library built for any x86-64 runs its exp, erf and row sweeps as wide
// as the machine allows: GELU's forward went from 2.6 to 0.41 ns an element on an AVX-512 core.
// f is inlined into each copy (kernels' helpers are force-inlined). Elsewhere (a GPU, clang, another
// CPU) it is Kokkos::parallel_for. Every index is computed alike whatever the split: the same bits
// for any thread count, though the copies for different CPUs may round differently (FMA).
//
//   vector_for("kfsdp::nn::add", n, KOKKOS_LAMBDA(std::int64_t i) { out[i] = a[i] + b[i]; });

#include <Kokkos_Core.hpp>

#include <kfsdp/detail/between_kernels.hpp>

#include <cstdint>
#include <type_traits>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__) && \
    !defined(KFSDP_NO_TARGET_CLONES)
#define KFSDP_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KFSDP_TARGET_CLONES
#endif

namespace kfsdp::detail {

template <class ExecutionSpace>
inline constexpr bool is_serial_v =
#ifdef KOKKOS_ENABLE_SERIAL
    std::is_same_v<ExecutionSpace, Kokkos::Serial>;
#else
    false;
#endif

template <class F>
KFSDP_TARGET_CLONES void vector_loop(std::int64_t begin, std::int64_t end, const F& f) {
  const F body = f;  // a local copy: stores through the kernel's pointers cannot alias what it captured
  for (std::int64_t i = begin; i < end; ++i) body(i);
}

template <class ExecutionSpace = Kokkos::DefaultExecutionSpace, class F>
void vector_for(const char* name, std::int64_t n, const F& f) {
  between_kernels();
  if constexpr (!std::is_same_v<ExecutionSpace, Kokkos::DefaultHostExecutionSpace>) {
    Kokkos::parallel_for(name, Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n), f);
  } else if constexpr (is_serial_v<ExecutionSpace>) {  // one thread: no launch at all
    (void)name;
    vector_loop(0, n, f);
  } else {  // host threads: chunks of the range, each a vector loop
    constexpr std::int64_t chunk = 2048;
    Kokkos::parallel_for(name, Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, (n + chunk - 1) / chunk),
                         [=](std::int64_t c) { vector_loop(c * chunk, c * chunk + chunk < n ? c * chunk + chunk : n, f); });
  }
}

// Sums over a row's columns run in `lanes` interleaved partial sums, column k into lane k mod lanes
// (the tail into lane 0), added in lane order at the end: the loop vectorises, no add waits for the
// one before, and the order is fixed (the same bits on every backend).
inline constexpr int lanes = 8;

// Σ_{k < n} value(k).
template <class S, class Value>
KOKKOS_FORCEINLINE_FUNCTION S lane_sum(int n, const Value& value) {
  S acc[lanes] = {};
  int k = 0;
  for (; k + lanes <= n; k += lanes)
    for (int l = 0; l < lanes; ++l) acc[l] += value(k + l);
  for (; k < n; ++k) acc[0] += value(k);
  S total = 0;
  for (int l = 0; l < lanes; ++l) total += acc[l];
  return total;
}

}  // namespace kfsdp::detail
