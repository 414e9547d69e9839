#pragma once
// int8 block quantization of parameter shards and gradient chunks for the collectives
// (param_dtype = int8 and reduce_dtype = int8, after DeepSpeed ZeRO++'s qwZ and qgZ): one f32 scale
// per block of up to 256 values, symmetric (scale = absmax / 127, q = round(x / scale) in
// [−127, 127]), so that x − q · scale is at most scale / 2.
//
// A bucket's chunks (its parameters' chunks, one a parameter) travel as one contiguous wire buffer:
//   [ the chunks' int8 values, back to back | padding to 4 bytes | f32 scales ]
// The all-gather sends a rank's shard as one (every parameter: the values lie as the shard does),
// rank r's at r · bytes(). The gradient reduction (qgZ) sends every rank one: each unfrozen
// parameter's chunk of that rank, quantized by the sender, as one all-to-all; the receiver sums the
// dequantized contributions in Scalar.
// Each chunk has blocks of its own, from its first value: a block never mixes two parameters (a
// LayerNorm's ones beside a linear layer's 0.02s would leave the latter 2 or 3 levels).
// bytes() is a multiple of 4: the buffer goes over the communicators as f32 words, bit for bit.
//
//   const kfsdp::int8_blocks blocks(shard.extent(0));   // one chunk
//   kernels::quantize_int8<float>(shard, blocks.values(wire), blocks.scales(wire));   // wire: bytes() bytes
//   kernels::dequantize_int8<float>(blocks.values(wire), blocks.scales(wire), 0, out);  // out ≈ shard
//
//   // A bucket's layout, chunk by chunk (the all-gather's: every parameter).
//   const kfsdp::int8_blocks layout = kfsdp::walk_int8_chunks(map, b, kfsdp::every_param{},
//       [&](const kfsdp::int8_chunk& c) { /* c.values, c.scales of the wire buffer; c.shard of the shard */ });

#include <cstddef>
#include <cstdint>
#include <Kokkos_Core.hpp>

#include <kfsdp/plan/shard_mapping.hpp>

namespace kfsdp {

struct int8_blocks {
  static constexpr std::size_t block = 256;  // values sharing one scale, at most
  std::size_t numel = 0;                     // values
  std::size_t block_count = 0;               // scales

  [[nodiscard]] static constexpr std::size_t blocks_of(std::size_t values) noexcept { return (values + block - 1) / block; }
  // One chunk of `values` values.
  constexpr explicit int8_blocks(std::size_t values) noexcept : numel(values), block_count(blocks_of(values)) {}
  constexpr int8_blocks(std::size_t values, std::size_t blocks) noexcept : numel(values), block_count(blocks) {}

  // Byte offset of the scales: the values rounded up to a whole f32.
  [[nodiscard]] constexpr std::size_t scales_offset() const noexcept { return (numel + 3) / 4 * 4; }
  // The wire buffer's bytes (a multiple of 4).
  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return scales_offset() + sizeof(float) * block_count; }
  [[nodiscard]] constexpr std::size_t words() const noexcept { return bytes() / sizeof(float); }

  // The two parts of a wire buffer starting at `wire` (4-byte aligned), as views.
  [[nodiscard]] Kokkos::View<std::int8_t*> values(void* wire) const {
    return Kokkos::View<std::int8_t*>(static_cast<std::int8_t*>(wire), numel);
  }
  [[nodiscard]] Kokkos::View<float*> scales(void* wire) const {
    return Kokkos::View<float*>(reinterpret_cast<float*>(static_cast<char*>(wire) + scales_offset()), block_count);
  }
};

// One parameter's chunk in a bucket's wire buffer.
struct int8_chunk {
  std::size_t param = 0;  // its index in the plan
  index_range shard;      // its chunk in the bucket's local shard (shard_mapping::bucket_chunk)
  index_range values;     // its values in the wire buffer's values
  index_range scales;     // its blocks' scales
};

