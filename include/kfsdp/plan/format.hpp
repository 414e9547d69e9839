#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Printing a shard plan with fmt.
//
//   fmt::print("{}\n", plan);
//   shard_plan(world_size=3, bucketing=layer): 4 params in 2 buckets, 39 elements per rank
//     (full model 69, padding 48 = 69.6% over the full model)
//     bucket 0: params 0..1, 25 elements per rank
//     bucket 1: params 2..3, 14 elements per rank
//
//   fmt::print("{}", kfsdp::plan_table(plan, table, sizeof(float)));  // one row per parameter

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <fmt/format.h>

#include <kfsdp/meta/shape_string.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp {

// "[768, 3072]"
inline std::string format_shape(const param_info& p) { return shape_string(std::span(p.shape.data(), p.rank)); }

// The plan's per-parameter table, its totals and one line per bucket, as a text.
KFSDP_EXPORT template <class Params, class Buckets>
std::string plan_table(const basic_shard_plan<Params, Buckets>& plan, std::span<const param_info> table,
                       std::size_t bytes_per_element) {
  if (table.size() != plan.params.size())
    throw std::invalid_argument("kfsdp::plan_table: table has " + std::to_string(table.size()) +
                                " parameters, expected the plan's " +
                                std::to_string(plan.params.size()));
  std::size_t name_width = 9;
  for (const param_info& p : table) name_width = std::max(name_width, p.name.size());
  std::string out = fmt::format("{:<{}}  {:>14}  {:>10}  {:>12}  {:>6}  {:>14}\n", "parameter",
                                name_width, "full shape", "chunk rows", "padding rows", "bucket",
                                "bytes per rank");
  for (std::size_t i = 0; i < table.size(); ++i) {
    const param_shard& s = plan.params[i];
    out += fmt::format("{:<{}}  {:>14}  {:>10}  {:>12}  {:>6}  {:>14}\n", table[i].name.view(),
                       name_width, format_shape(table[i]), s.chunk_rows, s.padding_rows, s.bucket,
                       s.chunk_numel() * bytes_per_element);
  }
  const double full_bytes = double(plan.full_numel) * double(bytes_per_element);
  const double rank_bytes = double(plan.shard_numel) * double(bytes_per_element);
  out += fmt::format(
      "total: {} bytes per rank against {} bytes for the full model ({:.2f}% of it, ideal {:.2f}%); "
      "padding {} elements = {:.3f}% overhead\n",
      plan.shard_numel * bytes_per_element, plan.full_numel * bytes_per_element,
      100.0 * rank_bytes / full_bytes, 100.0 / double(plan.world_size), plan.padding_numel,
      100.0 * double(plan.padding_numel) / double(plan.full_numel));
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    const bucket_shard& bucket = plan.buckets[b];
    const param_info& first = table[bucket.first_param];
    const param_info& last = table[bucket.first_param + bucket.param_count - 1];
    out += fmt::format("bucket {:>3}: {} param{} ({} .. {}), {} bytes per rank, {} gathered\n", b,
                       bucket.param_count, bucket.param_count == 1 ? "" : "s", first.name.view(),
                       last.name.view(), bucket.shard_numel * bytes_per_element,
                       plan.gathered_numel(b) * bytes_per_element);
  }
  return out;
}

}  // namespace kfsdp

template <class Params, class Buckets>
struct fmt::formatter<kfsdp::basic_shard_plan<Params, Buckets>> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Context>
  auto format(const kfsdp::basic_shard_plan<Params, Buckets>& plan, Context& ctx) const {
    auto out = fmt::format_to(
        ctx.out(),
        "shard_plan(world_size={}, bucketing={}): {} params in {} buckets, {} elements per rank\n"
        "  (full model {}, padding {} = {:.1f}% over the full model)",
        plan.world_size, kfsdp::to_string(plan.bucketing), plan.params.size(), plan.buckets.size(),
        plan.shard_numel, plan.full_numel, plan.padding_numel,
        100.0 * double(plan.padding_numel) / double(plan.full_numel));
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      const kfsdp::bucket_shard& bucket = plan.buckets[b];
      out = fmt::format_to(out, "\n  bucket {}: params {}..{}, {} elements per rank", b,
                           bucket.first_param, bucket.first_param + bucket.param_count - 1,
                           bucket.shard_numel);
    }
    return out;
  }
};
