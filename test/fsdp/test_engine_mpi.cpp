// The engine over MPI, run with 1, 2, 3 and 4 ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/threaded/threaded.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/quantize.hpp>

#include "../support/hsdp_groups.hpp"
#include "engine_checks.hpp"

// The engine's per-bucket collectives, which these tests drive directly (a trainer leaves them to its schedule).
template <class Engine>
auto buckets(Engine& engine) {
  return kfsdp::detail::bucket_collectives(engine);
}

using namespace kfsdp;
using namespace kfsdp::testing;

namespace {
constexpr bucketing all_bucketings[] = {bucketing::none, bucketing::layer, bucketing::block};
constexpr sharding_strategy every_sharding[] = {sharding_strategy::zero2, sharding_strategy::zero3};

template <class Scalar>
void check_state_dict_is_init(const state_dict& sd, std::span<const param_info> table, std::uint64_t seed,
                              param_init (*choose)(const param_info&)) {
  CHECK(sd.size() == table.size());
  for (std::size_t p = 0; p < table.size(); ++p) {
    const tensor* t = sd.find(table[p].name.view());
    CHECK(t != nullptr);
    if (t == nullptr) continue;
    CHECK(t->shape == std::vector<std::size_t>(table[p].shape.begin(), table[p].shape.begin() + table[p].rank));
    const auto got = t->values<Scalar>();
    CHECK(std::vector<Scalar>(got.begin(), got.end()) == expected_init<Scalar>(table[p], p, seed, choose));
  }
}
}  // namespace

TEST_CASE("shard -> full state dict gives exactly the original parameters, every strategy x bucketing") {
  comm::mpi world;
  for (sharding_strategy s : every_sharding)
    for (bucketing b : all_bucketings) {
      CAPTURE(to_string(s));
      CAPTURE(to_string(b));
      fsdp_engine<double> e(make_param_table(tiny_gpt{}), world, {.sharding_strategy = s, .bucketing_strategy = b});
      e.initialize(11, gpt_like_init);
      check_state_dict_is_init<double>(e.original_state_dict(), e.params(), 11, gpt_like_init);
      // rank0_only: only rank 0 holds it
      const state_dict only0 = e.original_state_dict(true);
      CHECK(only0.empty() == (world.rank() != 0));
    }
}

TEST_CASE("unsharded parameters are the same under none, layer and block bucketing (padding dropped)") {
  comm::mpi world;
  for (bucketing b : all_bucketings) {
    CAPTURE(to_string(b));
    fsdp_engine<float> e(make_param_table(thunder_padding{}), world, {.bucketing_strategy = b});
    e.initialize(3, all_normal);
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).unshard(k);
    for (std::size_t p = 0; p < e.params().size(); ++p)
      CHECK(to_host(e.full_param(p)) == expected_init<float>(e.params()[p], p, 3, all_normal));
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reshard(k);
    CHECK(e.memory().unsharded_now == 0);
  }
}

TEST_CASE("the parameter shards lie in shared memory on one node, and unshard reads them there, threaded too") {
  comm::mpi world;
  comm::threaded overlapped(world);
  for (const bool through_worker : {false, true}) {
    CAPTURE(through_worker);
    comm::any_communicator c = through_worker ? comm::any_communicator(overlapped) : comm::any_communicator(world);
    fsdp_engine<float> e(make_param_table(thunder_padding{}), c, {.bucketing_strategy = bucketing::block});
    CHECK(e.shards().in_shared_memory() == (world.size() > 1));  // the tests' ranks share a node
    CHECK_FALSE(e.grads().in_shared_memory());
    e.initialize(5, all_normal);
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).unshard(k);
    for (std::size_t p = 0; p < e.params().size(); ++p)
      CHECK(to_host(e.full_param(p)) == expected_init<float>(e.params()[p], p, 5, all_normal));
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reshard(k);
  }
}

