// bench/kernels — kfsdp's Kokkos kernels against the plainest code that moves the same bytes.
//
//   unpack / pack:      kfsdp::kernels::unpack_param / pack_param over one bucket of 4 parameters
//                       at world size 4, against one copy of the bucket (Kokkos::deep_copy: memcpy on
//                       the host, cudaMemcpy on a GPU);
//   accumulate_scaled:  the gradient average (dst += scale * src) against a plain loop;
//   sgd / adamw:        the fused optimizer steps of kfsdp::optim against a plain loop with the
//                       same arithmetic on raw pointers;
//   gelu:               kfsdp::reference::activation<float> gelu forward + backward (fast_erf) against
//                       the same kernels with libm's erf and exp (the code before fast_erf), 4M elements;
//   roofline:           every kernel of the example GPT's step (layer_norm and gelu: the hand-written
//                       ones of reference/, not the derived ones the step runs) at train_gpt's shapes
//                       (B·T = 512 tokens, dim 128, 4 heads, seq 64, vocab 256, 4 layers), forward and
//                       backward, as GFLOP/s against the sgemm measured in the same run, or as GB/s
//                       against memcpy;
//   attention methods:  nn::causal_self_attention's whole and blocked methods, forward + backward, f32,
//                       at the 19 M GPT's shapes (8 windows, 8 heads of 64) for T = 64, 128, 256, 512,
//                       interleaved: the median times, their ratio, and the bytes each cache keeps.
// GB/s counts every byte read or written once (memcpy: 2 per byte; adamw: 4 reads, 3 writes).
//
//   build/bench/bench_kernels --min-bytes 65536 --max-bytes 67108864 --repeats 20
//   OPENBLAS_NUM_THREADS=1 build/bench/bench_kernels --sweep 0 --attention 0 --repeats 50   # the roofline table only
//   OPENBLAS_NUM_THREADS=1 build/bench/bench_kernels --sweep 0 --roofline 0 --repeats 9    # the attention methods only
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/detail/kokkos_math.hpp>
#include <kfsdp/environment.hpp>
#include <kfsdp/nn/attention.hpp>
#include <kfsdp/nn/cross_entropy.hpp>
#include <kfsdp/nn/embedding.hpp>
#include <kfsdp/nn/linear.hpp>
#include <kfsdp/fsdp/pack.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/sgd.hpp>

#include <activation.hpp>
#include <layer_norm.hpp>

#include "roofline.hpp"

namespace {

using view = Kokkos::View<float*>;
using const_view = Kokkos::View<const float*>;

struct bench_options {
  std::size_t min_bytes = 64 * 1024;
  std::size_t max_bytes = 64 * 1024 * 1024;
  std::size_t repeats = 20;
  std::size_t sweep = 1;      // 0: no byte sweep
  std::size_t roofline = 1;   // 0: no roofline table
  std::size_t attention = 1;  // 0: no attention methods table
};

bench_options parse_options(int argc, char** argv) {
  bench_options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const std::string_view text = argv[++i];
    std::size_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size())
      throw std::invalid_argument(fmt::format("{}: '{}' is not a non-negative integer", flag, text));
    if (flag == "--min-bytes") options.min_bytes = value;
    else if (flag == "--max-bytes") options.max_bytes = value;
    else if (flag == "--repeats") options.repeats = value;
    else if (flag == "--sweep") options.sweep = value;
    else if (flag == "--roofline") options.roofline = value;
    else if (flag == "--attention") options.attention = value;
    else throw std::invalid_argument(
        fmt::format("unknown flag {} (flags: --min-bytes, --max-bytes, --repeats, --sweep, --roofline, --attention)", flag));
  }
  if (options.repeats == 0) throw std::invalid_argument("--repeats is 0, expected >= 1");
  if (options.min_bytes < 64) throw std::invalid_argument("--min-bytes is below 64");
  return options;
}

using kfsdp::bench::median_seconds;

