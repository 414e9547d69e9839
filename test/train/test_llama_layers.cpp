// The layers Llama adds (model/layers.hpp, nn/rotary.hpp, nn/attention.hpp): rotary position
// embedding and grouped-query attention through the public gradient checker (f64), RoPE's angles
// by hand, and grouped-query attention against multi-head attention over repeated key/value heads
// (transformers' repeat_kv).
#include <doctest/doctest.h>

#include <kfsdp/train/gradient_check.hpp>
#include <kfsdp/compute/ops.hpp>

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

using namespace kfsdp;

namespace {

template <class Layer>
void check_layer(const Layer& layer, gradient_check_options options = {}) {
  const gradient_check_report r = check_gradients(layer, options);
  INFO("worst ", r.worst, ": analytic ", r.analytic, ", numeric ", r.numeric, " (", r.checked, " checked, ", r.skipped,
       " skipped)");
  CHECK(r.checked > 0);
  CHECK(r.max_relative_error < 1e-8);
}

std::vector<double> host_of(const nn::matrix<double>& m) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  return {h.data(), h.data() + h.span()};
}

nn::matrix<double> matrix_of(std::size_t rows, std::size_t cols, const std::vector<double>& values) {
  nn::matrix<double> m("m", rows, cols);
  const auto h = Kokkos::create_mirror_view(m);
  for (std::size_t i = 0; i < values.size(); ++i) h.data()[i] = values[i];
  Kokkos::deep_copy(m, h);
  return m;
}

std::vector<double> random_values(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

}  // namespace

TEST_CASE("rotary_embedding and grouped-query attention pass the gradient checker (f64)") {
  SUBCASE("RoPE, 4 query heads, 2 key/value heads, head_dim 4, windows of 3") {
    check_layer(rotary_embedding<"rope">(4, 2, 4, 3, 10000.0), {.rows = 6});
  }
  SUBCASE("RoPE, theta 500000, one head of 6") { check_layer(rotary_embedding<"rope">(1, 1, 6, 2, 500000.0), {.rows = 4}); }
  SUBCASE("attention, 4 query heads sharing 2 key/value heads") {
    check_layer(causal_self_attention<"gqa">(8, 4, 3, 2), {.rows = 6});
  }
  SUBCASE("attention, 4 query heads sharing 1 key/value head (multi-query)") {
    check_layer(causal_self_attention<"mqa">(8, 4, 3, 1), {.rows = 6});
  }
  SUBCASE("attention, kv_heads = heads (multi-head)") { check_layer(causal_self_attention<"mha">(8, 4, 3, 4), {.rows = 6}); }
  SUBCASE("blocked attention (windows of 130 >= blocked_from_seq_len: three query blocks), 4 query heads sharing 2") {
    REQUIRE(nn::causal_self_attention<double>(8, 4, 130, 2).method() == nn::attention_method::blocked);
    check_layer(causal_self_attention<"gqa_blocked">(8, 4, 130, 2), {.rows = 130});
  }
}

