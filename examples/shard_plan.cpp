// shard_plan — prints how kfsdp shards the example GPT over a number of ranks.
//
//   build/examples/shard_plan --world-size 3 --bucketing layer
//
// One row per parameter (full shape, chunk rows, padding rows, bucket, bytes per rank), then the
// totals, one line per bucket and one per FSDP unit (each block; the rest is the root). No MPI needed: the plan is a pure function of the model, the
// world size and the bucketing.

#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/model/param_table.hpp>
#include <kfsdp/plan/format.hpp>
#include <kfsdp/plan/shard_plan.hpp>

#include "cli.hpp"

int main(int argc, char** argv) try {
  kfsdp::examples::cli cli("shard_plan", "print the shard plan of the example GPT");
  cli.flag("world-size", "3", "number of ranks the model is sharded over")
      .flag("bucketing", "layer", "none | layer | block")
      .flag("layers", "4", "transformer blocks")
      .flag("dim", "128", "embedding width")
      .flag("seq", "64", "context length (rows of wpe)")
      .flag("dtype", "f32", "f32 | f64 (bytes per element)")
      .flag("wrap", "auto", "auto (blocks; layers for a model without blocks) | blocks (each block a unit) | layers (each layer a unit)")
      .flag("tie-weights", "off", "on: lm_head.weight is transformer.wte.weight | off");
  if (!cli.parse(argc, argv)) return 0;

  const auto model = kfsdp::make_gpt({.layers = cli.size("layers"), .dim = cli.size("dim"),
                                      .heads = 1, .seq = cli.size("seq"),
                                      .tie_weights = cli.choice("tie-weights", {"on", "off"}) == "on"});
  const auto graph = kfsdp::make_model_graph(model);
  const auto& table = graph.params;
  const auto plan = kfsdp::make_shard_plan(table, cli.size("world-size"),
                                           kfsdp::parse_bucketing(cli.str("bucketing")));
  const std::string dtype = cli.str("dtype");
  if (dtype != "f32" && dtype != "f64")
    throw std::invalid_argument("shard_plan: --dtype is '" + dtype + "', expected f32 or f64");

  fmt::print("example GPT (layers={}, dim={}, seq={}, vocab=256), {}\n", cli.size("layers"),
             cli.size("dim"), cli.size("seq"), dtype);
  fmt::print("{}", kfsdp::plan_table(plan, table, dtype == "f32" ? 4 : 8));
  const auto units = kfsdp::make_units(graph, plan, {.policy = kfsdp::parse_wrap_policy(cli.str("wrap"))});
  fmt::print("{}", kfsdp::units_table(units, plan, dtype == "f32" ? 4 : 8));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}
