// sharded_storage: one flat view laid out by the plan; buckets and chunks are views into it.
#include <doctest/doctest.h>

#include <kfsdp/fsdp/storage.hpp>

#include "../fsdp/engine_checks.hpp"

using namespace kfsdp;

TEST_CASE("a bucket's local shard and each parameter's chunk are views into one zeroed flat view") {
  // Linear(4,13), Linear(13,1) at world size 3, layer bucketing: chunks 20, 5 | 13, 1; 39 per rank.
  const auto plan = make_shard_plan(param_table<testing::thunder_padding>, 3, bucketing::layer);
  sharded_storage<float> storage(plan, "test");
  CHECK(storage.flat().extent(0) == 39);
  CHECK(storage.bytes() == 39 * sizeof(float));
  for (float x : testing::to_host(storage.flat())) CHECK(x == 0.0f);  // padding starts zero
  CHECK(storage.bucket(1).data() == storage.flat().data() + 25);
  CHECK(storage.bucket(1).extent(0) == 14);
  CHECK(storage.chunk(3).data() == storage.flat().data() + 38);
  const auto weight = storage.shard(0);
  CHECK(weight.extent(0) == 5);  // chunk rows
  CHECK(weight.extent(1) == 4);  // row elements
  CHECK(&weight(1, 0) == storage.flat().data() + 4);
  CHECK_THROWS_AS((void)storage.chunk(4), std::out_of_range);
}
