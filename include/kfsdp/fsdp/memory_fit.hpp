#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Whether a model fits before anything is allocated: the bytes one rank will hold, from the shard
// plan alone, against the memory this rank may use. A model that cannot fit stops with the figures
// instead of a raw allocation failure (or the kernel's OOM killer) minutes into a run.
//
//   const auto need = kfsdp::estimate_memory(plan, kfsdp::make_units(graph, plan, options.wrap), sizeof(float),
//                                            2 /*AdamW*/, options, activation_bytes);
//   if (need.total() > kfsdp::available_host_memory() / ranks_on_node) throw ... kfsdp::describe(need) ...
//
// Worked example: 2 ranks, one unit of one bucket of two parameters, 3×2 (2 rows per rank, rank 1's
// second one padding) and 2 (1 element per rank): shard_numel 5; f32, AdamW, zero2:
//   params 5·4 = 20 B, grads 20 B, optimizer 2·20 = 40 B, unsharded: the gathered model 2·5·4 =
//   40 B + the bucket's gathered copy while unpacking 40 B + two units' gradients 2·40 = 80 B
//   (with overlap_reduce_scatter off).
// Figures are doubles: an absurd size gives a huge estimate, never a wrapped small one.

#include <cstddef>
#include <span>
#include <string>
#include <fmt/format.h>

#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/meta/host_memory.hpp>  // available_host_memory, require_host_memory, format_bytes
#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

// Bytes one rank needs at its peak, by kind.
KFSDP_EXPORT struct memory_need {
  double params = 0;       // the rank's flat parameter shard
  double grads = 0;        // its flat gradient shard
  double optimizer = 0;    // optimizer states, each the shard's size
  double unsharded = 0;    // peak of gathered parameters and full / packed gradients
  double activations = 0;  // what the caller's layers keep for backward (the caller's estimate)
  [[nodiscard]] constexpr double total() const noexcept { return params + grads + optimizer + unsharded + activations; }
};

// The plan's bytes per rank, its FSDP units gathered as the engine does. Unsharded peak:
// zero2 keeps the whole gathered model through backward, zero3 the root unit and two others (the
// one computing and the one prefetched); a bucket being unpacked holds its gathered copy too; the
// gradients of two units are alive at once (one accumulating, one packed and reduce-scattering),
// three with options.overlap_reduce_scatter. Measured against the engine for the example GPT
// (zero2/zero3 × none/block bucketing, 1 and 3 ranks): 1.03-1.31 times its unsharded peak.
KFSDP_EXPORT template <class Params, class Buckets>
[[nodiscard]] constexpr memory_need estimate_memory(const basic_shard_plan<Params, Buckets>& plan,
                                                    std::span<const fsdp_unit> units, std::size_t scalar_bytes,
                                                    std::size_t optimizer_states, const fsdp_options& options,
                                                    double activation_bytes = 0) {
  const double s = double(scalar_bytes), shard = double(plan.shard_numel) * s;
  double root = 0, unit = 0;  // gathered bytes of the root unit and of the largest other one
  for (std::size_t u = 0; u < units.size(); ++u) {
    double gathered = 0;
    for (std::size_t b : units[u].buckets) gathered += double(plan.gathered_numel(b)) * s;
    if (u == 0) root = gathered;
    else unit = gathered > unit ? gathered : unit;
  }
  const double model = double(plan.world_size) * shard, largest = root > unit ? root : unit;
  memory_need need;
  need.params = shard;
  need.grads = shard;
  need.optimizer = double(optimizer_states) * shard;
  const double gathered_params = options.sharding() == sharding_strategy::zero2 ? model : root + 2 * unit;
  const double grad_units = options.overlap_reduce_scatter ? 3 : 2;  // one more behind the next backward
  need.unsharded = gathered_params + double(plan.max_gathered_numel()) * s + grad_units * largest;
  need.activations = activation_bytes;
  return need;
}

// "4.00 GiB (params 1.00 GiB, grads 1.00 GiB, optimizer 2.00 GiB, unsharded 0 B, activations 0 B)".
KFSDP_EXPORT inline std::string describe(const memory_need& need) {
  return fmt::format("{} (params {}, grads {}, optimizer {}, unsharded peak {}, activations {})", format_bytes(need.total()),
                     format_bytes(need.params), format_bytes(need.grads), format_bytes(need.optimizer),
                     format_bytes(need.unsharded), format_bytes(need.activations));
}

// The coarse figure from a parameter count alone, before any descriptor, graph or table is built
// (where absurd sizes would already fail): one rank's shard of the parameters, their gradients and
// the optimizer's states. Doubles: a count of 1e18 stays 1e18.
//   estimate_sharded_memory(7e9, 2, 2, 8)  ->  params 1.75 GB, grads 1.75 GB, optimizer 3.5 GB
KFSDP_EXPORT constexpr memory_need estimate_sharded_memory(double parameters, std::size_t scalar_bytes,
                                                           std::size_t optimizer_states, std::size_t shard_ranks) {
  const double shard = parameters * double(scalar_bytes) / double(shard_ranks == 0 ? 1 : shard_ranks);
  return {.params = shard, .grads = shard, .optimizer = double(optimizer_states) * shard};
}

}  // namespace kfsdp
