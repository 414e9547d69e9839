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

namespace {
// Backward of attn on `batch` windows against central differences of sum(y * dy), every entry.
void check_backward_by_differences(causal_self_attention<double> attn, std::size_t batch, unsigned seed) {
  const std::size_t rows = batch * attn.seq_len(), dim = attn.dim();
  auto qkv = random_matrix<double>(rows, 3 * dim, seed);
  auto dy = random_matrix<double>(rows, dim, seed + 1);
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
}  // namespace

TEST_CASE("attention backward matches central differences (double)") {
  check_backward_by_differences(causal_self_attention<double>(4, 2, 3), 2, 1);
}

TEST_CASE("attention rejects rows that are not whole windows and heads not dividing dim") {
  CHECK_THROWS_AS(causal_self_attention<double>(5, 2, 4), std::invalid_argument);
  causal_self_attention<double> attn(4, 2, 4);
  CHECK_THROWS_WITH_AS((void)attn.make_cache(6),
                       "causal_self_attention::make_cache: rows = 6 is not a multiple of seq_len = 4",
                       std::invalid_argument);
}

namespace {

// The straightforward attention on host vectors (the loops of the kernels before BLAS), row-major
// qkv [rows, 3·dim], dy and the results [rows, dim] / [rows, 3·dim], probs [B, H, T, T].
struct reference_attention {
  std::vector<double> y, probs, dqkv;
};

reference_attention reference(const std::vector<double>& qkv, const std::vector<double>& dy, std::size_t batch,
                              std::size_t seq, std::size_t dim, std::size_t heads) {
  const std::size_t hd = dim / heads, width = 3 * dim;
  const double scale = 1 / std::sqrt(double(hd));
  reference_attention out{std::vector<double>(batch * seq * dim), std::vector<double>(batch * heads * seq * seq),
                          std::vector<double>(batch * seq * width)};
  std::vector<double> dscores(out.probs.size());
  auto q = [&](std::size_t b, std::size_t t, std::size_t h, std::size_t c) { return qkv[(b * seq + t) * width + h * hd + c]; };
  auto k = [&](std::size_t b, std::size_t t, std::size_t h, std::size_t c) { return qkv[(b * seq + t) * width + dim + h * hd + c]; };
  auto v = [&](std::size_t b, std::size_t t, std::size_t h, std::size_t c) { return qkv[(b * seq + t) * width + 2 * dim + h * hd + c]; };
  auto at = [&](std::size_t b, std::size_t h, std::size_t t, std::size_t s) { return ((b * heads + h) * seq + t) * seq + s; };
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t t = 0; t < seq; ++t) {
        double max_score = 0, sum = 0, weighted = 0;
        for (std::size_t s = 0; s <= t; ++s) {
          double score = 0;
          for (std::size_t c = 0; c < hd; ++c) score += q(b, t, h, c) * k(b, s, h, c);
          out.probs[at(b, h, t, s)] = score * scale;
          if (s == 0 || score * scale > max_score) max_score = score * scale;
        }
        for (std::size_t s = 0; s <= t; ++s) sum += (out.probs[at(b, h, t, s)] = std::exp(out.probs[at(b, h, t, s)] - max_score));
        for (std::size_t s = 0; s <= t; ++s) out.probs[at(b, h, t, s)] /= sum;
        for (std::size_t c = 0; c < hd; ++c)
          for (std::size_t s = 0; s <= t; ++s) out.y[(b * seq + t) * dim + h * hd + c] += out.probs[at(b, h, t, s)] * v(b, s, h, c);
        for (std::size_t s = 0; s <= t; ++s) {
          double dp = 0;
          for (std::size_t c = 0; c < hd; ++c) dp += dy[(b * seq + t) * dim + h * hd + c] * v(b, s, h, c);
          dscores[at(b, h, t, s)] = dp;
          weighted += out.probs[at(b, h, t, s)] * dp;
        }
        for (std::size_t s = 0; s <= t; ++s) dscores[at(b, h, t, s)] = out.probs[at(b, h, t, s)] * (dscores[at(b, h, t, s)] - weighted);
      }
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t t = 0; t < seq; ++t)
        for (std::size_t s = 0; s <= t; ++s)
          for (std::size_t c = 0; c < hd; ++c) {
            out.dqkv[(b * seq + t) * width + h * hd + c] += scale * dscores[at(b, h, t, s)] * k(b, s, h, c);
            out.dqkv[(b * seq + s) * width + dim + h * hd + c] += scale * dscores[at(b, h, t, s)] * q(b, t, h, c);
            out.dqkv[(b * seq + s) * width + 2 * dim + h * hd + c] += out.probs[at(b, h, t, s)] * dy[(b * seq + t) * dim + h * hd + c];
          }
  return out;
}

template <class View>
std::vector<double> host_values(const View& view) {
  std::vector<double> values(view.span());
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = entry(view, i);
  return values;
}

template <class Scalar>
void check_against_reference(double tolerance) {
  const std::size_t batch = 3, seq = 5, dim = 8, heads = 2, rows = batch * seq;
  causal_self_attention<Scalar> attn(dim, heads, seq);
  auto qkv = random_matrix<Scalar>(rows, 3 * dim, 11);
  auto dy = random_matrix<Scalar>(rows, dim, 12);
  matrix<Scalar> y("y", rows, dim), dqkv("dqkv", rows, 3 * dim);
  auto cache = attn.make_cache(rows);
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second pass reuses the scratch
    attn.forward({}, qkv, y, cache);
    attn.backward({}, {}, cache, dy, dqkv);
  }
  const auto expected = reference(host_values(qkv), host_values(dy), batch, seq, dim, heads);
  const auto compare = [&](const char* what, const std::vector<double>& seen, const std::vector<double>& want) {
    REQUIRE(seen.size() == want.size());
    for (std::size_t i = 0; i < seen.size(); ++i) {
      INFO(what, " entry ", i);
      CHECK(std::abs(seen[i] - want[i]) <= tolerance * std::max(1.0, std::abs(want[i])));
    }
  };
  compare("y", host_values(y), expected.y);
  compare("probs", host_values(cache.probs), expected.probs);
  compare("dqkv", host_values(dqkv), expected.dqkv);
}

}  // namespace

