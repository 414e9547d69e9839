// int8 block quantization for the all-gather and the gradient reduction (include/kfsdp/fsdp/quantize.hpp).
// Build: part of the kfsdp library; checked by test/fsdp/test_pack.cpp.
#include <kfsdp/fsdp/quantize.hpp>

namespace kfsdp::kernels {

using range = Kokkos::RangePolicy<Kokkos::IndexType<std::size_t>>;

// One thread a block: its absmax, then its values rounded against the stored (f32) scale, so that
// dequantizing with that scale is off by at most half of it.
// A block holding a NaN or an infinity gets a NaN scale and zero values, so that it dequantizes to
// NaN throughout: the non-finite value reaches the receiver (and the trainer's check) as one, never
// as a number. Found in the absmax loop itself: a NaN, once seen, stays the absmax (every comparison
// with it is false), an infinity stays unless a NaN follows; absmax − absmax is then NaN.
template <class Scalar>
void quantize_int8(Kokkos::View<const Scalar*> in, Kokkos::View<std::int8_t*> values, Kokkos::View<float*> scales) {
  const std::size_t numel = in.extent(0), block = int8_blocks::block;
  Kokkos::parallel_for("kfsdp::quantize_int8", range(0, scales.extent(0)), KOKKOS_LAMBDA(std::size_t b) {
    const std::size_t first = b * block, last = first + block < numel ? first + block : numel;
    Scalar absmax = 0;
    for (std::size_t i = first; i < last; ++i) {
      const Scalar magnitude = in(i) < 0 ? -in(i) : in(i);  // a NaN's is the NaN
      if (magnitude > absmax || magnitude != magnitude) absmax = magnitude;
    }
    const Scalar spread = absmax - absmax;  // 0 for a finite absmax, NaN for a NaN or an infinity
    const bool finite = spread == Scalar(0);
    const float scale = finite ? float(absmax / Scalar(127)) : float(spread);
    scales(b) = scale;
    for (std::size_t i = first; i < last; ++i) {
      if (!finite || scale == 0.0f) {  // (casting a NaN to int8 is undefined)
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

// One thread an element: its contributions read from every source's buffer, summed in rank order.
template <class Scalar>
void sum_dequantized_int8(Kokkos::View<const char*> wires, std::size_t sources, const int8_blocks& layout,
                          const int8_chunk& chunk, Scalar factor, Kokkos::View<Scalar*> out) {
  const std::size_t block = int8_blocks::block, stride = layout.bytes(), scales_at = layout.scales_offset();
  const std::size_t first_value = chunk.values.first, first_scale = chunk.scales.first;
  const char* const base = wires.data();
  Kokkos::parallel_for("kfsdp::sum_dequantized_int8", range(0, out.extent(0)), KOKKOS_LAMBDA(std::size_t i) {
    Scalar sum = 0;
    for (std::size_t s = 0; s < sources; ++s) {
      const char* wire = base + s * stride;
      const auto value = static_cast<std::int8_t>(wire[first_value + i]);
      const float scale = reinterpret_cast<const float*>(wire + scales_at)[first_scale + i / block];
      sum += Scalar(value) * Scalar(scale);
    }
    out(i) = sum * factor;
  });
}

#define KFSDP_QUANTIZE_INSTANTIATE(Scalar)                                                                \
  template void quantize_int8<Scalar>(Kokkos::View<const Scalar*>, Kokkos::View<std::int8_t*>,             \
                                      Kokkos::View<float*>);                                              \
  template void dequantize_int8<Scalar>(Kokkos::View<const std::int8_t*>, Kokkos::View<const float*>,      \
                                        std::size_t, Kokkos::View<Scalar*>);                      \
  template void sum_dequantized_int8<Scalar>(Kokkos::View<const char*>, std::size_t, const int8_blocks&,   \
                                             const int8_chunk&, Scalar, Kokkos::View<Scalar*>);
KFSDP_QUANTIZE_INSTANTIATE(float)
KFSDP_QUANTIZE_INSTANTIATE(double)

}  // namespace kfsdp::kernels
