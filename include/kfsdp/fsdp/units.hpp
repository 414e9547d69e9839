#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// FSDP units: the units of model/unit_assignment.hpp with the buckets of the shard plan that each
// gathers and reduces (a bucket must lie in one unit: block or layer bucketing with the blocks
// policy, none or layer bucketing with the layers policy).
//
// For the example GPT with 2 blocks and block bucketing:
//   unit 0 "root"            its 4 parameters' buckets
//   unit 1 "transformer.h.0" the bucket of block 0
//   unit 2 "transformer.h.1" the bucket of block 1

#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include <fmt/format.h>

#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/model/unit_assignment.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

struct fsdp_unit {
  std::string name;                  // "root", or the longest dotted prefix its parameters share
  std::vector<std::size_t> params;   // in model order
  std::vector<std::size_t> buckets;  // in order
};

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

// The units of a model's graph as assigned, with the plan's buckets; throws naming the bucket
// whose parameters lie in two units.
KFSDP_EXPORT template <class Plan>
std::vector<fsdp_unit> make_units(const model_graph& graph, const unit_assignment& assigned, const Plan& plan) {
  const std::span<const param_info> table = graph.params;
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
// The same, assigning the units by `wrap` first.
KFSDP_EXPORT template <class Plan>
std::vector<fsdp_unit> make_units(const model_graph& graph, const Plan& plan, const wrap_options& wrap) {
  return make_units(graph, assign_units(graph, wrap), plan);
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