TEST_CASE("attention forward and backward equal the straightforward loops (double to 1e-12, float to 1e-5)") {
  check_against_reference<double>(1e-12);
  check_against_reference<float>(1e-5);
}

namespace {

// y, dqkv and the cache of one forward and backward with the given method (the second pass reuses the scratch).
template <class Scalar>
struct attention_run {
  std::vector<double> y, dqkv;
  typename causal_self_attention<Scalar>::cache cache;
};

template <class Scalar>
attention_run<Scalar> run_attention(attention_method method, std::size_t batch, std::size_t seq, std::size_t dim,
                                    std::size_t heads, std::size_t kv_heads) {
  const std::size_t rows = batch * seq;
  causal_self_attention<Scalar> attn(dim, heads, seq, kv_heads, method);
  REQUIRE(attn.method() == method);
  auto qkv = random_matrix<Scalar>(rows, attn.in_features(), 21);
  auto dy = random_matrix<Scalar>(rows, dim, 22);
  matrix<Scalar> y("y", rows, dim), dqkv("dqkv", rows, attn.in_features());
  attention_run<Scalar> run;
  run.cache = attn.make_cache(rows);
  for (int repeat = 0; repeat < 2; ++repeat) {
    attn.forward({}, qkv, y, run.cache);
    attn.backward({}, {}, run.cache, dy, dqkv);
  }
  run.y = host_values(y);
  run.dqkv = host_values(dqkv);
  return run;
}

template <class Scalar>
void check_blocked_equals_whole(std::size_t batch, std::size_t seq, std::size_t dim, std::size_t heads,
                                std::size_t kv_heads, double tolerance) {
  INFO("batch ", batch, ", seq ", seq, ", dim ", dim, ", heads ", heads, ", kv_heads ", kv_heads);
  const auto whole = run_attention<Scalar>(attention_method::whole, batch, seq, dim, heads, kv_heads);
  const auto blocked = run_attention<Scalar>(attention_method::blocked, batch, seq, dim, heads, kv_heads);
  const auto compare = [&](const char* what, const std::vector<double>& seen, const std::vector<double>& want) {
    REQUIRE(seen.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < seen.size(); ++i)
      worst = std::max(worst, std::abs(seen[i] - want[i]) / std::max(1.0, std::abs(want[i])));
    INFO(what, ": worst relative difference ", worst);
    CHECK(worst <= tolerance);
  };
  compare("y", blocked.y, whole.y);
  compare("dqkv", blocked.dqkv, whole.dqkv);
  // The blocked cache keeps one logsumexp per (window, head, query), not the [T, T] probabilities.
  CHECK(blocked.cache.probs.span() == 0);
  CHECK(blocked.cache.kept_bytes() == batch * heads * seq * sizeof(Scalar));
  CHECK(whole.cache.kept_bytes() == batch * heads * seq * seq * sizeof(Scalar));
}

}  // namespace

TEST_CASE("blocked attention equals whole attention: forward and gradients, causal, grouped-query") {
  SUBCASE("T = 130: three query blocks, the last of 2 rows (f64 to 1e-12, f32 to 1e-5)") {
    check_blocked_equals_whole<double>(2, 130, 16, 2, 2, 1e-12);
    check_blocked_equals_whole<float>(2, 130, 16, 2, 2, 1e-5);
  }
  SUBCASE("grouped-query: 4 query heads sharing 2 and 1 key/value heads, T = 100") {
    check_blocked_equals_whole<double>(2, 100, 16, 4, 2, 1e-12);
    check_blocked_equals_whole<double>(1, 100, 16, 4, 1, 1e-12);
  }
  SUBCASE("one block (T = 64), part of one (T = 5, T = 1)") {
    check_blocked_equals_whole<double>(2, 64, 8, 2, 2, 1e-12);
    check_blocked_equals_whole<double>(3, 5, 8, 2, 1, 1e-12);
    check_blocked_equals_whole<double>(2, 1, 8, 2, 2, 1e-12);
  }
  SUBCASE("T = 200, head_dim 64, 2 windows of 2 heads") { check_blocked_equals_whole<double>(2, 200, 128, 2, 2, 1e-12); }
}

TEST_CASE("blocked attention backward matches central differences (double, T = 70: two blocks)") {
  check_backward_by_differences(causal_self_attention<double>(4, 2, 70, 2, attention_method::blocked), 1, 31);
}

TEST_CASE("attention's automatic method: whole below blocked_from_seq_len, blocked from it") {
  CHECK(causal_self_attention<double>(8, 2, blocked_from_seq_len - 1).method() == attention_method::whole);
  CHECK(causal_self_attention<double>(8, 2, blocked_from_seq_len).method() == attention_method::blocked);
  CHECK(causal_self_attention<double>(8, 2, 512, 1).method() == attention_method::blocked);
  CHECK(causal_self_attention<double>(8, 2, 512, 2, attention_method::whole).method() == attention_method::whole);
  CHECK(causal_self_attention<double>(8, 2, 4, 2, attention_method::blocked).method() == attention_method::blocked);
}
