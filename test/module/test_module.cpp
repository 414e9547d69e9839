// `import kfsdp;` gives the same plans and the same training as the headers, and leaks no macro.
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

import kfsdp;

#if defined(KFSDP_EXPORT) || defined(KFSDP_MODULE_MPI)
#error "a kfsdp macro leaked out of the module"
#endif
#if defined(FMT_VERSION) || defined(KOKKOS_VERSION) || defined(MPI_VERSION)
#error "a macro of fmt, Kokkos or MPI leaked out of the module"
#endif

#include <fmt/format.h>  // not re-exported by the module: a program that formats includes it

#include "mlp.hpp"

std::vector<double> header_mlp_losses();
std::size_t shard_numel_imported_and_included();
std::uint64_t header_plan_fingerprint(std::size_t world_size, int strategy);
std::size_t header_plan_shard_numel(std::size_t world_size, int strategy);

using tiny = kfsdp::gpt<2, 24, 10>;
static_assert(kfsdp::param_table<tiny>.size() == 29);
static_assert(kfsdp::static_shard_plan<tiny, 3, kfsdp::bucketing::block>.buckets.size() == 6);
// The README's spelling of a state dict's dtype, and the safetensors one: one type.
static_assert(kfsdp::dtype::F32 == kfsdp::io::dtype_of<float>);

TEST_CASE("the module computes the plans the headers compute") {
  for (std::size_t ws = 1; ws <= 8; ++ws)
    for (kfsdp::bucketing b : {kfsdp::bucketing::none, kfsdp::bucketing::layer, kfsdp::bucketing::block}) {
      const auto plan = kfsdp::make_shard_plan(kfsdp::param_table<tiny>, ws, b);
      CHECK(kfsdp::fingerprint(plan) == header_plan_fingerprint(ws, static_cast<int>(b)));
      CHECK(plan.shard_numel == header_plan_shard_numel(ws, static_cast<int>(b)));
    }
}

TEST_CASE("the module's communicator concept and one-rank backend") {
  static_assert(kfsdp::comm::communicator<kfsdp::comm::self>);
  kfsdp::comm::self one;
  std::vector<float> shard{1, 2}, full(2);
  kfsdp::comm::all_gather(one, std::span<const float>(shard), std::span(full));
  CHECK(full == shard);
  kfsdp::comm::check_agreement(one, 42, "a constant");
}

TEST_CASE("the module's run-time descriptors, errors and formatter work") {
  const auto table = kfsdp::make_param_table(kfsdp::make_gpt({.layers = 2, .dim = 24, .heads = 2, .seq = 10}));
  CHECK(table[4].name.view() == "transformer.h.0.attn.c_attn.weight");
  const auto plan = kfsdp::make_shard_plan(table, 3, kfsdp::bucketing::layer);
  const std::string text = fmt::format("{}", plan);
  CHECK(text.starts_with("shard_plan(world_size=3, bucketing=layer): 29 params in 16 buckets"));
  CHECK_THROWS_WITH(kfsdp::make_shard_plan(table, 0, kfsdp::bucketing::layer),
                    "kfsdp::make_shard_plan: world_size is 0, expected at least 1");
}

TEST_CASE("the module trains an MLP as the headers do, and a file may both import and include") {
  const kfsdp::environment kokkos_up;
  const std::vector<double> imported = kfsdp_module_test::train_mlp();
  CHECK(imported.size() == 3);
  CHECK(imported == header_mlp_losses());  // the same compiler, the same kernels: the same bits
  CHECK(shard_numel_imported_and_included() == header_plan_shard_numel(3, static_cast<int>(kfsdp::bucketing::block)));
}
