// Tests of include/kfsdp/nn/linear.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/linear.hpp>

#include <chrono>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;


TEST_CASE("linear forward: y = x W^T + b, by hand") {
  matrix<double> x("x", 2, 3), w("w", 2, 3);
  vector<double> b("b", 2);
  auto hx = Kokkos::create_mirror_view(x);
  auto hw = Kokkos::create_mirror_view(w);
  auto hb = Kokkos::create_mirror_view(b);
  const double xs[2][3] = {{1, 2, 3}, {-1, 0, 2}};
  const double ws[2][3] = {{0.5, -1, 2}, {1, 1, 1}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) hx(i, j) = xs[i][j], hw(i, j) = ws[i][j];
  hb(0) = 0.25, hb(1) = -2;
  Kokkos::deep_copy(x, hx), Kokkos::deep_copy(w, hw), Kokkos::deep_copy(b, hb);
  linear<double> fc(3, 2);
  matrix<double> y("y", 2, 2);
  auto cache = fc.make_cache(2);
  fc.forward({w, b}, x, y, cache);
  // row 0: 0.5 - 2 + 6 + 0.25 = 4.75, 1 + 2 + 3 - 2 = 4; row 1: -0.5 + 0 + 4 + 0.25, -1 + 0 + 2 - 2
  const auto got = to_vector(y);
  CHECK(got[0] == doctest::Approx(4.75));
  CHECK(got[1] == doctest::Approx(4.0));
  CHECK(got[2] == doctest::Approx(3.75));
  CHECK(got[3] == doctest::Approx(-1.0));
}

static void check_linear_gradients(bool has_bias) {
  const std::size_t rows = 4, in = 3, out = 5;
  linear<double> fc(in, out, has_bias);
  auto x = random_matrix<double>(rows, in, 1);
  auto w = random_matrix<double>(out, in, 2);
  vector<double> b = has_bias ? random_vector<double>(out, 3) : vector<double>();
  auto weights = random_matrix<double>(rows, out, 4);  // dy
  matrix<double> y("y", rows, out), dx("dx", rows, in), dw("dw", out, in);
  vector<double> db("db", has_bias ? out : 0);
  auto cache = fc.make_cache(rows);
  auto loss = [&] {
    fc.forward({w, b}, x, y, cache);
    return weighted_sum(y, weights);
  };
  loss();
  fc.backward({w, b}, {dw, db}, cache, weights, dx);
  check_gradient("dx", x, dx, loss);
  check_gradient("dweight", w, dw, loss);
  if (has_bias) check_gradient("dbias", b, db, loss);
}

TEST_CASE("linear backward matches central differences (double)") {
  SUBCASE("with bias") { check_linear_gradients(true); }
  SUBCASE("without bias") { check_linear_gradients(false); }
}

TEST_CASE("linear backward: the bias gradient is each column's sum of dy, rows added in order, any width") {
  for (const std::size_t out : {1, 31, 32, 70}) {  // column blocks of 32: fewer, exactly one, a ragged last one
    CAPTURE(out);
    const std::size_t rows = 9, in = 3;
    linear<double> fc(in, out);
    auto x = random_matrix<double>(rows, in, 1);
    auto w = random_matrix<double>(out, in, 2);
    auto b = random_vector<double>(out, 3);
    auto dy = random_matrix<double>(rows, out, 4);
    auto db = random_vector<double>(out, 5);  // backward adds into it
    matrix<double> y("y", rows, out), dw("dw", out, in);
    const auto before = to_vector(db), dy_host = to_vector(dy);
    auto cache = fc.make_cache(rows);
    fc.forward({w, b}, x, y, cache);
    fc.backward({w, b}, {dw, db}, cache, dy, matrix<double>());
    const auto got = to_vector(db);
    for (std::size_t c = 0; c < out; ++c) {
      double sum = 0;
      for (std::size_t r = 0; r < rows; ++r) sum += dy_host[r * out + c];
      CHECK(got[c] == before[c] + sum);  // the same bits as the plain loop
    }
  }
}

