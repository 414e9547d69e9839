#include <doctest/doctest.h>

#include <string>

#include <fmt/format.h>

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/plan/format.hpp>

using namespace kfsdp;
using two_linears = sequential<"", linear<"0", 4, 13>, linear<"1", 13, 1>>;

TEST_CASE("a plan prints itself") {
  const auto plan = make_shard_plan(param_table<two_linears>, 3, bucketing::layer);
  CHECK(fmt::format("{}", plan) ==
        "shard_plan(world_size=3, bucketing=layer): 4 params in 2 buckets, 39 elements per rank\n"
        "  (full model 79, padding 38 = 48.1% over the full model)\n"
        "  bucket 0: params 0..1, 25 elements per rank\n"
        "  bucket 1: params 2..3, 14 elements per rank");
  const std::string table = plan_table(plan, param_table<two_linears>, 4);
  CHECK(table.find("0.weight") != std::string::npos);
  CHECK(table.find("[13, 4]") != std::string::npos);
  CHECK(table.find("total: 156 bytes per rank against 316 bytes") != std::string::npos);
  CHECK(table.find("bucket   1: 2 params (1.weight .. 1.bias), 56 bytes per rank, 168 gathered") !=
        std::string::npos);
}
