#pragma once
// int8 block quantization of a parameter shard for the all-gather (param_dtype = int8, after
// DeepSpeed ZeRO++'s qwZ): one f32 scale per block of 256 values, symmetric (scale = absmax / 127,
// q = round(x / scale) in [−127, 127]), so that x − q · scale is at most scale / 2.
//
// A rank's shard travels as one contiguous wire buffer, so the bucket's all-gather stays
// per-rank-contiguous (rank r's buffer at r · bytes()):
//   [ numel int8 values | padding to 4 bytes | block_count() f32 scales ]
// bytes() is a multiple of 4: the buffer goes over the communicators as f32 words, bit for bit.
//
//   const kfsdp::int8_blocks blocks{shard.extent(0)};
//   kernels::quantize_int8<float>(shard, blocks.values(wire), blocks.scales(wire));   // wire: bytes() bytes
//   kernels::dequantize_int8<float>(blocks.values(wire), blocks.scales(wire), 0, out);  // out ≈ shard

#include <cstddef>
#include <cstdint>
#include <Kokkos_Core.hpp>

namespace kfsdp {

struct int8_blocks {
  static constexpr std::size_t block = 256;  // values sharing one scale
  std::size_t numel = 0;                     // values quantized

  [[nodiscard]] constexpr std::size_t block_count() const noexcept { return (numel + block - 1) / block; }
  // Byte offset of the scales: the values rounded up to a whole f32.
  [[nodiscard]] constexpr std::size_t scales_offset() const noexcept { return (numel + 3) / 4 * 4; }
  // The wire buffer's bytes (a multiple of 4).
  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return scales_offset() + sizeof(float) * block_count(); }
  [[nodiscard]] constexpr std::size_t words() const noexcept { return bytes() / sizeof(float); }

  // The two parts of a wire buffer starting at `wire` (4-byte aligned), as views.
  [[nodiscard]] Kokkos::View<std::int8_t*> values(void* wire) const {
    return Kokkos::View<std::int8_t*>(static_cast<std::int8_t*>(wire), numel);
  }
  [[nodiscard]] Kokkos::View<float*> scales(void* wire) const {
    return Kokkos::View<float*>(reinterpret_cast<float*>(static_cast<char*>(wire) + scales_offset()), block_count());
  }
};

namespace kernels {

// values[i] = round(in[i] / scales[i / 256]), scales[b] = absmax of block b / 127 (0 for a zero block).
template <class Scalar>
void quantize_int8(Kokkos::View<const Scalar*> in, Kokkos::View<std::int8_t*> values, Kokkos::View<float*> scales);

// out[i] = values[first + i] · scales[(first + i) / 256] for i < out.extent(0): a range of the
// quantized shard (one parameter's chunk) straight into its place.
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