struct every_param {
  constexpr bool operator()(std::size_t /*param*/) const noexcept { return true; }
};
struct ignore_chunks {
  constexpr void operator()(const int8_chunk& /*chunk*/) const noexcept {}
};

// The one walk of bucket b's wire layout: visit(chunk) for every parameter that carried(p) keeps,
// in the bucket's order, each chunk's values right after the previous one's and blocks of its own;
// returns the wire buffer's size. With every parameter carried, chunk.values == chunk.shard.
template <class Plan, class Carried, class Visit>
constexpr int8_blocks walk_int8_chunks(const basic_shard_mapping<Plan>& map, std::size_t b, Carried&& carried,
                                       Visit&& visit) {
  const auto& bucket = map.plan().buckets[b];
  std::size_t values = 0, blocks = 0;
  for (std::size_t p = bucket.first_param; p < bucket.first_param + bucket.param_count; ++p) {
    if (!carried(p)) continue;
    const index_range chunk = map.bucket_chunk(p);
    const std::size_t chunk_blocks = int8_blocks::blocks_of(chunk.count);
    visit(int8_chunk{p, chunk, {values, chunk.count}, {blocks, chunk_blocks}});
    values += chunk.count;
    blocks += chunk_blocks;
  }
  return {values, blocks};
}

// A rank's wire buffer for bucket b's all-gather: its shard's values, each parameter's chunk in
// blocks of its own.
template <class Plan>
constexpr int8_blocks int8_bucket_blocks(const basic_shard_mapping<Plan>& map, std::size_t b) noexcept {
  return walk_int8_chunks(map, b, every_param{}, ignore_chunks{});
}

namespace kernels {

// One chunk: values[i] = round(in[i] / scales[i / 256]), scales[b] = absmax of block b / 127 (0 for a
// zero block). A block with a NaN or an infinity gets a NaN scale and zero values: it dequantizes
// (and sums) to NaN, so a non-finite shard or gradient stays non-finite across the collective.
template <class Scalar>
void quantize_int8(Kokkos::View<const Scalar*> in, Kokkos::View<std::int8_t*> values, Kokkos::View<float*> scales);

// One chunk: out[i] = values[first + i] · scales[(first + i) / 256] for i < out.extent(0) (a
// chunk's real elements, straight into their place).
template <class Scalar>
void dequantize_int8(Kokkos::View<const std::int8_t*> values, Kokkos::View<const float*> scales, std::size_t first,
                     Kokkos::View<Scalar*> out);

// One chunk of the gradient reduction, summed over `sources` wire buffers of `layout` back to back
// (an all-to-all's receive buffer, rank after rank): out[i] = factor · Σ_s values_s[v + i] ·
// scales_s[c + i / 256] with v = chunk.values.first, c = chunk.scales.first, summed in Scalar in
// rank order; out has chunk.values.count elements.
template <class Scalar>
void sum_dequantized_int8(Kokkos::View<const char*> wires, std::size_t sources, const int8_blocks& layout,
                          const int8_chunk& chunk, Scalar factor, Kokkos::View<Scalar*> out);

#define KFSDP_QUANTIZE_EXTERN(Scalar)                                                                          \
  extern template void quantize_int8<Scalar>(Kokkos::View<const Scalar*>, Kokkos::View<std::int8_t*>,           \
                                             Kokkos::View<float*>);                                            \
  extern template void dequantize_int8<Scalar>(Kokkos::View<const std::int8_t*>, Kokkos::View<const float*>,    \
                                               std::size_t, Kokkos::View<Scalar*>);                    \
  extern template void sum_dequantized_int8<Scalar>(Kokkos::View<const char*>, std::size_t, const int8_blocks&, \
                                                    const int8_chunk&, Scalar, Kokkos::View<Scalar*>);
KFSDP_QUANTIZE_EXTERN(float)
KFSDP_QUANTIZE_EXTERN(double)
#undef KFSDP_QUANTIZE_EXTERN

}  // namespace kernels
}  // namespace kfsdp