TEST_CASE("reduce-scatter of known per-rank gradients gives the average, dividing after, before or split; padding stays zero") {
  comm::mpi world;
  const double ws = world.size();
  for (gradient_division division : {gradient_division::after, gradient_division::before, gradient_division::split})
    for (bucketing b : all_bucketings) {
      CAPTURE(to_string(division));
      CAPTURE(to_string(b));
      fsdp_engine<double> e(make_param_table(thunder_padding{}), world,
                            {.bucketing_strategy = b, .gradient_division = division});
      for (std::size_t p = 0; p < e.params().size(); ++p) {
        auto g = e.full_grad(p);
        const double r = world.rank();
        Kokkos::parallel_for(g.extent(0), KOKKOS_LAMBDA(std::size_t j) { g(j) = (r + 1) * double(j + 1) + double(p); });
      }
      for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reduce_gradients(k);
      CHECK(e.memory().unsharded_now == 0);
      for (std::size_t p = 0; p < e.params().size(); ++p) {
        const auto& s = e.plan().params[p];
        const auto chunk = to_host(e.grads().chunk(p));
        const std::size_t first = std::size_t(world.rank()) * s.chunk_numel();
        for (std::size_t k = 0; k < chunk.size(); ++k) {
          const std::size_t j = first + k;
          // mean over ranks of (r+1)(j+1) + p = (j+1)(ws+1)/2 + p; zero beyond dim0
          const double want = j < s.full_numel() ? double(j + 1) * (ws + 1) / 2 + double(p) : 0.0;
          if (division == gradient_division::after) CHECK(chunk[k] == want);  // a sum of integers, then one division
          else CHECK(chunk[k] == doctest::Approx(want).epsilon(1e-15));       // divided terms round
        }
      }
    }
}

TEST_CASE("mixed precision: parameters gathered in bf16 / f16 are the shards rounded; gradients reduced in them") {
  comm::mpi world;
  const double ws = world.size();
  for (wire_precision wire : {wire_precision::bf16, wire_precision::f16})
    for (bucketing b : all_bucketings) {
      CAPTURE(to_string(wire));
      CAPTURE(to_string(b));
      const auto rounded = [wire](double x) {
        return wire == wire_precision::bf16 ? double(float(bf16(float(x)))) : double(float(f16(float(x))));
      };
      fsdp_engine<double> e(make_param_table(thunder_padding{}), world,
                            {.bucketing_strategy = b, .param_dtype = wire, .reduce_dtype = wire});
      e.initialize(3, all_normal);
      const std::size_t bytes_before = e.bytes_communicated();
      for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).unshard(k);
      CHECK(e.bytes_communicated() - bytes_before == e.plan().shard_numel * std::size_t(ws) * 2);  // 2 bytes an element
      for (std::size_t p = 0; p < e.params().size(); ++p) {
        std::vector<double> want = expected_init<double>(e.params()[p], p, 3, all_normal);
        for (double& x : want) x = rounded(x);
        CHECK(to_host(e.full_param(p)) == want);
      }
      for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reshard(k);
      // Small integers are exact in both: the sum is exact, the average rounds once, in Scalar.
      for (std::size_t p = 0; p < e.params().size(); ++p) {
        auto g = e.full_grad(p);
        const double r = world.rank();
        Kokkos::parallel_for(g.extent(0), KOKKOS_LAMBDA(std::size_t j) { g(j) = (r + 1) + double(p + j % 3); });
      }
      for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reduce_gradients(k);
      CHECK(e.memory().unsharded_now == 0);
      for (std::size_t p = 0; p < e.params().size(); ++p) {
        const auto& s = e.plan().params[p];
        const auto chunk = to_host(e.grads().chunk(p));
        const std::size_t first = std::size_t(world.rank()) * s.chunk_numel();
        for (std::size_t k = 0; k < chunk.size(); ++k) {
          const std::size_t j = first + k;
          const double want = j < s.full_numel() ? (ws + 1) / 2 + double(p + j % 3) : 0.0;
          CHECK(chunk[k] == doctest::Approx(want).epsilon(1e-15));
        }
      }
    }
}

