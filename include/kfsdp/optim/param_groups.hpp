#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::optim parameter groups — which elements of a rank's flat shard get which lr scale and
// weight decay, from the shard plan (each parameter's local chunk is one contiguous range of the
// shard, at the same offset on every rank).
//
// The default rule is nanoGPT's and Llama's: parameters of 2 or more dimensions (linear weights,
// embeddings) decay at the optimizer's weight_decay, 1-D ones (biases, norm gains) do not. Groups
// chosen by name override it; the first group that selects a parameter wins.
//
//   kfsdp::optim::adamw<float> adam(trainer, {.lr = 6e-4, .weight_decay = 0.1},
//                                   {{.name_contains = "wte", .lr_scale = 0.0}});   // embeddings frozen
//
// A frozen group (fine-tuning part of a model: FSDP2's requires_grad=False) is never updated and
// holds no optimizer state; an optimizer built from a trainer also freezes it in the engine, so
// that its gradients are not reduce-scattered either:
//
//   kfsdp::optim::adamw<float> adam(trainer, {.lr = 1e-4}, {{.name_contains = "transformer.h.0.", .frozen = true}});
//
// A LoRA fine-tune freezes everything but the adapters (model/lora_config.hpp):
//
//   kfsdp::optim::adamw<float> adam(trainer, {.lr = 1e-4}, {kfsdp::optim::lora_frozen_base()});
//
// Each distinct (lr scale, weight decay) pair is one group id; the shard holds one byte per element
// saying which, so the fused kernel reads a byte more per element and launches once.

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <kfsdp/model/lora_config.hpp>
#include <kfsdp/model/param_table.hpp>
#include <kfsdp/plan/shard_plan.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kfsdp::optim {

/// Distinct (lr scale, weight decay) pairs one shard may hold (the kernel keeps them in registers).
inline constexpr std::size_t max_param_groups = 16;

/// Parameters chosen by name (or by a predicate on their param_info), with their own lr scale and
/// weight decay.
///
///   kfsdp::optim::param_group{.name_contains = "ln_", .lr_scale = 0.5}
///   kfsdp::optim::param_group{.select = [](const kfsdp::param_info& p) { return p.in_block(); }, .weight_decay = 0.0}
struct param_group {
  std::string name_contains{};                     // parameters whose dotted name contains this
  std::function<bool(const param_info&)> select{}; // or those for which this is true
  double lr_scale = 1.0;                          // lr = optimizer's lr · lr_scale
  std::optional<double> weight_decay{};            // unset: the default rule (2-D and up decay, 1-D not)
  bool frozen = false;                             // never updated, no optimizer state, no gradient reduction
};

/// The group of a LoRA fine-tune: every parameter but the adapters (is_lora_adapter), frozen.
KFSDP_EXPORT inline param_group lora_frozen_base() {
  return {.select = [](const param_info& p) { return !is_lora_adapter(p.name.view()); }, .frozen = true};
}

/// A run of a rank's flat shard whose parameters are not frozen, and where it sits in the
/// optimizer's state (which holds these runs back to back).
struct state_segment {
  std::size_t first = 0;        // offset in the flat shard
  std::size_t count = 0;        // elements
  std::size_t state_first = 0;  // offset in the optimizer's state
};

/// Per element of a rank's flat shard: its group id; per group id: its lr scale and weight decay.
struct param_group_layout {
  Kokkos::View<std::uint8_t*> group_of;  // shard_numel elements; padding rows are in their parameter's group
  std::vector<double> lr_scale;          // per group id
  std::vector<double> weight_decay;      // per group id
  std::vector<std::size_t> group_of_param;  // per parameter of the table, its group id
  std::vector<std::uint8_t> frozen_param{};  // per parameter of the table: 1 where frozen
  std::vector<state_segment> trained{};      // the shard's runs that are not frozen; empty when none is frozen
  std::size_t frozen_numel = 0;              // elements of the shard in frozen parameters
  [[nodiscard]] bool any_frozen() const noexcept { return frozen_numel > 0; }
};

