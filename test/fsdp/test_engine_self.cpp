// The engine at world size 1 with the self backend (no MPI), and its schedule and errors.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/scheduler.hpp>
#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/model/model_graph.hpp>

#include "engine_checks.hpp"

// The engine's per-bucket collectives, which these tests drive directly (a trainer leaves them to its schedule).
template <class Engine>
auto buckets(Engine& engine) {
  return kfsdp::detail::bucket_collectives(engine);
}

using namespace kfsdp;
using namespace kfsdp::testing;

TEST_CASE("world size 1: the state dict is the initialised model, for every bucketing") {
  comm::self one;
  for (bucketing b : {bucketing::none, bucketing::layer, bucketing::block}) {
    fsdp_engine<double> e(make_param_table(tiny_gpt{}), one, {.bucketing_strategy = b});
    e.initialize(7, gpt_like_init);
    const state_dict sd = e.original_state_dict();
    REQUIRE(sd.size() == e.params().size());
    for (std::size_t p = 0; p < e.params().size(); ++p) {
      const auto& info = e.params()[p];
      const auto got = sd.at(info.name.view()).values<double>();
      const auto want = expected_init<double>(info, p, 7, gpt_like_init);
      CHECK(std::vector<double>(got.begin(), got.end()) == want);
    }
  }
}

namespace {
// An engine and the unit scheduler over it, built as kfsdp::trainer builds them (without the
// network), so that these tests drive the schedule's transitions themselves.
template <class Scalar>
struct scheduled : fsdp_engine<Scalar> {
  template <descriptor Model>
  scheduled(const Model& model, comm::any_communicator comm, const fsdp_options& options)
      : scheduled(make_model_graph(model), std::move(comm), options) {}
  scheduled(const model_graph& graph, comm::any_communicator comm, const fsdp_options& options)
      : fsdp_engine<Scalar>(graph.params, std::move(comm), options),
        schedule(*this, make_units(graph, this->plan(), this->options().wrap)) {}
  [[nodiscard]] const std::vector<fsdp_unit>& units() const noexcept { return schedule.units(); }
  unit_scheduler<Scalar> schedule;
};

// Drives a whole step through the scheduler's transitions, as kfsdp::trainer's pass does: the root first (kept),
// each block unit with the next one prefetched, backward in reverse. on_forward(u) runs inside
// unit u's forward, on_backward(u) inside its backward (after its full gradients are set to 1).
template <class E, class Forward, class Backward>
void run_units(E& engine, Forward&& on_forward, Backward&& on_backward) {
  auto& e = engine.schedule;
  const std::size_t n = e.units().size();
  auto next = [&](std::size_t u) { return u < n ? std::optional(u) : std::nullopt; };
  e.before_forward(0, next(1));
  for (std::size_t u = 1; u < n; ++u) {
    e.before_forward(u, next(u + 1));
    on_forward(u);
    e.after_forward(u);
  }
  e.after_forward(0);
  e.before_backward(0, next(n - 1));
  for (std::size_t p : e.units()[0].params) Kokkos::deep_copy(engine.full_grad(p), 1.0f);
  for (std::size_t u = n - 1; u >= 1; --u) {
    e.before_backward(u, u > 1 ? std::optional(u - 1) : std::nullopt);
    for (std::size_t p : e.units()[u].params) Kokkos::deep_copy(engine.full_grad(p), 1.0f);
    e.after_backward(u);
    on_backward(u);
  }
  e.after_backward(0);
  e.finish_backward();
}

// Units with a bucket unsharded or in flight right now.
template <class E>
std::vector<std::size_t> live_units(E& e) {
  std::vector<std::size_t> live;
  for (std::size_t u = 0; u < e.units().size(); ++u)
    for (std::size_t b : e.units()[u].buckets)
      if (buckets(e).is_unsharded(b) || buckets(e).is_gathering(b)) {
        live.push_back(u);
        break;
      }
  return live;
}
}  // namespace