TEST_CASE("int8 all-gather: parameters within half a block's scale of the shards; one byte a value plus the scales") {
  comm::mpi world;
  const std::size_t ws = std::size_t(world.size());
  for (bucketing b : all_bucketings) {
    CAPTURE(to_string(b));
    fsdp_engine<double> e(make_param_table(thunder_padding{}), world, {.bucketing_strategy = b, .param_dtype = wire_precision::int8});
    e.initialize(3, all_normal);
    const shard_mapping map(e.plan());
    std::vector<std::vector<double>> want(e.params().size());
    for (std::size_t p = 0; p < want.size(); ++p) want[p] = expected_init<double>(e.params()[p], p, 3, all_normal);
    std::size_t theory = 0;
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) theory += ws * int8_bucket_blocks(map, k).bytes();
    const std::size_t bytes_before = e.bytes_communicated();
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).unshard(k);
    CHECK(e.bytes_communicated() - bytes_before == theory);
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) {
      const auto& bucket = e.plan().buckets[k];
      for (std::size_t r = 0; r < ws; ++r) {
        for (std::size_t p = bucket.first_param; p < bucket.first_param + bucket.param_count; ++p) {
          // Rank r's chunk of p, as it quantized it (padding: zeros), and its blocks' scales.
          std::vector<double> chunk(map.bucket_chunk(p).count, 0.0);
          const index_range real = map.elements(p, r);
          std::copy_n(want[p].begin() + std::ptrdiff_t(real.first), real.count, chunk.begin());
          std::vector<double> scale(int8_blocks::blocks_of(chunk.size()), 0.0);
          for (std::size_t i = 0; i < chunk.size(); ++i) scale[i / 256] = std::max(scale[i / 256], std::abs(chunk[i]));
          for (double& s : scale) s = double(float(s / 127));
          const auto got = to_host(e.full_param(p));
          std::size_t outside = 0;
          for (std::size_t j = 0; j < real.count; ++j)
            outside += std::abs(got[real.first + j] - chunk[j]) > scale[j / 256] * (0.5 + 1e-12);
          CHECK_MESSAGE(outside == 0, "parameter " << p << ", rank " << r << "'s rows");
        }
      }
    }
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reshard(k);
    CHECK(e.memory().unsharded_now == 0);
  }
}

namespace {
// World rank R's gradient of parameter p at full element j: magnitudes varying within a block.
double int8_test_grad(double world_rank, std::size_t p, std::size_t j) {
  return std::sin(0.1 * double(j) + world_rank + double(p)) * (1.0 + 0.5 * double(j % 7));
}
}  // namespace

