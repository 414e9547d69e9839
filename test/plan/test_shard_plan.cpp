#include <doctest/doctest.h>

#include <numeric>
#include <stdexcept>
#include <vector>

#include <kfsdp/model/gpt.hpp>
#include <kfsdp/plan/shard_mapping.hpp>
#include <kfsdp/plan/shard_plan.hpp>

using namespace kfsdp;

using two_linears = sequential<"", linear<"0", 4, 13>, linear<"1", 13, 1>>;

TEST_CASE("the worked example of shard_plan.hpp") {
  const auto plan = make_shard_plan(param_table<two_linears>, 3, bucketing::layer);
  REQUIRE(plan.params.size() == 4);
  REQUIRE(plan.buckets.size() == 2);
  CHECK(plan.params[0].chunk_rows == 5);
  CHECK(plan.params[0].padding_rows == 2);
  CHECK(plan.params[1].bucket_offset == 20);
  CHECK(plan.params[2].storage_offset == 25);
  CHECK(plan.params[3].bucket_offset == 13);
  CHECK(plan.params[3].storage_offset == 38);
  CHECK(plan.buckets[0].shard_numel == 25);
  CHECK(plan.buckets[1].shard_numel == 14);
  CHECK(plan.shard_numel == 39);
  CHECK(plan.full_numel == 52 + 13 + 13 + 1);
  CHECK(plan.padding_numel == 2 * 4 + 2 + 2 * 13 + 2);
  CHECK(plan.buckets[0].full_numel == 65);
  CHECK(plan.buckets[1].full_numel == 14);
}

TEST_CASE("the worked example of shard_mapping.hpp") {
  const auto plan = make_shard_plan(param_table<two_linears>, 3, bucketing::layer);
  const shard_mapping map(plan);
  CHECK(map.rows(0, 2) == index_range{10, 3});
  CHECK(map.elements(0, 2) == index_range{40, 12});
  CHECK(map.rows(3, 0) == index_range{0, 1});
  CHECK(map.rows(3, 1).count == 0);  // ranks 1 and 2 hold only padding of 1.bias
  CHECK(map.chunk(1) == index_range{20, 5});
  CHECK(map.bucket(1) == index_range{25, 14});
  CHECK(map.gathered(1, 1) == index_range{45, 5});
  CHECK(map.bucket_chunk(1) == index_range{20, 5});
  CHECK(map.unpacked(1) == index_range{60, 13});
  CHECK(map.padded(1) == index_range{60, 15});
  CHECK(map.unpacked(1, 2) == index_range{70, 3});
  CHECK(map.rank_shard(0, 2) == index_range{50, 25});
  CHECK(map.padded_numel(0) == 60);
}

TEST_CASE("every bucketing covers the storage contiguously, bucket after bucket") {
  const auto table = make_param_table(make_gpt({.layers = 3, .dim = 20, .heads = 2, .seq = 7}));
  for (std::size_t ws = 1; ws <= 8; ++ws)
    for (bucketing b : {bucketing::none, bucketing::layer, bucketing::block}) {
      CAPTURE(ws);
      CAPTURE(to_string(b));
      const auto plan = make_shard_plan(table, ws, b);
      const shard_mapping map(plan);
      std::size_t offset = 0;
      for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
        const auto& bucket = plan.buckets[k];
        CHECK(bucket.storage_offset == offset);
        std::size_t inside = 0, unpacked = 0;
        for (std::size_t i = bucket.first_param; i < bucket.first_param + bucket.param_count; ++i) {
          const auto& p = plan.params[i];
          CHECK(p.bucket == k);
          CHECK(p.bucket_offset == inside);
          CHECK(p.storage_offset == offset + inside);
          CHECK(map.padded(i).first == unpacked);  // each padded, back to back
          unpacked += map.padded_numel(i);
          CHECK(p.chunk_rows * ws >= p.dim0);
          CHECK(p.chunk_rows * ws - p.dim0 < ws);  // padding below one row per rank
          std::size_t rows = 0;
          for (std::size_t r = 0; r < ws; ++r) {
            CHECK(map.rows(i, r).first == std::min(r * p.chunk_rows, p.dim0));  // back to back, in rank order
            rows += map.rows(i, r).count;
          }
          CHECK(rows == p.dim0);
          inside += p.chunk_numel();
        }
        CHECK(inside == bucket.shard_numel);
        CHECK(unpacked == map.gathered_numel(k));
        offset += inside;
      }
      CHECK(offset == plan.shard_numel);
      CHECK(plan.shard_numel * ws == plan.full_numel + plan.padding_numel);
      const std::size_t expected_buckets = b == bucketing::none    ? table.size()
                                           : b == bucketing::layer ? 2 + 6 * 3 + 2
                                                                   : 2 + 3 + 2;
      CHECK(plan.buckets.size() == expected_buckets);
    }
}

TEST_CASE("bad input is an exception with a clear message") {
  CHECK_THROWS_WITH_AS(make_shard_plan(param_table<two_linears>, 0, bucketing::none),
                       "kfsdp::make_shard_plan: world_size is 0, expected at least 1",
                       std::invalid_argument);
  std::vector<param_info> table(param_table<two_linears>.begin(), param_table<two_linears>.end());
  table[1].shape[0] = 0;
  table[1].numel = 0;
  CHECK_THROWS_WITH_AS(make_shard_plan(table, 2, bucketing::layer),
                       "kfsdp::make_shard_plan: parameter '0.bias' has no elements, expected every extent to be at least 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_bucketing("Block"), "kfsdp: bucketing 'Block' is not one of none, layer, block",
                       std::invalid_argument);
  CHECK(parse_bucketing("block") == bucketing::block);
}

TEST_CASE("the static plan equals the run-time plan; fingerprints tell plans apart") {
  using M = gpt<2, 24, 10>;
  const auto runtime = make_shard_plan(param_table<M>, 3, bucketing::block);
  CHECK(to_dynamic(static_shard_plan<M, 3, bucketing::block>) == runtime);
  CHECK(fingerprint(runtime) == fingerprint(static_shard_plan<M, 3, bucketing::block>));
  CHECK(fingerprint(runtime) != fingerprint(make_shard_plan(param_table<M>, 3, bucketing::layer)));
  CHECK(fingerprint(runtime) != fingerprint(make_shard_plan(param_table<M>, 4, bucketing::block)));
}

TEST_CASE("a world size near 2^64 stops with a message instead of wrapping the byte counts") {
  const auto table = kfsdp::make_param_table(kfsdp::make_gpt({.layers = 1, .dim = 8, .heads = 1, .seq = 4}));
  CHECK_THROWS_WITH_AS(kfsdp::make_shard_plan(table, 1000000000000000000ull, kfsdp::bucketing::none),
                       doctest::Contains("overflows 64 bits"), std::overflow_error);
}