void print_row(std::string_view kernel, std::size_t bytes, double bytes_touched, double kfsdp_seconds,
               double plain_seconds) {
  fmt::print("{:<18} {:>11} {:>10.4f} {:>10.4f} {:>7.2f} {:>9.2f} {:>9.2f}\n", kernel, bytes,
             kfsdp_seconds * 1e3, plain_seconds * 1e3, kfsdp_seconds / plain_seconds,
             bytes_touched / kfsdp_seconds / 1e9, bytes_touched / plain_seconds / 1e9);
}

view filled(const char* label, std::size_t numel, float value) {
  view v(std::string(label), numel);
  Kokkos::deep_copy(v, value);
  return v;
}

// One bucket: `params` parameters of equal size at world size `ranks`; bytes = the whole bucket.
void bench_pack(std::size_t bytes, std::size_t repeats) {
  constexpr std::size_t ranks = 4, params = 4;
  const std::size_t chunk = bytes / sizeof(float) / ranks / params;
  const std::size_t shard = chunk * params;  // per-rank stride of the gathered buffer
  const std::size_t numel = shard * ranks;
  kfsdp::shard_plan plan;  // `params` vectors of chunk·ranks elements in one bucket
  plan.world_size = ranks;
  for (std::size_t p = 0; p < params; ++p)
    plan.params.push_back({.dim0 = chunk * ranks, .row_numel = 1, .chunk_rows = chunk, .bucket = 0,
                           .bucket_offset = p * chunk, .storage_offset = p * chunk});
  plan.buckets = {{.first_param = 0, .param_count = params, .shard_numel = shard, .full_numel = numel}};
  const kfsdp::shard_mapping map(plan);
  const view gathered = filled("gathered", numel, 1.0F), unpacked = filled("unpacked", numel, 0.0F);
  const double touched = 2.0 * static_cast<double>(numel * sizeof(float));
  // The copy of the same bytes: a memcpy on the host, a device-to-device cudaMemcpy on a GPU build.
  const double copy = median_seconds(repeats, [&] { Kokkos::deep_copy(unpacked, gathered); });
  const double unpack = median_seconds(repeats, [&] {
    for (std::size_t p = 0; p < params; ++p) kfsdp::kernels::unpack_param<float>(gathered, map, p, unpacked);
  });
  const double pack = median_seconds(repeats, [&] {
    for (std::size_t p = 0; p < params; ++p) kfsdp::kernels::pack_param<float>(unpacked, map, p, gathered);
  });
  print_row("unpack_param", numel * sizeof(float), touched, unpack, copy);
  print_row("pack_param", numel * sizeof(float), touched, pack, copy);
}

void bench_accumulate(std::size_t numel, std::size_t repeats) {
  const view destination = filled("destination", numel, 0.0F);
  const view source = filled("source", numel, 1.0F);
  constexpr float scale = 0.25F;
  const double kfsdp_seconds = median_seconds(repeats, [&] {
    kfsdp::kernels::accumulate_scaled<float>(destination, source, scale);
  });
  const double plain_seconds = median_seconds(repeats, [&] {
    float* __restrict dst = destination.data();
    const float* __restrict src = source.data();
    for (std::size_t i = 0; i < numel; ++i) dst[i] += scale * src[i];
  });
  print_row("accumulate_scaled", numel * sizeof(float), 3.0 * numel * sizeof(float), kfsdp_seconds,
            plain_seconds);
}

void bench_sgd(std::size_t numel, std::size_t repeats) {
  const view params = filled("params", numel, 1.0F), momentum = filled("momentum", numel, 0.0F);
  const view grads = filled("grads", numel, 1e-3F);
  const kfsdp::optim::sgd_options options{.lr = 1e-3, .momentum = 0.9};
  const double kfsdp_seconds = median_seconds(repeats, [&] {
    kfsdp::optim::sgd_step<float>(params, grads, momentum, options);
  });
  const double plain_seconds = median_seconds(repeats, [&] {
    float* __restrict p = params.data();
    float* __restrict m = momentum.data();
    const float* __restrict g = grads.data();
    const auto lr = static_cast<float>(options.lr), mu = static_cast<float>(options.momentum);
    for (std::size_t i = 0; i < numel; ++i) {
      m[i] = mu * m[i] + g[i];
      p[i] -= lr * m[i];
    }
  });
  // Reads params, grads, momentum; writes params, momentum.
  print_row("sgd_step momentum", numel * sizeof(float), 5.0 * numel * sizeof(float), kfsdp_seconds,
            plain_seconds);
}