TEST_CASE("the units of the GPT: the root, then one per block") {
  comm::self one;
  scheduled<float> e(tiny_gpt{}, one,
                     {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
  REQUIRE(e.units().size() == 3);
  CHECK(e.units()[0].name == "root");
  CHECK(e.units()[0].params == std::vector<std::size_t>{0, 1, 26, 27, 28});  // wte, wpe, ln_f, lm_head
  CHECK(e.units()[1].name == "transformer.h.0");
  CHECK(e.units()[2].name == "transformer.h.1");
  CHECK(e.units()[2].params.size() == 12);
  // Two blocks per unit, or every layer its own.
  scheduled<float> pairs(tiny_gpt{}, one,
                         {.sharding_strategy = sharding_strategy::zero3,
                          .bucketing_strategy = bucketing::layer,
                          .wrap = {.blocks_per_unit = 2}});
  CHECK(pairs.units().size() == 2);
  scheduled<float> layers(tiny_gpt{}, one,
                          {.sharding_strategy = sharding_strategy::zero3,
                           .bucketing_strategy = bucketing::layer,
                           .wrap = {.policy = wrap_policy::layers}});
  CHECK(layers.units().size() == 1 + 2 + 2 * 6 + 2);  // an empty root, wte, wpe, 6 per block, ln_f, lm_head
  CHECK(layers.units()[0].params.empty());
}

// Four blocks: enough for ZeRO3's one unit in flight to hold less than ZeRO2's whole model.
using four_block_gpt = gpt<4, 8, 5>;

TEST_CASE("the schedule: zero3 holds the root and one unit in flight, zero2 keeps every bucket until backward") {
  comm::self one;
  const auto model = four_block_gpt{};
  scheduled<float> z3(
      model, one, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
  scheduled<float> z2(
      model, one, {.sharding_strategy = sharding_strategy::zero2, .bucketing_strategy = bucketing::block});
  for (auto* e : {static_cast<fsdp_engine<float>*>(&z3), static_cast<fsdp_engine<float>*>(&z2)}) e->initialize(1, gpt_like_init);

  auto check_reducing = [](auto& e, std::size_t u) {  // reduce-scatters run one unit behind the backward
    for (std::size_t t = 1; t < e.units().size(); ++t)
      for (std::size_t b : e.units()[t].buckets) CHECK(buckets(e).is_reducing(b) == (t == u));
  };
  const std::size_t n = z3.units().size();
  run_units(
      z3,
      [&](std::size_t u) {  // the root, this unit and the prefetched next one, nothing else
        std::vector<std::size_t> expect{0, u};
        if (u + 1 < n) expect.push_back(u + 1);
        CHECK(live_units(z3) == expect);
      },
      [&](std::size_t u) { check_reducing(z3, u); });
  run_units(
      z2, [&](std::size_t u) { if (u + 1 == n) CHECK(live_units(z2).size() == n); },  // all kept for backward
      [&](std::size_t u) { check_reducing(z2, u); });
  const std::size_t model_bytes = z2.plan().full_numel * sizeof(float);
  CHECK(z2.memory().unsharded_peak >= model_bytes);  // zero2 held every parameter unsharded at once
  CHECK(z3.memory().unsharded_peak < z2.memory().unsharded_peak);
  CHECK(z3.memory().unsharded_now == 0);
  CHECK(z2.memory().unsharded_now == 0);
  // zero3 gathers the blocks twice (forward and backward), the root and zero2 everything once;
  // both reduce-scatter once: 3Ψ - root against 2Ψ.
  std::size_t root_bytes = 0;
  for (std::size_t b : z3.units()[0].buckets) root_bytes += z3.plan().gathered_numel(b) * sizeof(float);
  CHECK(z3.bytes_communicated() == 3 * model_bytes - root_bytes);
  CHECK(z2.bytes_communicated() == 2 * model_bytes);
  // The gradient of every element is 1, averaged over one rank.
  for (float x : to_host(z3.grads().flat())) CHECK(x == 1.0f);
}

// What a user's code may call on an engine: never a unit transition, nor the scheduler that makes
// them, which only kfsdp::trainer drives.
template <class E>
concept user_can_call_unit_hooks =
    std::is_convertible_v<E&, unit_scheduler<float>&> || std::is_convertible_v<E&, unit_scheduler<double>&> ||
    requires(E& e) { e.schedule_; } || requires(E& e) { e.begin_forward(); } || requires(E& e) { e.enter_forward(1); } ||
    requires(E& e) { e.hold_full_model(); } || requires(E& e) { e.before_forward(0); } || requires(E& e) {
      e.after_forward(0);
    } || requires(E& e) { e.before_backward(0); } || requires(E& e) { e.after_backward(0); } || requires(E& e) {
      e.finish_backward();
    } || requires(E& e) { e.reshard_all(); };
static_assert(!user_can_call_unit_hooks<fsdp_engine<float>>);
static_assert(!user_can_call_unit_hooks<fsdp_engine<double>>);
static_assert(user_can_call_unit_hooks<unit_scheduler<float>>);  // the check itself sees a callable hook

TEST_CASE("a hook out of order names the unit and the state it was in") {
  comm::self one;
  scheduled<float> engine(
      tiny_gpt{}, one,
      {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
  auto& e = engine.schedule;
  CHECK_THROWS_WITH_AS(e.after_backward(1),
                       "kfsdp::fsdp: after_backward(unit 1 'transformer.h.0') while the unit is 'sharded', expected 'backward'",
                       std::logic_error);
  CHECK_THROWS_WITH_AS(e.before_backward(2),
                       "kfsdp::fsdp: before_backward(unit 2 'transformer.h.1') while the unit is 'sharded', expected 'forward done'",
                       std::logic_error);
  CHECK_THROWS_WITH_AS(e.before_forward(3), "kfsdp::fsdp: before_forward(unit 3): the model has units 0..2", std::out_of_range);
  e.before_forward(1);
  e.after_forward(1);
  e.before_backward(1);
  CHECK_THROWS_WITH_AS(e.finish_backward(),
                       "kfsdp::fsdp: finish_backward() while unit 1 'transformer.h.0' is in backward (after_backward first)",
                       std::logic_error);
}

TEST_CASE("overlap_reduce_scatter = false finishes each unit's reduce-scatters at once: a lower peak") {
  comm::self one;
  auto peak = [&](bool overlap) {
    scheduled<float> e(four_block_gpt{}, one,
                       {.sharding_strategy = sharding_strategy::zero3,
                        .bucketing_strategy = bucketing::block,
                        .overlap_reduce_scatter = overlap});
    run_units(e, [](std::size_t) {}, [&](std::size_t u) {
      for (std::size_t b : e.units()[u].buckets) CHECK(buckets(e).is_reducing(b) == overlap);
    });
    for (float x : testing::to_host(e.grads().flat())) CHECK(x == 1.0f);  // the same gradients either way
    return e.memory().unsharded_peak;
  };
  CHECK(peak(false) < peak(true));
}

TEST_CASE("after zero_grad the reductions write the gradient shards; written through grads() they add") {
  comm::self one;
  scheduled<float> e(four_block_gpt{}, one,
                     {.sharding_strategy = sharding_strategy::zero2, .bucketing_strategy = bucketing::block});
  const auto reduce_ones = [&] {
    for (std::size_t p = 0; p < e.plan().params.size(); ++p) Kokkos::deep_copy(e.full_grad(p), 1.0f);
    for (std::size_t b = 0; b < e.plan().buckets.size(); ++b) buckets(e).reduce_gradients(b);
  };
  const auto every_grad_is = [&](float want) {
    for (float x : testing::to_host(e.grads().flat())) CHECK(x == want);
  };
  e.zero_grad();
  reduce_ones();
  every_grad_is(1.0f);
  reduce_ones();  // a second micro-batch adds
  every_grad_is(2.0f);
  e.zero_grad();
  Kokkos::deep_copy(e.grads().flat(), 5.0f);  // a write after zero_grad is kept
  reduce_ones();
  every_grad_is(6.0f);
}

TEST_CASE("grad_squared_norm: the sums the reductions left, or a pass now; the same bits either way") {
  comm::self one;
  scheduled<double> e(
      four_block_gpt{}, one,
      {.sharding_strategy = sharding_strategy::zero2, .bucketing_strategy = bucketing::block});
  const auto pass_over_shards = [&] {
    double sum = 0;
    for (double x : testing::to_host(e.grads().flat())) sum += x * x;
    return sum;
  };
  const auto reduce_unequal_buckets = [&] {
    e.zero_grad();
    CHECK(e.grad_squared_norm() == 0.0);
    for (std::size_t p = 0; p < e.plan().params.size(); ++p)
      Kokkos::deep_copy(e.full_grad(p), 0.5 + double(p % 3));  // unequal buckets
    for (std::size_t b = 0; b < e.plan().buckets.size(); ++b) buckets(e).reduce_gradients(b);
    return e.grad_squared_norm();
  };
  const double summed_when_asked = reduce_unequal_buckets();  // the default: the reductions sum nothing
  e.set_grad_norm_with_reductions(true);
  const double after_reduction = reduce_unequal_buckets();
  CHECK(after_reduction == summed_when_asked);  // bit for bit: a trainer's clipping does not depend on it
  CHECK(after_reduction > 0);
  CHECK(after_reduction == doctest::Approx(pass_over_shards()).epsilon(1e-14));
  Kokkos::deep_copy(e.grads().flat(), 2.0);  // written since: the norm is the shards' now
  CHECK(e.grad_squared_norm() == doctest::Approx(4.0 * double(e.grads().flat().extent(0))));
}

TEST_CASE("the options select the schedule; unset, zero2 and no bucketing") {
  comm::self one;
  const auto model = make_gpt({.layers = 1, .dim = 4, .heads = 1, .seq = 3});
  scheduled<float> e(model, one,
                     {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::layer});
  CHECK(e.options().sharding() == sharding_strategy::zero3);
  CHECK(e.plan().buckets.size() == 2 + 6 + 2);  // wte, wpe, the block's 6 layers, ln_f, lm_head
  CHECK(e.schedule.reshards_after_forward(1));  // zero3 frees a block after its forward
  fsdp_engine<float> plain(make_param_table(tiny_gpt{}), one, {});
  CHECK(plain.options().sharding_strategy == sharding_strategy::zero2);
  CHECK(plain.options().bucketing() == bucketing::none);
}

TEST_CASE("params_version moves on at every gathering and every free of the parameter's bucket, and no other") {
  comm::self one;
  fsdp_engine<float> e(make_param_table(thunder_padding{}), one, {.bucketing_strategy = bucketing::layer});
  const std::uint64_t first = e.params_version(0), other = e.params_version(2);  // buckets 0 and 1
  buckets(e).unshard(0);
  const std::uint64_t gathered = e.params_version(0);
  CHECK(gathered != first);
  CHECK(e.params_version(2) == other);
  (void)e.full_param(0);
  CHECK(e.params_version(0) == gathered);  // reading is no change
  buckets(e).reshard(0);
  CHECK(e.params_version(0) != gathered);  // a view bound while gathered no longer holds
  CHECK_THROWS_WITH_AS((void)e.params_version(4), "kfsdp::fsdp::params_version: param is 4, expected less than 4",
                       std::out_of_range);
}

TEST_CASE("bad input to the engine is a clear exception") {
  comm::self one;
  fsdp_engine<float> e(make_param_table(thunder_padding{}), one, {.bucketing_strategy = bucketing::layer});
  CHECK_THROWS_WITH_AS(buckets(e).unshard(2), "kfsdp::fsdp::begin_unshard: bucket is 2, expected less than 2", std::out_of_range);
  CHECK_THROWS_WITH_AS((void)e.full_param(0), "kfsdp::fsdp::full_param: '0.weight' is sharded (bucket 0); unshard it first",
                       std::logic_error);
  CHECK_THROWS_WITH_AS((void)e.full_grad(4), "kfsdp::fsdp::full_grad: param is 4, expected less than 4", std::out_of_range);
  CHECK_THROWS_WITH_AS((void)e.param_index("2.weight"), "kfsdp::fsdp: the model has no parameter named '2.weight'",
                       std::out_of_range);
  CHECK_THROWS_WITH_AS(fsdp_engine<float>(make_param_table(thunder_padding{}), one, {.broadcast_from = 1}),
                       "kfsdp::fsdp: broadcast_from is 1, expected a rank in [0, 1)", std::invalid_argument);
  CHECK_THROWS_AS(fsdp_engine<float>(make_param_table(thunder_padding{}), one, {.device = 0}), std::invalid_argument);
}

TEST_CASE("limit_all_gathers: never more than N all-gathers in flight, N = 1, 2, 3, zero2 and zero3") {
  comm::self one;
  const auto model = tiny_gpt{};
  auto run = [&](auto& e) {
    run_units(e, [](std::size_t) {}, [](std::size_t) {});
    return e.max_inflight_all_gathers();
  };
  for (std::size_t limit : {1u, 2u, 3u}) {
    CAPTURE(limit);
    scheduled<float> z3(model, one,
                        {.sharding_strategy = sharding_strategy::zero3,
                         .bucketing_strategy = bucketing::layer,
                         .limit_all_gathers = limit});
    scheduled<float> z2(model, one,
                        {.sharding_strategy = sharding_strategy::zero2,
                         .bucketing_strategy = bucketing::layer,
                         .limit_all_gathers = limit});
    CHECK(run(z3) == limit);  // a block unit and its prefetched successor are 12 buckets: the limit binds
    CHECK(run(z2) == limit);
  }
  scheduled<float> unlimited(
      model, one, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::layer});
  CHECK(run(unlimited) == 12);
}
