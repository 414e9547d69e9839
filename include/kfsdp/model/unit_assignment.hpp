#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Units: the groups of parameters that are gathered, used and freed together (FSDP2's
// fully_shard modules), decided once (assign_units) on the model's graph (model/model_graph.hpp)
// by a wrap policy. The compute (compute/network.hpp) reads which nodes are units; FSDP
// (fsdp/units.hpp) adds each unit's buckets.
//
//   wrap_policy::automatic (default): blocks for a model with blocks (or repeats), layers for one
//     without, so that ZeRO3 frees the parameters of any model between their uses.
//   wrap_policy::blocks: each block, and each copy of a repeat, is one unit (or blocks_per_unit
//     consecutive ones); every parameter outside them is the root unit 0, gathered first and kept
//     until the end of backward.
//   wrap_policy::layers: every leaf layer with parameters is a unit; the root unit is empty.
//
// For the example GPT with 2 blocks, wrap_policy::blocks (and automatic):
//   unit 0 "root"            transformer.wte, transformer.wpe, transformer.ln_f, lm_head
//   unit 1 "transformer.h.0" its 12 parameters
//   unit 2 "transformer.h.1" its 12 parameters
// Units are numbered in forward order.

#include <atomic>
#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <kfsdp/meta/enum_names.hpp>
#include <kfsdp/model/model_graph.hpp>

namespace kfsdp {

KFSDP_EXPORT enum class wrap_policy { blocks, layers, automatic };

inline constexpr enum_names<wrap_policy, 3> wrap_policy_names = {
    {wrap_policy::automatic, "auto"}, {wrap_policy::blocks, "blocks"}, {wrap_policy::layers, "layers"}};
KFSDP_EXPORT constexpr std::string_view to_string(wrap_policy w) noexcept { return name_of(wrap_policy_names, w); }
KFSDP_EXPORT inline wrap_policy parse_wrap_policy(std::string_view text) {
  return parse_named(text, wrap_policy_names, "wrap policy");
}

struct wrap_options {
  wrap_policy policy = wrap_policy::automatic;
  std::size_t blocks_per_unit = 1;  // with blocks (automatic on a model with blocks): this many consecutive blocks form a unit
};

// The policy `policy` applies to a model's table: automatic is blocks where a parameter lies in a
// block (or a copy of a repeat), else layers.
inline wrap_policy applied_policy(std::span<const param_info> table, wrap_policy policy) {
  if (policy != wrap_policy::automatic) return policy;
  for (const param_info& p : table)
    if (p.in_block()) return wrap_policy::blocks;
  return wrap_policy::layers;
}

// A graph node that is no unit.
inline constexpr std::size_t no_unit = std::numeric_limits<std::size_t>::max();


// Which graph nodes are units, and the unit of every parameter: the one place unit membership is decided.
//   blocks: a node that opens a block (a block, or a repeat copy, outside every block) and owns
//           parameters is unit 1 + block / blocks_per_unit; its parameters are that unit's, the rest the root's (0).
//   layers: a layer that owns parameters is unit 1 + its layer index.
// For the GPT above with blocks: node "transformer.h.0" is unit 1, "transformer.h.1" unit 2, and
// every other node no_unit (runs_in: 0 outside the blocks, 1 or 2 within them).
struct unit_assignment {
  wrap_policy policy = wrap_policy::blocks;  // as applied: automatic resolved
  std::vector<std::size_t> of_param;         // the unit of each table row (0: the root)
  std::vector<std::size_t> of_node;          // the unit each graph node is, or no_unit
  std::vector<std::size_t> runs_in;          // the unit each node's compute runs in: its own, its nearest unit ancestor's, or 0

  [[nodiscard]] std::size_t count() const {
    std::size_t n = 1;
    for (std::size_t u : of_param) n = u + 1 > n ? u + 1 : n;
    return n;
  }
};

namespace detail {
// Assignments made in this process: kfsdp's tests check that a trainer assigns its units once.
inline std::atomic<std::size_t> unit_assignments_made{0};
}  // namespace detail

inline unit_assignment assign_units(const model_graph& graph, const wrap_options& wrap) {
  detail::unit_assignments_made.fetch_add(1, std::memory_order_relaxed);
  if (wrap.blocks_per_unit == 0) throw std::invalid_argument("kfsdp: blocks_per_unit is 0, expected at least 1");
  unit_assignment units;
  units.policy = applied_policy(graph.params, wrap.policy);
  units.of_param.assign(graph.params.size(), 0);
  units.of_node.assign(graph.nodes.size(), no_unit);
  units.runs_in.assign(graph.nodes.size(), 0);
  for (std::size_t n = 0; n < graph.nodes.size(); ++n) {  // walk order: a parent before its children
    const model_node& node = graph.nodes[n];
    if (node.parent != no_node) units.runs_in[n] = units.runs_in[node.parent];
    if (!node.owns_params()) continue;
    if (units.policy == wrap_policy::layers && node.layer != model_node::none) units.of_node[n] = 1 + node.layer;
    if (units.policy == wrap_policy::blocks && node.block != no_block) units.of_node[n] = 1 + node.block / wrap.blocks_per_unit;
    if (units.of_node[n] == no_unit) continue;
    units.runs_in[n] = units.of_node[n];
    for (std::size_t p = node.first_param; p < node.end_param; ++p) units.of_param[p] = units.of_node[n];
  }
  return units;
}

}  // namespace kfsdp
