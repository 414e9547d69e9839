// A program may both import kfsdp and include its headers: the headers' entities are attached to
// the global module, so the two declarations of each are one entity.
import kfsdp;

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/plan/shard_plan.hpp>

std::size_t shard_numel_imported_and_included() {
  // make_gpt and make_shard_plan as the header declares them, the plan type as the module exports it.
  const kfsdp::shard_plan plan = kfsdp::make_shard_plan(
      kfsdp::make_param_table(kfsdp::make_gpt({.layers = 2, .dim = 24, .heads = 2, .seq = 10})), 3, kfsdp::bucketing::block);
  static_assert(sizeof(kfsdp::memory_report) > 0);
  return plan.shard_numel;
}