TEST_CASE("linear backward accumulates into parameter gradients, overwrites dx") {
  linear<double> fc(3, 2);
  auto x = random_matrix<double>(4, 3, 5);
  auto w = random_matrix<double>(2, 3, 6);
  auto b = random_vector<double>(2, 7);
  auto dy = random_matrix<double>(4, 2, 8);
  matrix<double> y("y", 4, 2), dx("dx", 4, 3), dw("dw", 2, 3);
  vector<double> db("db", 2);
  auto cache = fc.make_cache(4);
  fc.forward({w, b}, x, y, cache);
  fc.backward({w, b}, {dw, db}, cache, dy, dx);
  const auto once_w = to_vector(dw), once_b = to_vector(db), once_x = to_vector(dx);
  fc.backward({w, b}, {dw, db}, cache, dy, dx);
  const auto twice_w = to_vector(dw), twice_b = to_vector(db), twice_x = to_vector(dx);
  for (std::size_t i = 0; i < once_w.size(); ++i) CHECK(twice_w[i] == doctest::Approx(2 * once_w[i]));
  for (std::size_t i = 0; i < once_b.size(); ++i) CHECK(twice_b[i] == doctest::Approx(2 * once_b[i]));
  for (std::size_t i = 0; i < once_x.size(); ++i) CHECK(twice_x[i] == once_x[i]);
}

TEST_CASE("linear backward with an empty dx computes no input gradient, the same parameter gradients") {
  linear<double> fc(3, 2);
  auto x = random_matrix<double>(4, 3, 5);
  auto w = random_matrix<double>(2, 3, 6);
  auto b = random_vector<double>(2, 7);
  auto dy = random_matrix<double>(4, 2, 8);
  matrix<double> y("y", 4, 2), dx("dx", 4, 3), dw("dw", 2, 3), dw_skip("dw_skip", 2, 3);
  vector<double> db("db", 2), db_skip("db_skip", 2);
  auto cache = fc.make_cache(4);
  fc.forward({w, b}, x, y, cache);
  fc.backward({w, b}, {dw, db}, cache, dy, dx);
  fc.backward({w, b}, {dw_skip, db_skip}, cache, dy, matrix<double>{});  // the first layer: x is data
  CHECK(to_vector(dw_skip) == to_vector(dw));
  CHECK(to_vector(db_skip) == to_vector(db));
}

TEST_CASE("linear rejects bad shapes, naming the parameter") {
  linear<double> fc(3, 2);
  matrix<double> x("x", 4, 3), wrong_w("w", 3, 2), y("y", 4, 2);
  vector<double> b("b", 2);
  auto cache = fc.make_cache(4);
  CHECK_THROWS_WITH_AS(fc.forward({wrong_w, b}, x, y, cache),
                       "linear::forward: weight has shape [3, 2], expected [2, 3]",
                       std::invalid_argument);
  matrix<double> w("w", 2, 3), wrong_y("y", 4, 3);
  CHECK_THROWS_WITH_AS(fc.forward({w, b}, x, wrong_y, cache),
                       "linear::forward: y has shape [4, 3], expected [4, 2]",
                       std::invalid_argument);
}

TEST_CASE("linear in float agrees with double") {
  linear<double> fc_d(8, 6);
  linear<float> fc_f(8, 6);
  auto x = random_matrix<double>(5, 8, 9);
  auto w = random_matrix<double>(6, 8, 10);
  auto b = random_vector<double>(6, 11);
  matrix<float> xf("x", 5, 8), wf("w", 6, 8), yf("y", 5, 6);
  vector<float> bf("b", 6);
  auto hx = to_vector(x), hw = to_vector(w), hb = to_vector(b);
  for (std::size_t i = 0; i < hx.size(); ++i) set_entry(xf, i, hx[i]);
  for (std::size_t i = 0; i < hw.size(); ++i) set_entry(wf, i, hw[i]);
  for (std::size_t i = 0; i < hb.size(); ++i) set_entry(bf, i, hb[i]);
  matrix<double> y("y", 5, 6);
  auto cd = fc_d.make_cache(5);
  auto cf = fc_f.make_cache(5);
  fc_d.forward({w, b}, x, y, cd);
  fc_f.forward({wf, bf}, xf, yf, cf);
  const auto yd = to_vector(y), yfl = to_vector(yf);
  for (std::size_t i = 0; i < yd.size(); ++i) CHECK(yfl[i] == doctest::Approx(yd[i]).epsilon(1e-5));
}

TEST_CASE("linear: a 512x512x512 float product runs at BLAS speed") {
  const std::size_t n = 512;
  linear<float> fc(n, n, false);
  matrix<float> x("x", n, n), w("w", n, n), y("y", n, n);
  Kokkos::deep_copy(x, 1.0f);
  Kokkos::deep_copy(w, 0.5f);
  auto cache = fc.make_cache(n);
  fc.forward({w}, x, y, cache);  // warm-up
  Kokkos::fence();
  const int repeats = 5;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) fc.forward({w}, x, y, cache);
  Kokkos::fence();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      repeats;
  MESSAGE("512^3 float gemm through linear::forward: " << ms << " ms, "
                                                       << 2.0 * n * n * n / ms / 1e6 << " GFLOP/s");
  CHECK(entry(y, 0) == doctest::Approx(256.0));
}
