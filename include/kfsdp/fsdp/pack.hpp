#pragma once
// The copies around a bucket's collectives (Kokkos kernels, instantiated in kernels/fsdp/pack.cpp).
//
// A bucket gathered as one collective is (world_size, S) row-major, S = the bucket's per-rank shard:
//   gathered = [ rank 0: p0 chunk 0 | p1 chunk 0 | ... ][ rank 1: p0 chunk 1 | p1 chunk 1 | ... ] ...
// The unpacked layout (shard_mapping.hpp) is parameter-major, each parameter padded:
//   unpacked = [ p0 chunk 0 | p0 chunk 1 | ... ][ p1 chunk 0 | p1 chunk 1 | ... ] ...
// The engine gathers each parameter into it directly; unpack_param / pack_param convert between
// the two where one collective carries the whole bucket (broadcast_from).
// Example: p = 13 rows of 4 at world size 3 (chunk 5 rows = 20 elements, padding 2 rows), p's
// chunk at offset off of S:
//   unpacked[3·off + 0 : +20] = gathered[0·S + off : +20], [3·off + 20 : +20] = gathered[1·S + off : +20],
//   [3·off + 40 : +12] = gathered[2·S + off : +12]   (the last 8 elements of rank 2's chunk are padding)
// Packing is the inverse (padding rows become zero).

#include <cstddef>
#include <cstdint>
#include <Kokkos_Core.hpp>

#include <kfsdp/meta/half.hpp>
#include <kfsdp/plan/shard_mapping.hpp>

namespace kfsdp::kernels {

template <class Scalar>
using flat_view = Kokkos::View<Scalar*>;

// unpacked[map.unpacked(p, r)] = gathered[map.gathered(p, r)][: its real elements], for every rank r
template <class Scalar>
void unpack_param(flat_view<const Scalar> gathered, const shard_mapping& map, std::size_t p, flat_view<Scalar> unpacked);

// The inverse, for every rank; the padding elements of p's chunks in `packed` become zero.
template <class Scalar>
void pack_param(flat_view<const Scalar> unpacked, const shard_mapping& map, std::size_t p, flat_view<Scalar> packed);

// destination[i] += scale · source[i]
template <class Scalar>
void accumulate_scaled(flat_view<Scalar> destination, flat_view<const Scalar> source, Scalar scale);

// Mixed precision (Wire = bf16 or f16, the type a collective carries; a double goes through float):
// out[i] = Wire(scale · in[i])
template <class Scalar, class Wire>
void to_wire(flat_view<const Scalar> in, Scalar scale, flat_view<Wire> out);
// out[i] = Scalar(in[i])
template <class Scalar, class Wire>
void from_wire(flat_view<const Wire> in, flat_view<Scalar> out);
// destination[i] += scale · Scalar(source[i])
template <class Scalar, class Wire>
void accumulate_wire_scaled(flat_view<Scalar> destination, flat_view<const Wire> source, Scalar scale);

// How a parameter starts: zeros, ones, normal(0, std), or uniform in [−std, std) (std is then the
// bound), from a counter-based generator keyed by (seed, parameter index, global element index) —
// the same weights at every world size.
struct param_init {
  enum kind_t : std::uint8_t { zeros, ones, normal, uniform } kind = zeros;  // append: values persist
  double std = 0.0;  // normal: the standard deviation; uniform: the bound
};

// out[k] = init value of global element first_global + k (k < count).
template <class Scalar>
void fill_init(flat_view<Scalar> out, std::size_t count, std::size_t first_global,
               std::uint64_t seed, std::size_t param_index, param_init init);

}  // namespace kfsdp::kernels

namespace kfsdp::kernels {
#define KFSDP_PACK_EXTERN(Scalar)                                                                    \
  extern template void unpack_param<Scalar>(flat_view<const Scalar>, const shard_mapping&, std::size_t,   \
                                            flat_view<Scalar>);                                      \
  extern template void pack_param<Scalar>(flat_view<const Scalar>, const shard_mapping&, std::size_t,     \
                                          flat_view<Scalar>);                                        \
  extern template void accumulate_scaled<Scalar>(flat_view<Scalar>, flat_view<const Scalar>, Scalar); \
  extern template void fill_init<Scalar>(flat_view<Scalar>, std::size_t, std::size_t, std::uint64_t, \
                                         std::size_t, param_init);
KFSDP_PACK_EXTERN(float)
KFSDP_PACK_EXTERN(double)
#undef KFSDP_PACK_EXTERN
#define KFSDP_WIRE_EXTERN(Scalar, Wire)                                                                           \
  extern template void to_wire<Scalar, Wire>(flat_view<const Scalar>, Scalar, flat_view<Wire>);                     \
  extern template void from_wire<Scalar, Wire>(flat_view<const Wire>, flat_view<Scalar>);                          \
  extern template void accumulate_wire_scaled<Scalar, Wire>(flat_view<Scalar>, flat_view<const Wire>, Scalar);
KFSDP_WIRE_EXTERN(float, bf16)
KFSDP_WIRE_EXTERN(float, f16)
KFSDP_WIRE_EXTERN(double, bf16)
KFSDP_WIRE_EXTERN(double, f16)
#undef KFSDP_WIRE_EXTERN
}  // namespace kfsdp::kernels