TEST_CASE("int8 gradient reduction (qgZ): the average within the quantization bound; frozen chunks stay zero; "
          "accumulation; HSDP; one byte a value plus the scales") {
  comm::mpi world;
  const int n = world.size();
  // HSDP at an even world size: shard groups of half the ranks, the replicas across them.
  const int group = n % 2 == 0 ? n / 2 : n;
  comm::mpi shard_group = world.split(world.rank() / group, world.rank());
  comm::mpi replica_group = world.split(world.rank() % group, world.rank());
  comm::any_communicator replicas(replica_group);
  for (const bool hsdp : {false, true})
    for (gradient_division division : {gradient_division::after, gradient_division::before})
      for (bucketing b : all_bucketings) {
        if (hsdp && group == n) continue;  // no replicas at an odd world size
        CAPTURE(hsdp);
        CAPTURE(to_string(division));
        CAPTURE(to_string(b));
        comm::mpi& shards = hsdp ? shard_group : world;
        fsdp_options options{.bucketing_strategy = b, .gradient_division = division, .reduce_dtype = wire_precision::int8};
        if (hsdp) options.replica_group = replicas;
        fsdp_engine<double> e(make_param_table(thunder_padding{}), shards, options);
        const std::size_t frozen = 1;  // a parameter of the first bucket, beside unfrozen ones
        REQUIRE(e.params().size() > 2);
        e.set_frozen(frozen);
        const shard_mapping map(e.plan());
        const std::size_t gs = std::size_t(shards.size()), r = std::size_t(shards.rank());
        const double world_rank = world.rank();
        const auto fill = [&] {
          for (std::size_t p = 0; p < e.params().size(); ++p) {
            auto g = e.full_grad(p);
            auto on_host = Kokkos::create_mirror_view(g);
            for (std::size_t j = 0; j < g.extent(0); ++j) on_host(j) = int8_test_grad(world_rank, p, j);
            Kokkos::deep_copy(g, on_host);
          }
        };
        fill();
        const std::size_t bytes_before = e.bytes_communicated();
        for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reduce_gradients(k);
        // What crosses the wire: every shard-group rank's wire buffer of the unfrozen chunks; the
        // replicas' all-reduce in Scalar, of the unfrozen chunks too (a frozen one is zero everywhere).
        std::size_t theory = 0;
        for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) {
          const int8_blocks layout = walk_int8_chunks(map, k, [&](std::size_t p) { return p != frozen; }, ignore_chunks{});
          theory += gs * layout.bytes();
          if (hsdp)
            for (std::size_t p = e.plan().buckets[k].first_param; p < e.plan().buckets[k].first_param + e.plan().buckets[k].param_count; ++p)
              if (p != frozen) theory += map.chunk(p).count * sizeof(double);
        }
        CHECK(e.bytes_communicated() - bytes_before == theory);
        std::vector<std::vector<double>> first(e.params().size());
        for (std::size_t p = 0; p < e.params().size(); ++p) {
          const auto& s = e.plan().params[p];
          first[p] = to_host(e.grads().chunk(p));
          const std::size_t base = r * s.chunk_numel();  // this rank's chunk: full elements from here
          if (p == frozen) {
            CHECK(first[p] == std::vector<double>(s.chunk_numel(), 0.0));
            continue;
          }
          // Each world rank's quantization of this chunk is off by at most half its block's scale.
          std::vector<double> bound(first[p].size(), 0.0);
          for (int q = 0; q < n; ++q) {
            std::vector<double> scale(int8_blocks::blocks_of(s.chunk_numel()), 0.0);
            for (std::size_t i = 0; i < s.chunk_numel() && base + i < s.full_numel(); ++i)
              scale[i / 256] = std::max(scale[i / 256], std::abs(int8_test_grad(q, p, base + i)));
            for (std::size_t i = 0; i < bound.size(); ++i) bound[i] += scale[i / 256] / 127 / 2 / n;
          }
          std::size_t outside = 0;
          for (std::size_t i = 0; i < first[p].size(); ++i) {
            double exact = 0;
            if (base + i < s.full_numel())
              for (int q = 0; q < n; ++q) exact += int8_test_grad(q, p, base + i) / n;
            outside += std::abs(first[p][i] - exact) > bound[i] * (1 + 1e-6) + 1e-15;
          }
          CHECK_MESSAGE(outside == 0, "parameter " << p);
        }
        // Without zero_grad the next reduction adds: the same gradients give twice the shard.
        fill();
        for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reduce_gradients(k);
        for (std::size_t p = 0; p < e.params().size(); ++p) {
          const auto again = to_host(e.grads().chunk(p));
          std::size_t off = 0;
          for (std::size_t i = 0; i < again.size(); ++i) off += std::abs(again[i] - 2 * first[p][i]) > 1e-14 * (1 + std::abs(first[p][i]));
          CHECK_MESSAGE(off == 0, "parameter " << p);
        }
      }
}