void bench_adamw(std::size_t numel, std::size_t repeats) {
  const view params = filled("params", numel, 1.0F), grads = filled("grads", numel, 1e-3F);
  const view exp_avg = filled("exp_avg", numel, 0.0F), exp_avg_sq = filled("exp_avg_sq", numel, 0.0F);
  const kfsdp::optim::adamw_options options{};
  constexpr std::int64_t step = 10;
  const double kfsdp_seconds = median_seconds(repeats, [&] {
    kfsdp::optim::adamw_step<float>(params, grads, exp_avg, exp_avg_sq, options, step);
  });
  const double plain_seconds = median_seconds(repeats, [&] {
    float* __restrict p = params.data();
    float* __restrict m = exp_avg.data();
    float* __restrict v = exp_avg_sq.data();
    const float* __restrict g = grads.data();
    const auto b1 = static_cast<float>(options.beta1), b2 = static_cast<float>(options.beta2);
    const auto eps = static_cast<float>(options.eps);
    const auto decay = static_cast<float>(1.0 - options.lr * options.weight_decay);
    const auto step_size = static_cast<float>(options.lr / (1.0 - std::pow(options.beta1, step)));
    const auto root_correction = static_cast<float>(std::sqrt(1.0 - std::pow(options.beta2, step)));
    for (std::size_t i = 0; i < numel; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] = decay * p[i] - step_size * m[i] / (std::sqrt(v[i]) / root_correction + eps);
    }
  });
  print_row("adamw_step", numel * sizeof(float), 7.0 * numel * sizeof(float), kfsdp_seconds, plain_seconds);
}

// gelu forward + backward over [rows, 512] floats; elements/s counts each element once per pass pair.
void bench_gelu(std::size_t numel, std::size_t repeats) {
  constexpr int cols = 512;
  const int rows = int(numel / cols);
  using matrix = kfsdp::nn::matrix<float>;
  matrix x("x", rows, cols), y("y", rows, cols), dy("dy", rows, cols), dx("dx", rows, cols);
  Kokkos::parallel_for("fill", Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0}, {rows, cols}), KOKKOS_LAMBDA(int r, int c) {
    x(r, c) = float((r * cols + c) % 2001) * 0.004F - 4.0F;  // [-4, 4], the range where erf is not ±1
    dy(r, c) = 1.0F;
  });
  const kfsdp::reference::activation<float> gelu(kfsdp::reference::activation_kind::gelu, cols);
  const double fast_seconds = median_seconds(repeats, [&] {
    gelu.forward(x, y);
    gelu.backward(x, dy, dx);
  });
  const double libm_seconds = median_seconds(repeats, [&] {
    const auto policy = Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0}, {rows, cols});
    Kokkos::parallel_for("gelu_forward_libm", policy, KOKKOS_LAMBDA(int r, int c) {
      const float v = x(r, c);
      y(r, c) = 0.5F * v * (1.0F + kfsdp::math::erf(v * 0.70710678F));
    });
    Kokkos::parallel_for("gelu_backward_libm", policy, KOKKOS_LAMBDA(int r, int c) {
      const float v = x(r, c);
      const float cdf = 0.5F * (1.0F + kfsdp::math::erf(v * 0.70710678F));
      dx(r, c) = dy(r, c) * (cdf + v * 0.39894228F * kfsdp::math::exp(-0.5F * v * v));
    });
  });
  const double elements = double(rows) * cols;
  fmt::print("{:<18} {:>11} {:>10.4f} {:>10.4f} {:>7.2f}   fast_erf {:.3g} elements/s, libm erf {:.3g} elements/s\n",
             "gelu fwd+bwd", elements * sizeof(float), fast_seconds * 1e3, libm_seconds * 1e3,
             fast_seconds / libm_seconds, elements / fast_seconds, elements / libm_seconds);
}

