#pragma once
// What the benchmarks hold a GPT step against: the FLOPs the step is credited with, and the
// single-core sgemm rate measured in the same run (OPENBLAS_NUM_THREADS=1).
//
// Credited FLOPs of one training step (forward + backward) over `tokens` tokens in windows of seq:
//   linear layers: 6 · M · tokens, M = the matrix parameters that multiply activations: per block
//     c_attn 3d², attn c_proj d², mlp c_fc 4d², mlp c_proj 4d² (12d²), and lm_head d · vocab
//     (counted whether or not it is tied to wte); biases, norms, embeddings and softmax not counted;
//   attention: per block and window, Q·Kᵀ and P·V as the full T×T products its GEMMs compute,
//     2·T²·d each forward and twice that backward: 12 · T² · d per block and window.
// Worked example, train_gpt --layers 4 --dim 128 --heads 4 --seq 64 --batch 8 (512 tokens):
//   M = 4 · 12 · 128² + 128 · 256 = 819,200, so 6 · M · 512 = 2.516 GFLOP;
//   attention 12 · 64² · 128 · 4 layers · 8 windows = 0.201 GFLOP; the step 2.718 GFLOP.

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <Kokkos_Core.hpp>

#include <kfsdp/model/gpt.hpp>
#include <kfsdp/nn/linear.hpp>

namespace kfsdp::bench {

// The BLAS of this build (-Dblas, set by bench/meson.build) and the library whose sgemm_ the process
// calls, e.g. "openblas (sgemm_ from /lib/x86_64-linux-gnu/libopenblas.so.0)".
inline std::string blas_in_use() {
#ifdef KFSDP_BENCH_BLAS
  const std::string configured = KFSDP_BENCH_BLAS;
#else
  const std::string configured = "unknown";
#endif
  Dl_info info{};
  void* const sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  const std::string library = sgemm != nullptr && dladdr(sgemm, &info) != 0 && info.dli_fname != nullptr
                                  ? std::string(info.dli_fname)
                                  : std::string("no sgemm_ found");
  return fmt::format("{} (sgemm_ from {})", configured, library);
}

// Median wall time of `timed` over repeats (at least 1), after one warm-up run; fences each.
inline double median_seconds(std::size_t repeats, const std::function<void()>& timed) {
  timed();
  Kokkos::fence();
  std::vector<double> seconds(std::max<std::size_t>(repeats, 1));
  for (double& s : seconds) {
    const auto start = std::chrono::steady_clock::now();
    timed();
    Kokkos::fence();
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const auto middle = seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2);
  std::nth_element(seconds.begin(), middle, seconds.end());
  return *middle;
}

// The step's credited FLOPs (header); tokens a multiple of config.seq.
inline double gpt_step_flops(const gpt_config& config, std::size_t tokens) {
  const double d = double(config.dim), t = double(config.seq);
  const double matrix_params = double(config.layers) * 12 * d * d + d * double(config.vocab);
  const double windows = double(tokens) / t;
  return 6 * matrix_params * double(tokens) + 12 * t * t * d * double(config.layers) * windows;
}

// FLOP/s of one sgemm, rows×dim · dim×(3·dim) (c_attn's product at `rows` tokens), median of
// repeats: a bias-free linear layer's forward, i.e. one KokkosBlas::gemm after its shape checks.
inline double sgemm_rate(std::size_t rows, std::size_t dim, std::size_t repeats) {
  const nn::linear<float> product{dim, 3 * dim, /*has_bias=*/false};
  const nn::matrix<float> a("a", rows, dim), b("b", 3 * dim, dim), c("c", rows, 3 * dim);
  const std::size_t a_size = rows * dim, b_size = 3 * dim * dim;
  Kokkos::parallel_for("fill sgemm operands", Kokkos::RangePolicy<>(0, std::max(a_size, b_size)), KOKKOS_LAMBDA(std::size_t i) {
    // Ordinary floats in [-1, 1) from an integer hash: denormals or zeros would flatter or slow it.
    const auto mixed = std::uint32_t(i * 2654435761U + 12345U);
    if (i < a_size) a.data()[i] = float(mixed >> 8) / float(1U << 23) - 1.0F;
    if (i < b_size) b.data()[i] = float((mixed * 2246822519U) >> 8) / float(1U << 23) - 1.0F;
  });
  nn::linear<float>::cache cache;
  const double seconds = median_seconds(repeats, [&] { product.forward({b}, a, c, cache); });
  return 2.0 * double(rows) * double(dim) * 3.0 * double(dim) / seconds;
}

}  // namespace kfsdp::bench
