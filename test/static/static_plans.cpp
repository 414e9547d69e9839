// Compile-only tests: every check here is a static_assert; the file compiling is the test.
#include <cstddef>
#include <utility>

#include <kfsdp/model/gpt.hpp>
#include <kfsdp/plan/shard_mapping.hpp>
#include <kfsdp/plan/shard_plan.hpp>

using namespace kfsdp;

// Properties that hold for every plan: storage bucket after bucket, padding below one row per
// rank, every real row held by exactly one rank.
template <class Plan>
constexpr bool well_formed(const Plan& plan) {
  std::size_t offset = 0;
  for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
    const auto& bucket = plan.buckets[k];
    if (bucket.storage_offset != offset) return false;
    std::size_t inside = 0;
    for (std::size_t i = bucket.first_param; i < bucket.first_param + bucket.param_count; ++i) {
      const auto& p = plan.params[i];
      if (p.bucket != k || p.bucket_offset != inside || p.storage_offset != offset + inside) return false;
      if (p.chunk_rows * plan.world_size < p.dim0 || p.padding_rows >= plan.world_size) return false;
      std::size_t rows = 0;
      for (std::size_t r = 0; r < plan.world_size; ++r) rows += basic_shard_mapping(plan).rows(i, r).count;
      if (rows != p.dim0) return false;
      inside += p.chunk_numel();
    }
    if (inside != bucket.shard_numel) return false;
    offset += inside;
  }
  return offset == plan.shard_numel &&
         plan.shard_numel * plan.world_size == plan.full_numel + plan.padding_numel;
}

template <class Model>
constexpr bool all_plans_well_formed() {
  return []<std::size_t... W>(std::index_sequence<W...>) {
    return ((well_formed(static_shard_plan<Model, W + 1, bucketing::none>) &&
             well_formed(static_shard_plan<Model, W + 1, bucketing::layer>) &&
             well_formed(static_shard_plan<Model, W + 1, bucketing::block>)) && ...);
  }(std::make_index_sequence<8>{});
}

// Thunder's padding test model: Linear(4,13) then Linear(13,1).
using thunder_padding = sequential<"", linear<"0", 4, 13>, linear<"1", 13, 1>>;
static_assert(all_plans_well_formed<thunder_padding>());
// dim0 (13) not a multiple of 3: chunk 5, padding 2.
static_assert(static_shard_plan<thunder_padding, 3, bucketing::none>.params[0].chunk_rows == 5);
static_assert(static_shard_plan<thunder_padding, 3, bucketing::none>.params[0].padding_rows == 2);
// dim0 (1) below the world size (8): one row each, seven ranks hold only padding.
static_assert(static_shard_plan<thunder_padding, 8, bucketing::none>.params[3].chunk_rows == 1);
static_assert(static_shard_plan<thunder_padding, 8, bucketing::none>.params[3].padding_rows == 7);
static_assert(basic_shard_mapping(static_shard_plan<thunder_padding, 8, bucketing::none>).rows(3, 1).count == 0);
// 1-D parameters shard the same way: the bias of 13 at world size 4 is chunks of 4.
static_assert(static_shard_plan<thunder_padding, 4, bucketing::layer>.params[1].chunk_numel() == 4);
// Buckets: none = per parameter, layer = per Linear.
static_assert(static_shard_plan<thunder_padding, 2, bucketing::none>.buckets.size() == 4);
static_assert(static_shard_plan<thunder_padding, 2, bucketing::layer>.buckets.size() == 2);
static_assert(static_shard_plan<thunder_padding, 2, bucketing::block>.buckets.size() == 2);

using tiny_gpt = gpt<2, 24, 10>;
static_assert(all_plans_well_formed<tiny_gpt>());
static_assert(static_shard_plan<tiny_gpt, 4, bucketing::block>.buckets.size() == 2 + 2 + 2);
static_assert(static_shard_plan<tiny_gpt, 4, bucketing::block>.buckets[2].param_count == 12);
static_assert(static_shard_plan<tiny_gpt, 4, bucketing::layer>.buckets.size() == 2 + 6 * 2 + 2);

using odd_mlp = sequential<"mlp", block<"b", layer_norm<"ln", 5>, linear<"fc", 5, 7>>, linear<"head", 7, 3, false>>;
static_assert(all_plans_well_formed<odd_mlp>());

// A 96-block GPT: computable within the compilers' default constexpr limits.
using gpt96 = gpt<96, 768, 1024>;
static_assert(param_table<gpt96>.size() == 4 + 12 * 96 + 1);
static_assert(well_formed(static_shard_plan<gpt96, 8, bucketing::block>));
static_assert(static_shard_plan<gpt96, 8, bucketing::block>.buckets.size() == 2 + 96 + 2);
static_assert(static_shard_plan<gpt96, 7, bucketing::none>.buckets.size() == 1157);
static_assert(static_shard_plan<gpt96, 3, bucketing::layer>.params[0].padding_rows == 2);

int main() { return 0; }
