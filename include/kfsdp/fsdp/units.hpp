#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// FSDP units: the groups of parameters that are gathered, used and freed together (FSDP2's
// fully_shard modules), decided once (assign_units) on the model's graph (model/model_graph.hpp)
// by a wrap policy; the FSDP engine's units and the network's unit nodes both read that.
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
// Units are numbered in forward order; a bucket must lie in one unit (block or layer bucketing
// with the blocks policy, none or layer bucketing with the layers policy).

#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include <fmt/format.h>

#include <kfsdp/meta/enum_names.hpp>
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/plan/shard_plan.hpp>

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

struct fsdp_unit {
  std::string name;                  // "root", or the longest dotted prefix its parameters share
  std::vector<std::size_t> params;   // in model order
  std::vector<std::size_t> buckets;  // in order
};

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

inline unit_assignment assign_units(const model_graph& graph, const wrap_options& wrap) {
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

namespace detail {
// "transformer.h.0" for transformer.h.0.ln_1.weight ... transformer.h.0.mlp.c_proj.bias.
inline std::string common_prefix(std::string_view a, std::string_view b) {
  std::size_t n = 0, last_dot = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) {
    if (a[n] == '.') last_dot = n;
    ++n;
  }
  if (n == a.size() && n == b.size()) return std::string(a.substr(0, a.rfind('.')));
  if ((n == a.size() && b[n] == '.') || (n == b.size() && a[n] == '.')) return std::string(a.substr(0, n));
  return std::string(a.substr(0, last_dot));
}
}  // namespace detail

// The units of a model's graph and plan; throws naming the bucket whose parameters lie in two units.
KFSDP_EXPORT template <class Plan>
std::vector<fsdp_unit> make_units(const model_graph& graph, const Plan& plan, const wrap_options& wrap) {
  const std::span<const param_info> table = graph.params;
  const unit_assignment assigned = assign_units(graph, wrap);
  const std::vector<std::size_t>& unit = assigned.of_param;
  std::vector<fsdp_unit> units(assigned.count());
  for (std::size_t p = 0; p < table.size(); ++p) units[unit[p]].params.push_back(p);
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    const auto& bucket = plan.buckets[b];
    const std::size_t first = bucket.first_param, last = first + bucket.param_count - 1;
    for (std::size_t p = first; p <= last; ++p)
      if (unit[p] != unit[first])
        throw std::invalid_argument("kfsdp: bucket " + std::to_string(b) + " holds '" +
                                    std::string(table[first].name.view()) + "' (unit " + std::to_string(unit[first]) +
                                    ") and '" + std::string(table[p].name.view()) + "' (unit " +
                                    std::to_string(unit[p]) + "); with wrap policy " +
                                    std::string(to_string(assigned.policy)) +
                                    " choose a bucketing whose buckets lie in one unit");
    units[unit[first]].buckets.push_back(b);
  }
  for (std::size_t u = 0; u < units.size(); ++u) {
    fsdp_unit& x = units[u];
    if (u == 0) {
      x.name = "root";
    } else if (!x.params.empty()) {
      x.name = detail::common_prefix(table[x.params.front()].name.view(), table[x.params.back()].name.view());
      if (x.name.empty()) x.name = "unit " + std::to_string(u);
    }
  }
  return units;
}

// One line per unit: its name, parameters, buckets and the bytes it gathers (all ranks' chunks).
//   unit 0 root: 5 params in buckets 0, 1, 26, 27, gathers 0.53 MiB
KFSDP_EXPORT template <class Plan>
std::string units_table(std::span<const fsdp_unit> units, const Plan& plan, std::size_t element_bytes) {
  std::string out;
  for (std::size_t u = 0; u < units.size(); ++u) {
    std::size_t gathered = 0;
    std::string buckets;
    for (std::size_t b : units[u].buckets) {
      gathered += plan.gathered_numel(b) * element_bytes;
      buckets += (buckets.empty() ? "" : ", ") + std::to_string(b);
    }
    out += fmt::format("unit {} {}: {} params in buckets {}, gathers {:.2f} MiB\n", u, units[u].name, units[u].params.size(),
                       buckets.empty() ? "(none)" : buckets, double(gathered) / (1024.0 * 1024.0));
  }
  return out;
}

}  // namespace kfsdp
