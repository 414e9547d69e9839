#pragma once
// int8 block quantization of a parameter shard for the all-gather (param_dtype = int8, after
// DeepSpeed ZeRO++'s qwZ): one f32 scale per block of up to 256 values, symmetric
// (scale = absmax / 127, q = round(x / scale) in [−127, 127]), so that x − q · scale is at most scale / 2.
//
// A rank's shard of a bucket travels as one contiguous wire buffer, so the bucket's all-gather stays
// per-rank-contiguous (rank r's buffer at r · bytes()):
//   [ the shard's int8 values, in its layout | padding to 4 bytes | f32 scales ]
// Each parameter's chunk has blocks of its own, from its first value: a block never mixes two
// parameters (a LayerNorm's ones beside a linear layer's 0.02s would leave the latter 2 or 3 levels).
// bytes() is a multiple of 4: the buffer goes over the communicators as f32 words, bit for bit.
//
//   const kfsdp::int8_blocks blocks(shard.extent(0));   // one chunk
//   kernels::quantize_int8<float>(shard, blocks.values(wire), blocks.scales(wire));   // wire: bytes() bytes
//   kernels::dequantize_int8<float>(blocks.values(wire), blocks.scales(wire), 0, out);  // out ≈ shard

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

// A rank's wire buffer for bucket b: its shard's values, each parameter's chunk in blocks of its own.
template <class Plan>
constexpr int8_blocks int8_bucket_blocks(const basic_shard_mapping<Plan>& map, std::size_t b) noexcept {
  const auto& bucket = map.plan().buckets[b];
  std::size_t blocks = 0;
  for (std::size_t p = bucket.first_param; p < bucket.first_param + bucket.param_count; ++p)
    blocks += int8_blocks::blocks_of(map.bucket_chunk(p).count);
  return {map.bucket(b).count, blocks};
}

namespace kernels {

// One chunk: values[i] = round(in[i] / scales[i / 256]), scales[b] = absmax of block b / 127 (0 for a
// zero block).
template <class Scalar>
void quantize_int8(Kokkos::View<const Scalar*> in, Kokkos::View<std::int8_t*> values, Kokkos::View<float*> scales);

// One chunk: out[i] = values[first + i] · scales[(first + i) / 256] for i < out.extent(0) (a
// chunk's real elements, straight into their place).
template <class Scalar>
void dequantize_int8(Kokkos::View<const std::int8_t*> values, Kokkos::View<const float*> scales, std::size_t first,
                     Kokkos::View<Scalar*> out);

#define KFSDP_QUANTIZE_EXTERN(Scalar)                                                                          \
  extern template void quantize_int8<Scalar>(Kokkos::View<const Scalar*>, Kokkos::View<std::int8_t*>,           \
                                             Kokkos::View<float*>);                                            \
  extern template void dequantize_int8<Scalar>(Kokkos::View<const std::int8_t*>, Kokkos::View<const float*>,    \
                                               std::size_t, Kokkos::View<Scalar*>);
KFSDP_QUANTIZE_EXTERN(float)
KFSDP_QUANTIZE_EXTERN(double)
#undef KFSDP_QUANTIZE_EXTERN

}  // namespace kernels
}  // namespace kfsdp