TEST_CASE("RoPE turns pair (i, i + hd/2) of every q and k head by t · theta^(-2i/hd), copies v") {
  // heads 1, kv_heads 1, hd 4: a row is [q0 q1 q2 q3 | k0 k1 k2 k3 | v0 v1 v2 v3]; windows of 2 rows.
  nn::rotary_embedding<double> rope(1, 1, 4, 2, 10000.0);
  std::vector<double> x(2 * 12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = double(i % 12 + 1);
  nn::matrix<double> y("y", 2, 12);
  rope.forward(matrix_of(2, 12, x), y);
  const auto out = host_of(y);
  for (std::size_t c = 0; c < 12; ++c) CHECK(out[c] == x[c]);  // t = 0: no turn
  // t = 1: pair (0, 2) by 1 rad, pair (1, 3) by 10000^(-1/2) = 0.01 rad.
  for (std::size_t head : {0u, 4u}) {
    const double* in = &x[12 + head];
    const double a0 = 1.0, a1 = 0.01;
    CHECK(out[12 + head + 0] == doctest::Approx(in[0] * std::cos(a0) - in[2] * std::sin(a0)).epsilon(1e-14));
    CHECK(out[12 + head + 2] == doctest::Approx(in[2] * std::cos(a0) + in[0] * std::sin(a0)).epsilon(1e-14));
    CHECK(out[12 + head + 1] == doctest::Approx(in[1] * std::cos(a1) - in[3] * std::sin(a1)).epsilon(1e-14));
    CHECK(out[12 + head + 3] == doctest::Approx(in[3] * std::cos(a1) + in[1] * std::sin(a1)).epsilon(1e-14));
  }
  for (std::size_t c = 8; c < 12; ++c) CHECK(out[12 + c] == x[12 + c]);  // v
  // backward is the inverse turn: backward(forward(x)) = x.
  nn::matrix<double> back("back", 2, 12);
  rope.backward(y, back);
  const auto round_trip = host_of(back);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(round_trip[i] == doctest::Approx(x[i]).epsilon(1e-14));
  CHECK_THROWS_WITH_AS(rope.forward(matrix_of(3, 12, std::vector<double>(36)), nn::matrix<double>("y", 3, 12)),
                       "rotary_embedding::forward: rows = 3 is not a multiple of seq_len = 2", std::invalid_argument);
}

TEST_CASE("grouped-query attention equals multi-head attention over repeated key/value heads, gradients summed per group") {
  // heads 4, kv_heads 2 (group 2), hd 3, windows of 4 rows, 2 windows. Query head h reads kv head h / 2.
  const std::size_t heads = 4, kv = 2, hd = 3, seq = 4, rows = 8, dim = heads * hd;
  const std::size_t gqa_in = (heads + 2 * kv) * hd, mha_in = 3 * dim;
  const auto x = random_values(rows * gqa_in, 1), dy = random_values(rows * dim, 2);
  // The repeated input: [q | k_0 k_0 k_1 k_1 | v_0 v_0 v_1 v_1].
  std::vector<double> repeated(rows * mha_in);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t part = 0; part < 3; ++part)
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t c = 0; c < hd; ++c) {
          const std::size_t from = part == 0 ? h * hd + c : (heads + (part - 1) * kv + h / 2) * hd + c;
          repeated[r * mha_in + part * dim + h * hd + c] = x[r * gqa_in + from];
        }
  nn::causal_self_attention<double> gqa(dim, heads, seq, kv), mha(dim, heads, seq);
  auto gqa_cache = gqa.make_cache(rows);
  auto mha_cache = mha.make_cache(rows);
  nn::matrix<double> y_gqa("y", rows, dim), y_mha("y", rows, dim), dx_gqa("dx", rows, gqa_in), dx_mha("dx", rows, mha_in);
  const auto x_gqa = matrix_of(rows, gqa_in, x), x_mha = matrix_of(rows, mha_in, repeated), dy_view = matrix_of(rows, dim, dy);
  gqa.forward({}, x_gqa, y_gqa, gqa_cache);
  mha.forward({}, x_mha, y_mha, mha_cache);
  const auto a = host_of(y_gqa), b = host_of(y_mha);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-14));
  gqa.backward({}, {}, gqa_cache, dy_view, dx_gqa);
  mha.backward({}, {}, mha_cache, dy_view, dx_mha);
  const auto g = host_of(dx_gqa), m = host_of(dx_mha);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < dim; ++c) CHECK(g[r * gqa_in + c] == doctest::Approx(m[r * mha_in + c]).epsilon(1e-13));
    for (std::size_t part = 1; part < 3; ++part)
      for (std::size_t j = 0; j < kv; ++j)
        for (std::size_t c = 0; c < hd; ++c) {
          const double sum = m[r * mha_in + part * dim + (2 * j) * hd + c] + m[r * mha_in + part * dim + (2 * j + 1) * hd + c];
          CHECK(g[r * gqa_in + (heads + (part - 1) * kv + j) * hd + c] == doctest::Approx(sum).epsilon(1e-13));
        }
  }
  CHECK(gqa.in_features() == gqa_in);
  CHECK_THROWS_WITH_AS(nn::causal_self_attention<double>(12, 4, 4, 3), "causal_self_attention: kv_heads = 3 must divide heads = 4",
                       std::invalid_argument);
}