// The roofline of the example GPT's step: each kernel at train_gpt's shapes, its rate against the
// sgemm and the memcpy measured here, in this run (both single-threaded with OPENBLAS_NUM_THREADS=1).
namespace roofline {

using matrix = kfsdp::nn::matrix<float>;
using vector = kfsdp::nn::vector<float>;
using tensors_of_linear = kfsdp::nn::linear_tensors<float>;

constexpr int tokens = 512, dim = 128, heads = 4, seq = 64, vocab = 256, layers = 4;

matrix random_matrix(const char* label, int rows, int cols, std::uint64_t seed) {
  matrix m(std::string(label), rows, cols);
  Kokkos::parallel_for("fill", Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0}, {rows, cols}), KOKKOS_LAMBDA(int r, int c) {
    // A small integer hash to [-1, 1): the values only need to be ordinary floats.
    const auto mixed = std::uint32_t(r * 7919 + c * 104729 + int(seed) * 15485863) * 2654435761U;
    m(r, c) = float(mixed >> 8) / float(1U << 23) - 1.0F;
  });
  return m;
}

struct reference_rates {
  double sgemm_flops;     // per second, 512×128 · 128×384 (c_attn's product)
  double memcpy_bytes;    // per second, read + write, 1 MiB (the size of a [512, 512] activation)
};

void print_header(const reference_rates& ref) {
  fmt::print("\n# roofline: train_gpt's shapes (tokens {}, dim {}, heads {}, seq {}, vocab {}); median of the repeats\n",
             tokens, dim, heads, seq, vocab);
  fmt::print("# sgemm 512x128*128x384: {:.2f} GFLOP/s; memcpy 1 MiB: {:.2f} GB/s (read + write); BLAS: {}\n",
             ref.sgemm_flops / 1e9, ref.memcpy_bytes / 1e9, kfsdp::bench::blas_in_use());
  fmt::print("{:<26} {:>9} {:>8} {:>10} {:>8} {:>10} {:>9}\n", "kernel", "ms", "GFLOP/s", "%sgemm", "GB/s", "%memcpy",
             "step_ms");
}

// flops or bytes 0: not counted (the kernel is bound by the other). per_step: calls per training step.
void print_kernel(std::string_view name, double seconds, double flops, double bytes, int per_step,
                  const reference_rates& ref) {
  const auto cell = [](double value, double reference, double scale) {
    return value > 0 ? fmt::format("{:.2f}", value / reference * scale) : std::string("-");
  };
  fmt::print("{:<26} {:>9.4f} {:>8} {:>10} {:>8} {:>10} {:>9.3f}\n", name, seconds * 1e3, cell(flops / seconds, 1e9, 1),
             cell(flops / seconds, ref.sgemm_flops, 100), cell(bytes / seconds, 1e9, 1),
             cell(bytes / seconds, ref.memcpy_bytes, 100), seconds * 1e3 * per_step);
}

reference_rates measure_references(std::size_t repeats) {
  const view source = filled("source", 256 * 1024, 1.0F), target = filled("target", 256 * 1024, 0.0F);
  const double copy = median_seconds(repeats, [&] { Kokkos::deep_copy(target, source); });
  return {kfsdp::bench::sgemm_rate(tokens, dim, repeats), 2.0 * double(source.span()) * sizeof(float) / copy};
}

void bench_linear(std::string_view name, int in, int out, int per_step, std::size_t repeats, const reference_rates& ref) {
  const kfsdp::nn::linear<float> layer{std::size_t(in), std::size_t(out)};
  const matrix weight = random_matrix("weight", out, in, 3), weight_grad("weight_grad", out, in);
  const vector bias("bias", std::size_t(out)), bias_grad("bias_grad", std::size_t(out));
  const matrix x = random_matrix("x", tokens, in, 4), y("y", tokens, out), dy = random_matrix("dy", tokens, out, 5);
  const matrix dx("dx", tokens, in);
  kfsdp::nn::linear<float>::cache cache;
  const kfsdp::nn::linear<float>::params params{weight, bias};
  const tensors_of_linear grads{weight_grad, bias_grad};
  const double forward = median_seconds(repeats, [&] { layer.forward(params, x, y, cache); });
  const double backward = median_seconds(repeats, [&] { layer.backward(params, grads, cache, dy, dx); });
  const double product = 2.0 * tokens * in * out;
  print_kernel(fmt::format("{} fwd {}->{}", name, in, out), forward, product, 0, per_step, ref);
  print_kernel(fmt::format("{} bwd {}->{}", name, in, out), backward, 2 * product, 0, per_step, ref);
}

