// Tests of include/kfsdp/nn/embedding.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/embedding.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

TEST_CASE("embedding forward picks rows; forward_add adds them") {
  auto w = random_matrix<double>(5, 3, 1);
  auto ids = ids_from({4, 0, 4});
  matrix<double> y("y", 3, 3);
  embedding<double> table(5, 3);
  auto cache = table.make_cache(3);
  table.forward({w}, ids, y, cache);
  CHECK(entry(y, 0) == entry(w, 12));
  CHECK(entry(y, 4) == entry(w, 1));
  table.forward_add({w}, ids, y, cache);
  CHECK(entry(y, 7) == doctest::Approx(2 * entry(w, 13)));
}

TEST_CASE("embedding backward scatter-adds, repeated ids summed, matches central differences") {
  const std::size_t rows = 6, num = 4, dim = 3;
  embedding<double> table(num, dim);
  auto w = random_matrix<double>(num, dim, 2);
  auto ids = ids_from({1, 3, 1, 0, 1, 3});  // row 2 never used: gradient stays 0
  auto dy = random_matrix<double>(rows, dim, 3);
  matrix<double> y("y", rows, dim), dw("dw", num, dim);
  auto cache = table.make_cache(rows);
  auto loss = [&] {
    table.forward({w}, ids, y, cache);
    return weighted_sum(y, dy);
  };
  loss();
  table.backward({dw}, cache, dy);
  check_gradient("dweight", w, dw, loss);
  CHECK(entry(dw, 2 * dim) == 0.0);
  CHECK(entry(dw, 1 * dim) == entry(dy, 0) + entry(dy, 2 * dim) + entry(dy, 4 * dim));
}

TEST_CASE("embedding rejects ids out of range") {
  embedding<double> table(4, 2);
  matrix<double> w("w", 4, 2), y("y", 2, 2);
  auto cache = table.make_cache(2);
  CHECK_THROWS_WITH_AS(table.forward({w}, ids_from({0, 4}), y, cache),
                       "embedding::forward: ids has 1 entries outside [0, 4)", std::out_of_range);
}
