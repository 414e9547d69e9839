#pragma once
// Shared by the engine tests: small models, the reference values of the deterministic initializer
// and helpers to read views back on the host.
#include <cstdint>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/model/layers.hpp>

namespace kfsdp::testing {

// Thunder's padding model: Linear(4,13) then Linear(13,1) — dim0 13 and 1 divide no world size > 1.
using thunder_padding = sequential<"", linear<"0", 4, 13>, linear<"1", 13, 1>>;
using tiny_gpt = gpt<2, 8, 5>;

inline param_init gpt_like_init(const param_info& p) {
  if (p.rank == 1) return {p.name.view().ends_with("weight") ? param_init::ones : param_init::zeros, 0.0};
  return {param_init::normal, 0.02};
}
inline param_init all_normal(const param_info&) { return {param_init::normal, 1.0}; }

template <class Scalar>
std::vector<Scalar> to_host(const Kokkos::View<Scalar*>& v) {
  std::vector<Scalar> out(v.extent(0));
  Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(out.data(), out.size());
  Kokkos::deep_copy(host, v);
  return out;
}

// What the initializer gives for the whole of parameter p (as one process would compute it).
template <class Scalar>
std::vector<Scalar> expected_init(const param_info& p, std::size_t index, std::uint64_t seed,
                                  param_init (*choose)(const param_info&)) {
  Kokkos::View<Scalar*> full("expected", p.numel);
  kernels::fill_init<Scalar>(full, p.numel, 0, seed, index, choose(p));
  return to_host(full);
}

}  // namespace kfsdp::testing