void bench_attention(std::size_t repeats, const reference_rates& ref) {
  kfsdp::nn::causal_self_attention<float> attention(dim, heads, seq);
  const matrix qkv = random_matrix("qkv", tokens, 3 * dim, 6), y("y", tokens, dim);
  const matrix dy = random_matrix("dy", tokens, dim, 7), dqkv("dqkv", tokens, 3 * dim);
  auto cache = attention.make_cache(tokens);
  const double forward = median_seconds(repeats, [&] { attention.forward({}, qkv, y, cache); });
  const double backward = median_seconds(repeats, [&] { attention.backward({}, {}, cache, dy, dqkv); });
  // The full T×T products per (window, head), as the GEMMs compute them (the causal half is half of that).
  const double product = 2.0 * (tokens / seq) * heads * seq * seq * (dim / heads);
  print_kernel("attention fwd", forward, 2 * product, 0, layers, ref);
  print_kernel("attention bwd", backward, 4 * product, 0, layers, ref);
}

void bench_layer_norm(std::size_t repeats, const reference_rates& ref) {
  const kfsdp::reference::layer_norm<float> norm(dim);
  const vector weight("weight", dim), bias("bias", dim), weight_grad("weight_grad", dim), bias_grad("bias_grad", dim);
  Kokkos::deep_copy(weight, 1.0F);
  const matrix x = random_matrix("x", tokens, dim, 8), y("y", tokens, dim), dy = random_matrix("dy", tokens, dim, 9);
  const matrix dx("dx", tokens, dim);
  auto cache = norm.make_cache(tokens);
  const kfsdp::reference::layer_norm<float>::params params{weight, bias};
  const kfsdp::reference::layer_norm<float>::grads grads{weight_grad, bias_grad};
  const double forward = median_seconds(repeats, [&] { norm.forward(params, x, y, cache); });
  const double backward = median_seconds(repeats, [&] { norm.backward(params, grads, cache, dy, dx); });
  const double activation = double(tokens) * dim * sizeof(float);
  print_kernel("layer_norm fwd", forward, 0, 2 * activation, 2 * layers + 1, ref);   // x in, y out
  print_kernel("layer_norm bwd", backward, 0, 3 * activation, 2 * layers + 1, ref);  // x, dy in, dx out
}

void bench_gelu(std::size_t repeats, const reference_rates& ref) {
  const kfsdp::reference::activation<float> gelu(kfsdp::reference::activation_kind::gelu, 4 * dim);
  const matrix x = random_matrix("x", tokens, 4 * dim, 10), y("y", tokens, 4 * dim);
  const matrix dy = random_matrix("dy", tokens, 4 * dim, 11), dx("dx", tokens, 4 * dim);
  const double forward = median_seconds(repeats, [&] { gelu.forward(x, y); });
  const double backward = median_seconds(repeats, [&] { gelu.backward(x, dy, dx); });
  const double activation = double(tokens) * 4 * dim * sizeof(float);
  print_kernel("gelu fwd [512, 512]", forward, 0, 2 * activation, layers, ref);
  print_kernel("gelu bwd [512, 512]", backward, 0, 3 * activation, layers, ref);
}

