// The header build of the same plans the module test computes, compiled without `import`.
#include <cstdint>

#include <kfsdp/model/gpt.hpp>
#include <kfsdp/plan/shard_plan.hpp>

std::uint64_t header_plan_fingerprint(std::size_t world_size, int strategy) {
  return kfsdp::fingerprint(kfsdp::make_shard_plan(kfsdp::param_table<kfsdp::gpt<2, 24, 10>>, world_size,
                                                   static_cast<kfsdp::bucketing>(strategy)));
}
std::size_t header_plan_shard_numel(std::size_t world_size, int strategy) {
  return kfsdp::make_shard_plan(kfsdp::param_table<kfsdp::gpt<2, 24, 10>>, world_size,
                                static_cast<kfsdp::bucketing>(strategy))
      .shard_numel;
}
