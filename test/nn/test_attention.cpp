// Tests of include/kfsdp/nn/attention.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/attention.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;


TEST_CASE("attention forward, by hand: causal mask, softmax, nanoGPT's head layout") {
  // D = 2, H = 2 (hd = 1, scale 1), T = 2, one window. Columns: q0 q1 | k0 k1 | v0 v1.
  matrix<double> qkv("qkv", 2, 6), y("y", 2, 2);
  const double rows[2][6] = {{1, 2, 0.5, 1, 10, 20}, {3, -1, 1.5, -2, 30, 40}};
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 6; ++c) set_entry(qkv, r * 6 + c, rows[r][c]);
  causal_self_attention<double> attn(2, 2, 2);
  auto cache = attn.make_cache(2);
  attn.forward({}, qkv, y, cache);
  CHECK(entry(y, 0) == 10.0);  // t = 0 sees only itself
  CHECK(entry(y, 1) == 20.0);
  // t = 1, head 0: scores 3 · 0.5, 3 · 1.5 → p = softmax(1.5, 4.5)
  const double p0 = 1 / (1 + std::exp(3.0));
  CHECK(entry(y, 2) == doctest::Approx(p0 * 10 + (1 - p0) * 30));
  // head 1: scores -1 · 1, -1 · -2 → softmax(-1, 2)
  const double p1 = 1 / (1 + std::exp(3.0));
  CHECK(entry(y, 3) == doctest::Approx(p1 * 20 + (1 - p1) * 40));
  CHECK(entry(cache.probs, 1) == 0.0);  // (b0, h0, t0, s1) is masked
}

TEST_CASE("attention backward matches central differences (double)") {
  const std::size_t batch = 2, seq = 3, dim = 4, heads = 2, rows = batch * seq;
  causal_self_attention<double> attn(dim, heads, seq);
  auto qkv = random_matrix<double>(rows, 3 * dim, 1);
  auto dy = random_matrix<double>(rows, dim, 2);
  matrix<double> y("y", rows, dim), dqkv("dqkv", rows, 3 * dim);
  auto cache = attn.make_cache(rows);
  auto loss = [&] {
    attn.forward({}, qkv, y, cache);
    return weighted_sum(y, dy);
  };
  loss();
  attn.backward({}, {}, cache, dy, dqkv);
  check_gradient("dqkv", qkv, dqkv, loss, /*max_entries=*/rows * 3 * dim);
}

TEST_CASE("attention rejects rows that are not whole windows and heads not dividing dim") {
  CHECK_THROWS_AS(causal_self_attention<double>(5, 2, 4), std::invalid_argument);
  causal_self_attention<double> attn(4, 2, 4);
  CHECK_THROWS_WITH_AS(attn.make_cache(6),
                       "causal_self_attention::make_cache: rows = 6 is not a multiple of seq_len = 4",
                       std::invalid_argument);
}