void bench_cross_entropy(std::size_t repeats, const reference_rates& ref) {
  const kfsdp::nn::cross_entropy<float> loss(vocab);
  const matrix logits = random_matrix("logits", tokens, vocab, 12), dlogits("dlogits", tokens, vocab);
  const kfsdp::nn::index_vector targets("targets", tokens);
  Kokkos::parallel_for("targets", tokens, KOKKOS_LAMBDA(int n) { targets(n) = (n * 37) % vocab; });
  auto cache = loss.make_cache(tokens);
  const double forward = median_seconds(repeats, [&] { (void)loss.forward(logits, targets, cache); });
  const double backward = median_seconds(repeats, [&] { loss.backward(cache, 1.0F, dlogits); });
  const double all_logits = double(tokens) * vocab * sizeof(float);
  print_kernel("cross_entropy fwd", forward, 0, all_logits, 1, ref);
  print_kernel("cross_entropy bwd", backward, 0, 2 * all_logits, 1, ref);
}

void bench_embedding(std::size_t repeats, const reference_rates& ref) {
  const kfsdp::nn::embedding<float> table(vocab, dim);
  const matrix weight = random_matrix("weight", vocab, dim, 13), weight_grad("weight_grad", vocab, dim);
  const matrix y("y", tokens, dim), dy = random_matrix("dy", tokens, dim, 14);
  const kfsdp::nn::index_vector ids("ids", tokens);
  Kokkos::parallel_for("ids", tokens, KOKKOS_LAMBDA(int n) { ids(n) = (n * 37) % vocab; });
  kfsdp::nn::embedding<float>::cache cache;
  const double forward = median_seconds(repeats, [&] { table.forward({weight}, ids, y, cache); });
  const double backward = median_seconds(repeats, [&] { table.backward({weight_grad}, cache, dy); });
  const double rows = double(tokens) * dim * sizeof(float);
  print_kernel("embedding fwd", forward, 0, 2 * rows, 2, ref);   // rows gathered, y written
  print_kernel("embedding bwd", backward, 0, 3 * rows, 2, ref);  // dy read, weight rows read and written
}

void bench_adamw_shard(std::size_t repeats, const reference_rates& ref) {
  constexpr std::size_t parameters = 867072;  // train_gpt's parameters at these shapes, one rank
  const view params = filled("params", parameters, 1.0F), grads = filled("grads", parameters, 1e-3F);
  const view exp_avg = filled("exp_avg", parameters, 0.0F), exp_avg_sq = filled("exp_avg_sq", parameters, 0.0F);
  const kfsdp::optim::adamw_options options{};
  const double seconds = median_seconds(repeats, [&] { kfsdp::optim::adamw_step<float>(params, grads, exp_avg, exp_avg_sq, options, 10); });
  print_kernel("adamw 867072 params", seconds, 0, 7.0 * parameters * sizeof(float), 1, ref);
}

void run(std::size_t repeats) {
  const reference_rates ref = measure_references(repeats);
  print_header(ref);
  bench_linear("c_attn", dim, 3 * dim, layers, repeats, ref);
  bench_linear("attn c_proj", dim, dim, layers, repeats, ref);
  bench_linear("mlp c_fc", dim, 4 * dim, layers, repeats, ref);
  bench_linear("mlp c_proj", 4 * dim, dim, layers, repeats, ref);
  bench_linear("lm_head", dim, vocab, 1, repeats, ref);
  bench_attention(repeats, ref);
  bench_layer_norm(repeats, ref);
  bench_gelu(repeats, ref);
  bench_cross_entropy(repeats, ref);
  bench_embedding(repeats, ref);
  bench_adamw_shard(repeats, ref);
}

}  // namespace roofline

