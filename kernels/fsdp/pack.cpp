// Pack/unpack around a bucket's collectives, scaled accumulation, deterministic initialisation.
// Build: part of the kfsdp library; checked by test/fsdp/test_pack.cpp.
#include <algorithm>
#include <cmath>

#include <KokkosBlas1_axpby.hpp>

#include <kfsdp/detail/kokkos_math.hpp>
#include <kfsdp/fsdp/pack.hpp>

namespace kfsdp::kernels {

using range = Kokkos::RangePolicy<Kokkos::IndexType<std::size_t>>;

// Each rank's chunk is contiguous in both buffers: one contiguous copy per rank (a memcpy on the
// host, a device copy on GPUs) instead of a division per element.
template <class Scalar>
void unpack_param(flat_view<const Scalar> gathered, const shard_mapping& map, std::size_t p, flat_view<Scalar> unpacked) {
  for (std::size_t rank = 0; rank < map.world_size(); ++rank) {
    const index_range to = map.unpacked(p, rank);
    if (to.count == 0) break;  // this rank and the later ones hold only padding
    const std::size_t from = map.gathered(p, rank).first;
    Kokkos::deep_copy(Kokkos::subview(unpacked, to.pair()), Kokkos::subview(gathered, std::make_pair(from, from + to.count)));
  }
}

template <class Scalar>
void pack_param(flat_view<const Scalar> unpacked, const shard_mapping& map, std::size_t p, flat_view<Scalar> packed) {
  for (std::size_t rank = 0; rank < map.world_size(); ++rank) {
    const index_range from = map.unpacked(p, rank);
    const index_range to = map.gathered(p, rank);
    if (from.count > 0)
      Kokkos::deep_copy(Kokkos::subview(packed, std::make_pair(to.first, to.first + from.count)),
                        Kokkos::subview(unpacked, from.pair()));
    if (from.count < to.count)  // padding rows travel as zeros
      Kokkos::deep_copy(Kokkos::subview(packed, std::make_pair(to.first + from.count, to.last())), Scalar(0));
  }
}

template <class Scalar>
void accumulate_scaled(flat_view<Scalar> destination, flat_view<const Scalar> source, Scalar scale) {
  KokkosBlas::axpy(scale, source, destination);  // destination += scale · source
}

template <class Scalar, class Wire>
void to_wire(flat_view<const Scalar> in, Scalar scale, flat_view<Wire> out) {
  Kokkos::parallel_for("kfsdp::to_wire", range(0, in.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { out(i) = Wire(float(scale * in(i))); });
}

template <class Scalar, class Wire>
void from_wire(flat_view<const Wire> in, flat_view<Scalar> out) {
  Kokkos::parallel_for("kfsdp::from_wire", range(0, in.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { out(i) = Scalar(float(in(i))); });
}

template <class Scalar, class Wire>
void accumulate_wire_scaled(flat_view<Scalar> destination, flat_view<const Wire> source, Scalar scale) {
  Kokkos::parallel_for("kfsdp::accumulate_wire_scaled", range(0, destination.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { destination(i) += scale * Scalar(float(source(i))); });
}

namespace {
// splitmix64: a counter-based generator, so element i's value needs no state but its key.
KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// A uniform in (0, 1): 53 random bits, offset by half a step so that log() never sees 0.
KOKKOS_INLINE_FUNCTION double uniform01(std::uint64_t bits) {
  return (double(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
}  // namespace

template <class Scalar>
void fill_init(flat_view<Scalar> out, std::size_t count, std::size_t first_global, std::uint64_t seed,
               std::size_t param_index, param_init init) {
  const std::uint64_t key = mix64(seed ^ mix64(0x6b667364ull + param_index));
  Kokkos::parallel_for("kfsdp::fill_init", range(0, count), KOKKOS_LAMBDA(std::size_t k) {
    Scalar value = init.kind == param_init::ones ? Scalar(1) : Scalar(0);
    if (init.kind == param_init::normal) {
      const std::uint64_t g = first_global + k;
      const double u1 = uniform01(mix64(key ^ (2 * g)));
      const double u2 = uniform01(mix64(key ^ (2 * g + 1)));
      // Box-Muller: one standard normal from two uniforms.
      value = Scalar(init.std * math::sqrt(-2.0 * math::log(u1)) *
                     math::cos(6.283185307179586 * u2));
    } else if (init.kind == param_init::uniform) {
      // The first of normal's two uniforms, stretched from (0, 1) onto (−bound, bound).
      const std::uint64_t g = first_global + k;
      value = Scalar(init.std * (2.0 * uniform01(mix64(key ^ (2 * g))) - 1.0));
    }
    out(k) = value;
  });
}

#define KFSDP_PACK_INSTANTIATE(Scalar)                                                        \
  template void unpack_param<Scalar>(flat_view<const Scalar>, const shard_mapping&, std::size_t, \
                                     flat_view<Scalar>);                                         \
  template void pack_param<Scalar>(flat_view<const Scalar>, const shard_mapping&, std::size_t,   \
                                   flat_view<Scalar>);                                           \
  template void accumulate_scaled<Scalar>(flat_view<Scalar>, flat_view<const Scalar>, Scalar); \
  template void fill_init<Scalar>(flat_view<Scalar>, std::size_t, std::size_t, std::uint64_t, \
                                  std::size_t, param_init);
KFSDP_PACK_INSTANTIATE(float)
KFSDP_PACK_INSTANTIATE(double)

#define KFSDP_WIRE_INSTANTIATE(Scalar, Wire)                                                               \
  template void to_wire<Scalar, Wire>(flat_view<const Scalar>, Scalar, flat_view<Wire>);                     \
  template void from_wire<Scalar, Wire>(flat_view<const Wire>, flat_view<Scalar>);                          \
  template void accumulate_wire_scaled<Scalar, Wire>(flat_view<Scalar>, flat_view<const Wire>, Scalar);
KFSDP_WIRE_INSTANTIATE(float, bf16)
KFSDP_WIRE_INSTANTIATE(float, f16)
KFSDP_WIRE_INSTANTIATE(double, bf16)
KFSDP_WIRE_INSTANTIATE(double, f16)

}  // namespace kfsdp::kernels
