// bucket_state: one bucket's state machine, driven directly (world size 1, the self backend).
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/fsdp/bucket_state.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/param_table.hpp>

#include "../support/messages.hpp"
#include "engine_checks.hpp"

using namespace kfsdp;

namespace {
using two_linears = sequential<"", linear<"0", 4, 13>, linear<"1", 13, 1>>;

struct fixture {
  comm::self one;
  comm::any_communicator comm{one};
  shard_plan plan = make_shard_plan(param_table<two_linears>, 1, bucketing::layer);
  shard_mapping map{plan};
  sharded_storage<double> shards{plan, "shards"}, grads{plan, "grads"};
  buffer_pool<double> pool;
  bucket_context<double> context{comm, pool, map, shards, grads};
};

std::string message_of(auto&& call) { return kfsdp::test::error_message<std::logic_error>(call); }
}  // namespace

TEST_CASE("the two layouts of bucket_state.hpp's example") {
  const shard_plan plan = make_shard_plan(param_table<sequential<"", linear<"0", 1, 3>>>, 2, bucketing::layer);
  const shard_mapping map(plan);
  REQUIRE(plan.buckets.size() == 1);
  CHECK(plan.buckets[0].shard_numel == 4);
  // gathered [w0 w1 b0 b1 | w2 · b2 ·]
  CHECK(map.gathered(0, 0) == index_range{0, 2});
  CHECK(map.gathered(1, 0) == index_range{2, 2});
  CHECK(map.gathered(0, 1) == index_range{4, 2});
  CHECK(map.gathered(1, 1) == index_range{6, 2});
  // unpacked [w0 w1 w2 · | b0 b1 b2 ·]
  CHECK(map.padded(0) == index_range{0, 4});
  CHECK(map.unpacked(0) == index_range{0, 3});
  CHECK(map.padded(1) == index_range{4, 4});
  CHECK(map.unpacked(1) == index_range{4, 3});
  CHECK(map.unpacked(0, 1) == index_range{2, 1});  // rank 1's real row of w: w2
}

TEST_CASE("the parameters go sharded → gathering → unsharded → sharded, and nothing else") {
  fixture f;
  Kokkos::deep_copy(f.shards.flat(), 2.0);
  bucket_state<double> bucket(0, f.map);
  CHECK(bucket.params() == param_phase::sharded);
  CHECK(message_of([&] { bucket.finish_gather(f.context); }) ==
        "kfsdp::fsdp: bucket 0 cannot finish its all-gather: it is sharded, expected gathering");
  CHECK(message_of([&] { (void)bucket.param(f.context, 0); }) ==
        "kfsdp::fsdp: bucket 0 cannot hand out a parameter: it is sharded, expected unsharded");
  bucket.begin_gather(f.context);
  CHECK(bucket.params() == param_phase::gathering);
  CHECK(message_of([&] { bucket.begin_gather(f.context); }) ==
        "kfsdp::fsdp: bucket 0 cannot begin its all-gather: it is gathering, expected sharded");
  bucket.finish_gather(f.context);
  CHECK(bucket.params() == param_phase::unsharded);
  const auto bias = testing::to_host(bucket.param(f.context, 1));
  CHECK(bias.size() == 13);
  CHECK(bias.front() == 2.0);
  // One buffer, the parameters in place where their all-gathers wrote them: no unpacked copy.
  CHECK(f.pool.live_bytes() == f.map.gathered_numel(0) * sizeof(double));
  CHECK(bucket.param(f.context, 1).data() == bucket.param(f.context, 0).data() + f.map.padded(1).first);
  bucket.free(f.context);
  CHECK(bucket.params() == param_phase::sharded);
  CHECK(f.pool.live_bytes() == 0);
  bucket.free(f.context);  // freeing a sharded bucket is harmless
}

TEST_CASE("the gradients go none → accumulating → reducing → none; no gradient reduces as zeros") {
  fixture f;
  bucket_state<double> bucket(1, f.map);
  Kokkos::deep_copy(bucket.grad(f.context, 2), 3.0);
  CHECK(bucket.grads() == grad_phase::accumulating);
  bucket.begin_reduce(f.context, 1.0, 0.5);
  CHECK(bucket.grads() == grad_phase::reducing);
  CHECK(message_of([&] { (void)bucket.grad(f.context, 2); }) ==
        "kfsdp::fsdp: bucket 1 cannot hand out a gradient: it is reducing, expected none or accumulating");
  CHECK(message_of([&] { bucket.begin_reduce(f.context); }) ==
        "kfsdp::fsdp: bucket 1 cannot begin its reduce-scatter: it is reducing, expected none or accumulating");
  bucket.finish_reduce(f.context);
  CHECK(bucket.grads() == grad_phase::none);
  const auto reduced = testing::to_host(f.grads.bucket(1));
  CHECK(reduced.front() == 1.5);  // 3 · 0.5
  CHECK(reduced.back() == 0.0);   // 1.bias: no gradient
  CHECK(message_of([&] { bucket.finish_reduce(f.context); }) ==
        "kfsdp::fsdp: bucket 1 cannot finish its reduce-scatter: it is none, expected reducing");
  bucket.begin_reduce(f.context);  // nothing accumulated: the bucket reduces zeros
  bucket.finish_reduce(f.context);
  CHECK(testing::to_host(f.grads.bucket(1)).front() == 1.5);
  CHECK(f.pool.live_bytes() == 0);
}

TEST_CASE("a zero gradient shard receives the sums itself; otherwise they are added") {
  fixture f;
  bucket_state<double> bucket(1, f.map);
  Kokkos::deep_copy(f.grads.bucket(1), 7.0);
  bucket.set_shard_grads_zero(true);  // as zero_grad says: the 7s are not read
  Kokkos::deep_copy(bucket.grad(f.context, 2), 3.0);
  bucket.begin_reduce(f.context, 1.0, 0.5);
  CHECK(f.pool.live_bytes() == f.map.gathered_numel(1) * sizeof(double));  // the full gradients only
  bucket.finish_reduce(f.context);
  CHECK(testing::to_host(f.grads.bucket(1)).front() == 1.5);  // written: 3 · 0.5
  Kokkos::deep_copy(bucket.grad(f.context, 2), 3.0);            // a second micro-batch adds
  bucket.begin_reduce(f.context, 1.0, 0.5);
  CHECK(f.pool.live_bytes() == (f.map.gathered_numel(1) + f.map.bucket(1).count) * sizeof(double));
  bucket.finish_reduce(f.context);
  CHECK(testing::to_host(f.grads.bucket(1)).front() == 3.0);  // 1.5 + 3 · 0.5
  CHECK(f.pool.live_bytes() == 0);
}