/// The layout for a shard plan of `params` at the optimizer's `weight_decay`; parameters where
/// `frozen` (per parameter, e.g. the engine's) is 1 are frozen as if a frozen group selected them.
/// Throws std::invalid_argument for a group that selects nothing by construction or no parameter at all,
/// a negative or non-finite lr_scale or weight_decay, or more than max_param_groups distinct pairs.
///
///   auto layout = kfsdp::optim::make_param_groups(engine.params(), engine.plan(), 0.1, groups);
inline param_group_layout make_param_groups(std::span<const param_info> params, const shard_plan& plan,
                                            double weight_decay, std::span<const param_group> groups = {},
                                            std::span<const std::uint8_t> frozen = {}) {
  if (params.size() != plan.params.size())
    throw std::invalid_argument(fmt::format("make_param_groups: params has {} parameters, expected the plan's {}",
                                            params.size(), plan.params.size()));
  if (!frozen.empty() && frozen.size() != params.size())
    throw std::invalid_argument(fmt::format("make_param_groups: frozen has {} entries, expected one per parameter ({})",
                                            frozen.size(), params.size()));
  auto check_factor = [](std::size_t g, const char* name, double value) {
    // Negated comparison so that NaN is rejected too.
    if (!(value >= 0.0) || std::isinf(value))
      throw std::invalid_argument(
          fmt::format("make_param_groups: group {}: {} = {}, expected a finite {} >= 0", g, name, value, name));
  };
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].name_contains.empty() && !groups[g].select)
      throw std::invalid_argument(fmt::format(
          "make_param_groups: group {}: name_contains is empty and select is unset, expected one of them", g));
    check_factor(g, "lr_scale", groups[g].lr_scale);
    if (groups[g].weight_decay) check_factor(g, "weight_decay", *groups[g].weight_decay);
  }

  param_group_layout layout;
  std::vector<std::size_t> selected(groups.size(), 0);
  for (std::size_t index = 0; index < params.size(); ++index) {
    const param_info& p = params[index];
    double lr_scale = 1.0;
    double decay = p.rank >= 2 ? weight_decay : 0.0;
    bool is_frozen = !frozen.empty() && frozen[index] != 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const bool by_name = !groups[g].name_contains.empty() &&
                           p.name.view().find(groups[g].name_contains) != std::string_view::npos;
      if (!by_name && !(groups[g].select && groups[g].select(p))) continue;
      ++selected[g];
      lr_scale = groups[g].lr_scale;
      if (groups[g].weight_decay) decay = *groups[g].weight_decay;
      is_frozen = is_frozen || groups[g].frozen;
      break;
    }
    layout.frozen_param.push_back(is_frozen ? 1 : 0);
    // A frozen parameter is never stepped: it takes group 0's id rather than a pair of its own.
    if (is_frozen) {
      layout.group_of_param.push_back(0);
      continue;
    }
    std::size_t id = 0;
    while (id < layout.lr_scale.size() && !(layout.lr_scale[id] == lr_scale && layout.weight_decay[id] == decay)) ++id;
    if (id == layout.lr_scale.size()) {
      if (id == max_param_groups)
        throw std::invalid_argument(fmt::format(
            "make_param_groups: parameter '{}' makes {} distinct (lr_scale, weight_decay) pairs, expected at most {}",
            p.name.view(), id + 1, max_param_groups));
      layout.lr_scale.push_back(lr_scale);
      layout.weight_decay.push_back(decay);
    }
    layout.group_of_param.push_back(id);
  }
  // A group that selects nothing is most likely a misspelt name: say so rather than train without it.
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (selected[g] == 0)
      throw std::invalid_argument(fmt::format(
          "make_param_groups: group {} (name_contains = '{}') selects no parameter, expected at least one", g,
          groups[g].name_contains));

  if (layout.lr_scale.empty()) {  // every parameter frozen: one pair for the ids to name
    layout.lr_scale.push_back(1.0);
    layout.weight_decay.push_back(0.0);
  }
  // The runs of the shard that train, in shard order, adjacent chunks merged.
  std::vector<std::pair<std::size_t, std::size_t>> chunks;  // (offset, elements) of parameters that train
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (layout.frozen_param[p]) layout.frozen_numel += plan.params[p].chunk_numel();
    else if (plan.params[p].chunk_numel() > 0) chunks.emplace_back(plan.params[p].storage_offset, plan.params[p].chunk_numel());
  }
  if (layout.frozen_numel > 0) {
    std::sort(chunks.begin(), chunks.end());
    std::size_t state = 0;
    for (const auto& [offset, count] : chunks) {
      if (!layout.trained.empty() && layout.trained.back().first + layout.trained.back().count == offset)
        layout.trained.back().count += count;
      else
        layout.trained.push_back({offset, count, state});
      state += count;
    }
  }

  layout.group_of = Kokkos::View<std::uint8_t*>("kfsdp::optim::param_groups", plan.shard_numel);
  auto host = Kokkos::create_mirror_view(layout.group_of);
  for (std::size_t p = 0; p < params.size(); ++p) {
    const param_shard& s = plan.params[p];
    for (std::size_t i = 0; i < s.chunk_numel(); ++i) host(s.storage_offset + i) = std::uint8_t(layout.group_of_param[p]);
  }
  Kokkos::deep_copy(layout.group_of, host);
  return layout;
}

namespace detail {
// The layout of an engine's parameters with `groups`; the parameters of frozen groups are frozen in
// the engine too, and those frozen there are frozen in the layout.
template <class Engine>
param_group_layout groups_freezing(Engine& engine, double weight_decay, const std::vector<param_group>& groups) {
  param_group_layout layout = make_param_groups(engine.params(), engine.plan(), weight_decay, groups, engine.frozen());
  for (std::size_t p = 0; p < layout.frozen_param.size(); ++p)
    if (layout.frozen_param[p] && !engine.is_frozen(p)) engine.set_frozen(p);
  return layout;
}

// A trainer's engine, or the engine itself.
template <class Owner>
decltype(auto) engine_of(Owner& owner) {
  if constexpr (requires { owner.engine(); })
    return (owner.engine());
  else
    return (owner);
}
}  // namespace detail

}  // namespace kfsdp::optim