TEST_CASE("HSDP: a NaN gradient on one replica is NaN in every replica's shard, f64, bf16 and int8 reductions") {
  comm::mpi world;
  std::optional<kfsdp::test::hsdp_groups> groups = kfsdp::test::halves_replicated(world);
  if (!groups) return;  // replicas need an even world size here
  for (wire_precision wire : {wire_precision::scalar, wire_precision::bf16, wire_precision::int8}) {
    CAPTURE(to_string(wire));
    fsdp_options options{.bucketing_strategy = bucketing::layer, .reduce_dtype = wire};
    options.replica_group = comm::any_communicator(groups->replicas);
    fsdp_engine<double> e(make_param_table(thunder_padding{}), groups->shards, options);
    const std::size_t p = 0, j = e.plan().params[p].full_numel() - 1;  // on the last shard rank's chunk
    for (std::size_t q = 0; q < e.params().size(); ++q) {
      auto g = e.full_grad(q);
      Kokkos::deep_copy(g, 1.0);
      if (world.rank() == 0 && q == p)
        Kokkos::deep_copy(Kokkos::subview(g, j), std::nan(""));  // replica 0 alone
    }
    for (std::size_t k = 0; k < e.plan().buckets.size(); ++k) buckets(e).reduce_gradients(k);
    const std::size_t chunk = e.plan().params[p].chunk_numel();
    if (std::size_t(groups->shards.rank()) == j / chunk) {
      const auto shard = to_host(e.grads().chunk(p));
      CHECK(std::isnan(shard[j % chunk]));
    }
  }
}

TEST_CASE("the division factors: their product is 1 / world size; FSDP1's pre-divide factor") {
  const double factors[] = {1, 2, 2, 2, 2, 4, 2, 4};  // FSDP1 at 1..8 ranks (not always a divisor: 2 at 3)
  for (std::size_t w = 1; w <= 8; ++w) CHECK(predivide_factor(w) == factors[w - 1]);
  CHECK(predivide_factor(16) == 4);
  CHECK(predivide_factor(1024) == 32);
  for (gradient_division d : {gradient_division::after, gradient_division::before, gradient_division::split})
    for (std::size_t w : {1, 2, 3, 8, 1000}) {
      const division_factors f = division_of(d, w);
      CHECK(f.before * f.after == doctest::Approx(1.0 / double(w)).epsilon(1e-15));
    }
  CHECK(division_of(gradient_division::before, 4).after == 1);
  CHECK(division_of(gradient_division::after, 4).before == 1);
  CHECK(parse_gradient_division("split") == gradient_division::split);
  CHECK_THROWS_WITH(parse_gradient_division("Before"),
                    "kfsdp: gradient division 'Before' is not one of after, before, split");
}

TEST_CASE("a parameter with dim0 below the world size: ranks holding only padding work") {
  comm::mpi world;
  fsdp_engine<float> e(make_param_table(thunder_padding{}), world, {.bucketing_strategy = bucketing::none});
  e.initialize(5, all_normal);
  const std::size_t bias = e.param_index("1.bias");  // one row
  CHECK(e.plan().params[bias].chunk_rows == 1);
  CHECK(e.plan().params[bias].padding_rows == std::size_t(world.size() - 1));
  const auto chunk = to_host(e.shards().chunk(bias));
  if (world.rank() > 0) CHECK(chunk == std::vector<float>{0.0f});
  buckets(e).unshard(e.plan().params[bias].bucket);
  CHECK(to_host(e.full_param(bias)) == expected_init<float>(e.params()[bias], bias, 5, all_normal));
}

TEST_CASE("broadcast_from: ranks starting from different weights end with rank r's") {
  comm::mpi world;
  for (int root = 0; root < world.size(); ++root) {
    for (bucketing b : all_bucketings) {
      fsdp_engine<double> e(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = b, .broadcast_from = root});
      e.initialize(100 + std::uint64_t(world.rank()), gpt_like_init);  // a different model on every rank
      check_state_dict_is_init<double>(e.original_state_dict(), e.params(), 100 + std::uint64_t(root), gpt_like_init);
    }
  }
}

