// Tests of include/kfsdp/nn/mlp.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/layer.hpp>
#include <kfsdp/nn/mlp.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

static_assert(layer<mlp<double>>);

TEST_CASE("mlp forward, by hand: one feature, hidden 1") {
  // y = c_proj(gelu(c_fc(x))) with scalars: x = 1, fc w = 2, b = -1 → gelu(1); proj w = 3, b = 0.5
  mlp<double> net(1, 1);
  matrix<double> x("x", 1, 1), y("y", 1, 1), fw("fw", 1, 1), pw("pw", 1, 1);
  vector<double> fb("fb", 1), pb("pb", 1);
  set_entry(x, 0, 1), set_entry(fw, 0, 2), set_entry(fb, 0, -1), set_entry(pw, 0, 3),
      set_entry(pb, 0, 0.5);
  auto cache = net.make_cache(1);
  net.forward({{fw, fb}, {pw, pb}}, x, y, cache);
  CHECK(entry(y, 0) == doctest::Approx(3 * 0.8413447460685429 + 0.5));
}

TEST_CASE("mlp backward matches central differences (double)") {
  const std::size_t rows = 3, dim = 4;
  mlp<double> net(dim);
  auto x = random_matrix<double>(rows, dim, 1);
  mlp_tensors<double> p{{random_matrix<double>(4 * dim, dim, 2), random_vector<double>(4 * dim, 3)},
                        {random_matrix<double>(dim, 4 * dim, 4), random_vector<double>(dim, 5)}};
  mlp_tensors<double> g{{matrix<double>("a", 4 * dim, dim), vector<double>("b", 4 * dim)},
                        {matrix<double>("c", dim, 4 * dim), vector<double>("d", dim)}};
  auto dy = random_matrix<double>(rows, dim, 6);
  matrix<double> y("y", rows, dim), dx("dx", rows, dim);
  auto cache = net.make_cache(rows);
  auto loss = [&] {
    net.forward(p, x, y, cache);
    return weighted_sum(y, dy);
  };
  loss();
  net.backward(p, g, cache, dy, dx);
  check_gradient("dx", x, dx, loss);
  check_gradient("c_fc.weight", p.c_fc.weight, g.c_fc.weight, loss);
  check_gradient("c_fc.bias", p.c_fc.bias, g.c_fc.bias, loss);
  check_gradient("c_proj.weight", p.c_proj.weight, g.c_proj.weight, loss);
  check_gradient("c_proj.bias", p.c_proj.bias, g.c_proj.bias, loss);
}
