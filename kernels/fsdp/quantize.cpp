// int8 block quantization for the all-gather (include/kfsdp/fsdp/quantize.hpp).
// Build: part of the kfsdp library; checked by test/fsdp/test_pack.cpp.
#include <kfsdp/fsdp/quantize.hpp>

namespace kfsdp::kernels {

using range = Kokkos::RangePolicy<Kokkos::IndexType<std::size_t>>;

// One thread a block: its absmax, then its values rounded against the stored (f32) scale, so that
// dequantizing with that scale is off by at most half of it.
template <class Scalar>
void quantize_int8(Kokkos::View<const Scalar*> in, Kokkos::View<std::int8_t*> values, Kokkos::View<float*> scales) {
  const std::size_t numel = in.extent(0), block = int8_blocks::block;
  Kokkos::parallel_for("kfsdp::quantize_int8", range(0, scales.extent(0)), KOKKOS_LAMBDA(std::size_t b) {
    const std::size_t first = b * block, last = first + block < numel ? first + block : numel;
    Scalar absmax = 0;
    for (std::size_t i = first; i < last; ++i) {
      const Scalar magnitude = in(i) < 0 ? -in(i) : in(i);
      if (magnitude > absmax) absmax = magnitude;
    }
    const float scale = float(absmax / Scalar(127));
    scales(b) = scale;
    for (std::size_t i = first; i < last; ++i) {
      if (scale == 0.0f) {
        values(i) = 0;
        continue;
      }
      Scalar q = in(i) / Scalar(scale);
      q = q < 0 ? q - Scalar(0.5) : q + Scalar(0.5);  // to nearest, halves away from zero (truncated below)
      if (q > Scalar(127)) q = 127;
      if (q < Scalar(-127)) q = -127;
      values(i) = std::int8_t(q);
    }
  });
}

template <class Scalar>
void dequantize_int8(Kokkos::View<const std::int8_t*> values, Kokkos::View<const float*> scales, std::size_t first,
                     Kokkos::View<Scalar*> out) {
  const std::size_t block = int8_blocks::block;
  Kokkos::parallel_for("kfsdp::dequantize_int8", range(0, out.extent(0)), KOKKOS_LAMBDA(std::size_t i) {
    const std::size_t k = first + i;
    out(i) = Scalar(values(k)) * Scalar(scales(k / block));
  });
}

#define KFSDP_QUANTIZE_INSTANTIATE(Scalar)                                                                \
  template void quantize_int8<Scalar>(Kokkos::View<const Scalar*>, Kokkos::View<std::int8_t*>,             \
                                      Kokkos::View<float*>);                                              \
  template void dequantize_int8<Scalar>(Kokkos::View<const std::int8_t*>, Kokkos::View<const float*>,      \
                                        std::size_t, Kokkos::View<Scalar*>);
KFSDP_QUANTIZE_INSTANTIATE(float)
KFSDP_QUANTIZE_INSTANTIATE(double)

}  // namespace kfsdp::kernels