TEST_CASE("load_original_state_dict shards a full state dict; bad ones are rejected on every rank") {
  comm::mpi world;
  fsdp_engine<double> source(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = bucketing::block});
  source.initialize(21, gpt_like_init);
  const state_dict full = source.original_state_dict();

  for (bucketing b : all_bucketings) {
    fsdp_engine<double> e(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = b});
    e.load_original_state_dict(full);
    check_state_dict_is_init<double>(e.original_state_dict(), e.params(), 21, gpt_like_init);
  }

  fsdp_engine<double> target(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = bucketing::layer});
  target.initialize(5, gpt_like_init);
  auto rejected = [&](const state_dict& bad, const std::string& message) {
    CHECK_THROWS_WITH_AS(target.load_original_state_dict(bad), message.c_str(), std::invalid_argument);
    check_state_dict_is_init<double>(target.original_state_dict(), target.params(), 5, gpt_like_init);  // untouched
  };
  {
    state_dict bad;
    for (const tensor& t : full)
      if (t.name != "transformer.h.1.ln_2.bias") bad.add(t);
    rejected(bad, "kfsdp::load_original_state_dict: parameter 'transformer.h.1.ln_2.bias' is missing (expected shape [8], dtype F64)");
  }
  {
    state_dict bad = full;
    bad.add(tensor::zeros("transformer.h.2.ln_1.weight", {8}, dtype::F64));
    rejected(bad, "kfsdp::load_original_state_dict: 'transformer.h.2.ln_1.weight' (shape [8]) is not a parameter of the model");
  }
  {
    state_dict bad = full;
    bad.at("lm_head.weight").shape = {8, 256};
    rejected(bad, "kfsdp::load_original_state_dict: parameter 'lm_head.weight' has shape [8, 256], expected [256, 8]");
  }
  {
    state_dict bad = full;
    bad.at("transformer.wpe.weight") = tensor::zeros("transformer.wpe.weight", {5, 8}, dtype::F32);
    rejected(bad, "kfsdp::load_original_state_dict: parameter 'transformer.wpe.weight' has dtype F32, expected F64");
  }
  if (world.size() > 1) {  // only the last rank is given a bad one: every rank still throws
    state_dict bad = full;
    if (world.rank() == world.size() - 1) bad.at("lm_head.weight").shape = {8, 256};
    CHECK_THROWS_AS(target.load_original_state_dict(bad), std::invalid_argument);
    check_state_dict_is_init<double>(target.original_state_dict(), target.params(), 5, gpt_like_init);
  }
  {  // broadcast_from: only the root's state dict is read; the others pass none
    fsdp_engine<double> e(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = bucketing::block, .broadcast_from = 0});
    e.load_original_state_dict(world.rank() == 0 ? full : state_dict{});
    check_state_dict_is_init<double>(e.original_state_dict(), e.params(), 21, gpt_like_init);
    state_dict bad = full;
    bad.at("lm_head.weight").shape = {8, 256};
    CHECK_THROWS_AS(e.load_original_state_dict(world.rank() == 0 ? bad : state_dict{}), std::invalid_argument);
  }
}

TEST_CASE("ranks that disagree on the plan get an error up front instead of a hang") {
  comm::mpi world;
  if (world.size() == 1) return;
  const bucketing mine = world.rank() == 0 ? bucketing::layer : bucketing::block;
  CHECK_THROWS_WITH_AS(fsdp_engine<float>(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = mine}),
                       doctest::Contains("ranks disagree on the shard plan and fsdp options"), std::runtime_error);
  // A model of another size on one rank, or another dtype: the same.
  const auto model = make_gpt({.layers = world.rank() == 1 ? 3u : 2u, .dim = 8, .heads = 1, .seq = 5});
  CHECK_THROWS_AS(fsdp_engine<float>(make_param_table(model), world, {}), std::runtime_error);
  if (world.rank() == 0)
    CHECK_THROWS_AS(fsdp_engine<float>(make_param_table(tiny_gpt{}), world, {}), std::runtime_error);
  else
    CHECK_THROWS_AS(fsdp_engine<double>(make_param_table(tiny_gpt{}), world, {}), std::runtime_error);
}

TEST_CASE("memory accounting: per-rank shards shrink with the world size") {
  comm::mpi world;
  fsdp_engine<float> e(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = bucketing::block});
  const auto m = e.memory();
  CHECK(m.sharded_params == e.plan().shard_numel * sizeof(float));
  CHECK(m.sharded_grads == m.sharded_params);
  CHECK(m.sharded_params * std::size_t(world.size()) >= e.plan().full_numel * sizeof(float));
  CHECK(m.unsharded_now == 0);
}
