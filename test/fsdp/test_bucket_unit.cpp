// bucket_unit: one bucket's state machine, driven directly (world size 1, the self backend).
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/fsdp/bucket_unit.hpp>
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
  unit_context<double> context{comm, pool, map, shards, grads};
};

std::string message_of(auto&& call) { return kfsdp::test::error_message<std::logic_error>(call); }
}  // namespace

TEST_CASE("the parameters go sharded → gathering → unsharded → sharded, and nothing else") {
  fixture f;
  Kokkos::deep_copy(f.shards.flat(), 2.0);
  bucket_unit<double> unit(0, f.map);
  CHECK(unit.params() == param_phase::sharded);
  CHECK(message_of([&] { unit.finish_gather(f.context); }) ==
        "kfsdp::fsdp: bucket 0 cannot finish its all-gather: it is sharded, expected gathering");
  CHECK(message_of([&] { (void)unit.param(f.context, 0); }) ==
        "kfsdp::fsdp: bucket 0 cannot hand out a parameter: it is sharded, expected unsharded");
  unit.begin_gather(f.context);
  CHECK(unit.params() == param_phase::gathering);
  CHECK(message_of([&] { unit.begin_gather(f.context); }) ==
        "kfsdp::fsdp: bucket 0 cannot begin its all-gather: it is gathering, expected sharded");
  unit.finish_gather(f.context);
  CHECK(unit.params() == param_phase::unsharded);
  const auto bias = testing::to_host(unit.param(f.context, 1));
  CHECK(bias.size() == 13);
  CHECK(bias.front() == 2.0);
  // One buffer, the parameters in place where their all-gathers wrote them: no unpacked copy.
  CHECK(f.pool.live_bytes() == f.map.gathered_numel(0) * sizeof(double));
  CHECK(unit.param(f.context, 1).data() == unit.param(f.context, 0).data() + f.map.padded(1).first);
  unit.free(f.context);
  CHECK(unit.params() == param_phase::sharded);
  CHECK(f.pool.live_bytes() == 0);
  unit.free(f.context);  // freeing a sharded bucket is harmless
}

TEST_CASE("the gradients go none → accumulating → reducing → none; no gradient reduces as zeros") {
  fixture f;
  bucket_unit<double> unit(1, f.map);
  Kokkos::deep_copy(unit.grad(f.context, 2), 3.0);
  CHECK(unit.grads() == grad_phase::accumulating);
  unit.begin_reduce(f.context, 1.0, 0.5);
  CHECK(unit.grads() == grad_phase::reducing);
  CHECK(message_of([&] { (void)unit.grad(f.context, 2); }) ==
        "kfsdp::fsdp: bucket 1 cannot hand out a gradient: it is reducing, expected none or accumulating");
  CHECK(message_of([&] { unit.begin_reduce(f.context); }) ==
        "kfsdp::fsdp: bucket 1 cannot begin its reduce-scatter: it is reducing, expected none or accumulating");
  unit.finish_reduce(f.context);
  CHECK(unit.grads() == grad_phase::none);
  const auto reduced = testing::to_host(f.grads.bucket(1));
  CHECK(reduced.front() == 1.5);  // 3 · 0.5
  CHECK(reduced.back() == 0.0);   // 1.bias: no gradient
  CHECK(message_of([&] { unit.finish_reduce(f.context); }) ==
        "kfsdp::fsdp: bucket 1 cannot finish its reduce-scatter: it is none, expected reducing");
  unit.begin_reduce(f.context);  // nothing accumulated: the bucket reduces zeros
  unit.finish_reduce(f.context);
  CHECK(testing::to_host(f.grads.bucket(1)).front() == 1.5);
  CHECK(f.pool.live_bytes() == 0);
}

TEST_CASE("a zero gradient shard receives the sums itself; otherwise they are added") {
  fixture f;
  bucket_unit<double> unit(1, f.map);
  Kokkos::deep_copy(f.grads.bucket(1), 7.0);
  unit.set_shard_grads_zero(true);  // as zero_grad says: the 7s are not read
  Kokkos::deep_copy(unit.grad(f.context, 2), 3.0);
  unit.begin_reduce(f.context, 1.0, 0.5);
  CHECK(f.pool.live_bytes() == f.map.gathered_numel(1) * sizeof(double));  // the full gradients only
  unit.finish_reduce(f.context);
  CHECK(testing::to_host(f.grads.bucket(1)).front() == 1.5);  // written: 3 · 0.5
  Kokkos::deep_copy(unit.grad(f.context, 2), 3.0);            // a second micro-batch adds
  unit.begin_reduce(f.context, 1.0, 0.5);
  CHECK(f.pool.live_bytes() == (f.map.gathered_numel(1) + f.map.bucket(1).count) * sizeof(double));
  unit.finish_reduce(f.context);
  CHECK(testing::to_host(f.grads.bucket(1)).front() == 3.0);  // 1.5 + 3 · 0.5
  CHECK(f.pool.live_bytes() == 0);
}