// The whole and the blocked method of the attention at the 19 M GPT's shapes (8 windows, 8 heads of
// 64, f32), forward + backward, timed in turn each repeat (the order alternating) so that both see
// the same machine; the ratio is blocked / whole of the medians.
void bench_attention_methods(std::size_t repeats) {
  using kfsdp::nn::attention_method;
  constexpr int windows = 8, heads = 8, dim = 512;
  fmt::print("\n# attention methods: f32, {} windows, {} heads of {}, forward + backward; median of {} interleaved repeats; "
             "blocked from T >= {} (automatic)\n",
             windows, heads, dim / heads, repeats, kfsdp::nn::blocked_from_seq_len);
  fmt::print("{:>5} {:>10} {:>11} {:>14} {:>12} {:>13}\n", "T", "whole_ms", "blocked_ms", "blocked/whole", "whole_kept",
             "blocked_kept");
  for (const int seq : {64, 128, 256, 512}) {
    const int rows = windows * seq;
    const roofline::matrix qkv = roofline::random_matrix("qkv", rows, 3 * dim, 6), dy = roofline::random_matrix("dy", rows, dim, 7);
    const roofline::matrix y("y", rows, dim), dqkv("dqkv", rows, 3 * dim);
    kfsdp::nn::causal_self_attention<float> whole(dim, heads, seq, heads, attention_method::whole);
    kfsdp::nn::causal_self_attention<float> blocked(dim, heads, seq, heads, attention_method::blocked);
    auto whole_cache = whole.make_cache(rows), blocked_cache = blocked.make_cache(rows);
    const auto step = [&](kfsdp::nn::causal_self_attention<float>& attention, auto& cache) {
      const auto start = std::chrono::steady_clock::now();
      attention.forward({}, qkv, y, cache);
      attention.backward({}, {}, cache, dy, dqkv);
      Kokkos::fence();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    (void)step(whole, whole_cache);  // warm-up: scratch allocated, caches warm
    (void)step(blocked, blocked_cache);
    std::vector<double> whole_seconds, blocked_seconds;
    for (std::size_t r = 0; r < std::max<std::size_t>(repeats, 1); ++r) {
      if (r % 2 == 0) {
        whole_seconds.push_back(step(whole, whole_cache));
        blocked_seconds.push_back(step(blocked, blocked_cache));
      } else {
        blocked_seconds.push_back(step(blocked, blocked_cache));
        whole_seconds.push_back(step(whole, whole_cache));
      }
    }
    const auto median = [](std::vector<double> v) {
      std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
      return v[v.size() / 2];
    };
    const double whole_ms = median(whole_seconds) * 1e3, blocked_ms = median(blocked_seconds) * 1e3;
    const auto kib = [](std::size_t bytes) { return fmt::format("{:.0f} KiB", double(bytes) / 1024); };
    fmt::print("{:>5} {:>10.3f} {:>11.3f} {:>14.3f} {:>12} {:>13}\n", seq, whole_ms, blocked_ms, blocked_ms / whole_ms,
               kib(whole_cache.kept_bytes()), kib(blocked_cache.kept_bytes()));
  }
}

int run(int argc, char** argv) {
  const bench_options options = parse_options(argc, argv);
  fmt::print("# bench_kernels: float, Kokkos {}; median of {} repeats (fewer above 4 MiB); "
             "plain = a copy of the bucket (pack/unpack) or a plain host loop with the same arithmetic\n",
             Kokkos::DefaultExecutionSpace::name(), options.repeats);
  fmt::print("{:<18} {:>11} {:>10} {:>10} {:>7} {:>9} {:>9}\n", "kernel", "bytes", "kfsdp_ms", "plain_ms",
             "ratio", "kfsdp_GB/s", "plain_GB/s");
  for (std::size_t bytes = options.min_bytes; options.sweep != 0 && bytes <= options.max_bytes; bytes *= 4) {
    constexpr std::size_t full_repeats_up_to = 4 * 1024 * 1024;
    const std::size_t repeats = bytes <= full_repeats_up_to
                                    ? options.repeats
                                    : std::max<std::size_t>(3, options.repeats * full_repeats_up_to / bytes);
    const std::size_t numel = bytes / sizeof(float);
    bench_pack(bytes, repeats);
    // The plain references of these are host loops over raw pointers: host memory only.
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, view::memory_space>::accessible) {
      bench_accumulate(numel, repeats);
      bench_sgd(numel, repeats);
      bench_adamw(numel, repeats);
    }
  }
  if (options.sweep != 0) bench_gelu(4 * 1024 * 1024, options.repeats);
  if (options.roofline != 0) roofline::run(options.repeats);
  if (options.attention != 0) bench_attention_methods(options.repeats);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::environment kokkos(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "bench_kernels: {}\n", error.what());
    return 2;
  }
}
