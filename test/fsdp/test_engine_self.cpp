// The engine at world size 1 with the self backend (no MPI), and its schedule and errors.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include <kfsdp/comm/self.hpp>
#include <kfsdp/fsdp/fsdp.hpp>

#include "engine_checks.hpp"

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

TEST_CASE("the schedule: zero3 holds one stage in flight, zero2 keeps every bucket until backward") {
  comm::self one;
  const auto model = tiny_gpt{};
  const std::vector<param_range> stages{{0, 2}, {2, 14}, {14, 26}, {26, 29}};

  fsdp<tiny_gpt, float, zero3, block_bucketing> z3(model, one);
  fsdp<tiny_gpt, float, block_bucketing, zero2> z2(model, one);  // policies in any order
  static_assert(decltype(z2)::sharding == sharding_strategy::zero2);
  static_assert(decltype(z3)::bucketing_strategy == bucketing::block);
  for (auto* e : {static_cast<fsdp_engine<float>*>(&z3), static_cast<fsdp_engine<float>*>(&z2)}) e->initialize(1, gpt_like_init);

  // Buckets unsharded or in flight right now, as stage indices (block bucketing: one per stage part).
  auto live_stages = [&](auto& e) {
    std::vector<std::size_t> live;
    for (std::size_t s = 0; s < stages.size(); ++s) {
      const auto [first, last] = e.buckets_of(stages[s]);
      for (std::size_t b = first; b < last; ++b)
        if (e.is_unsharded(b) || e.is_gathering(b)) {
          live.push_back(s);
          break;
        }
    }
    return live;
  };
  auto run = [&](auto& e, bool zero3) {
    for (std::size_t s = 0; s < stages.size(); ++s) {
      const bool has_next = s + 1 < stages.size();
      e.before_forward(stages[s], has_next ? std::optional(stages[s + 1]) : std::nullopt);
      if (zero3) {  // this stage and the prefetched next one, nothing else
        std::vector<std::size_t> expect{s};
        if (has_next) expect.push_back(s + 1);
        CHECK(live_stages(e) == expect);
      }
      e.after_forward(stages[s]);
    }
    if (!zero3) CHECK(live_stages(e).size() == stages.size());  // all kept for backward
    for (std::size_t s = stages.size(); s-- > 0;) {
      e.before_backward(stages[s], s > 0 ? std::optional(stages[s - 1]) : std::nullopt);
      for (std::size_t p = stages[s].first; p < stages[s].last; ++p) Kokkos::deep_copy(e.full_grad(p), 1.0f);
      e.after_backward(stages[s]);
      // Reduce-scatters run one stage behind the backward: this stage's are in flight, later ones done.
      for (std::size_t t = s; t < stages.size(); ++t) {
        const auto [first, last] = e.buckets_of(stages[t]);
        for (std::size_t b = first; b < last; ++b) CHECK(e.is_reducing(b) == (t == s));
      }
    }
    e.finish_gradient_reductions();
  };
  run(z3, true);
  run(z2, false);
  const std::size_t model_bytes = z2.plan().full_numel * sizeof(float);
  CHECK(z2.memory().unsharded_peak >= model_bytes);  // zero2 held every parameter unsharded at once
  CHECK(z3.memory().unsharded_peak < z2.memory().unsharded_peak);
  CHECK(z3.memory().unsharded_now == 0);
  CHECK(z2.memory().unsharded_now == 0);
  // zero3 gathers twice (forward and backward), zero2 once; both reduce-scatter once: 3Ψ against 2Ψ.
  CHECK(z3.bytes_communicated() == 3 * model_bytes);
  CHECK(z2.bytes_communicated() == 2 * model_bytes);
  // The gradient of every element is 1, averaged over one rank.
  const auto g = to_host(z3.grads().flat());
  for (float x : g) CHECK(x == 1.0f);
}

TEST_CASE("overlap_reduce_scatter = false finishes each stage's reduce-scatters at once: a lower peak") {
  comm::self one;
  const std::vector<param_range> stages{{0, 2}, {2, 14}, {14, 26}, {26, 29}};
  auto peak = [&](bool overlap) {
    fsdp<tiny_gpt, float, zero3, block_bucketing> e(tiny_gpt{}, one, {.overlap_reduce_scatter = overlap});
    for (std::size_t s = 0; s < stages.size(); ++s) {
      e.before_forward(stages[s], s + 1 < stages.size() ? std::optional(stages[s + 1]) : std::nullopt);
      e.after_forward(stages[s]);
    }
    for (std::size_t s = stages.size(); s-- > 0;) {
      e.before_backward(stages[s], s > 0 ? std::optional(stages[s - 1]) : std::nullopt);
      for (std::size_t p = stages[s].first; p < stages[s].last; ++p) Kokkos::deep_copy(e.full_grad(p), 1.0f);
      e.after_backward(stages[s]);
      const auto [first, last] = e.buckets_of(stages[s]);
      for (std::size_t b = first; b < last; ++b) CHECK(e.is_reducing(b) == overlap);
    }
    e.finish_gradient_reductions();
    for (float x : testing::to_host(e.grads().flat())) CHECK(x == 1.0f);  // the same gradients either way
    return e.memory().unsharded_peak;
  };
  CHECK(peak(false) < peak(true));
}

TEST_CASE("with_fsdp dispatches Thunder's options to the policies") {
  comm::self one;
  const auto model = make_gpt({.layers = 1, .dim = 4, .heads = 1, .seq = 3});
  const auto [sharding, buckets] = with_fsdp<float>(
      model, one, {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::layer},
      [](auto& e) { return std::pair(e.sharding, e.plan().buckets.size()); });
  CHECK(sharding == sharding_strategy::zero3);
  CHECK(buckets == 2 + 6 + 2);
}

TEST_CASE("bad input to the engine is a clear exception") {
  comm::self one;
  fsdp_engine<float> e(make_param_table(thunder_padding{}), one, {.bucketing_strategy = bucketing::layer});
  CHECK_THROWS_WITH_AS(e.unshard(2), "kfsdp::fsdp::begin_unshard: bucket is 2, expected less than 2", std::out_of_range);
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
  const std::vector<param_range> stages{{0, 2}, {2, 14}, {14, 26}, {26, 29}};
  auto run = [&](auto& e) {
    for (std::size_t s = 0; s < stages.size(); ++s) {
      e.before_forward(stages[s], s + 1 < stages.size() ? std::optional(stages[s + 1]) : std::nullopt);
      e.after_forward(stages[s]);
    }
    for (std::size_t s = stages.size(); s-- > 0;) {
      e.before_backward(stages[s], s > 0 ? std::optional(stages[s - 1]) : std::nullopt);
      e.after_backward(stages[s]);
    }
    e.finish_gradient_reductions();
    return e.max_inflight_all_gathers();
  };
  for (std::size_t limit : {1u, 2u, 3u}) {
    CAPTURE(limit);
    fsdp<tiny_gpt, float, zero3, layer_bucketing> z3(model, one, {.limit_all_gathers = limit});
    fsdp<tiny_gpt, float, zero2, layer_bucketing> z2(model, one, {.limit_all_gathers = limit});
    CHECK(run(z3) == limit);  // a block stage and its prefetched successor are 12 buckets: the limit binds
    CHECK(run(z2) == limit);
  }
  fsdp<tiny_gpt, float, zero3, layer_bucketing> unlimited(model, one);
  CHECK(run(unlimited) == 12);
}
