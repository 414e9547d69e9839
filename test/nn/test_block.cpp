// Tests of include/kfsdp/nn/block.hpp.
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/block.hpp>
#include <kfsdp/nn/layer.hpp>

using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

static_assert(layer<transformer_block<double>>);

namespace {

block_tensors<double> make_block(std::size_t dim, std::uint64_t seed, bool random) {
  auto m = [&](std::size_t r, std::size_t c) {
    return random ? random_matrix<double>(r, c, seed++) : matrix<double>("g", r, c);
  };
  auto v = [&](std::size_t n) {
    return random ? random_vector<double>(n, seed++) : vector<double>("g", n);
  };
  return {{v(dim), v(dim)}, {{m(3 * dim, dim), v(3 * dim)}, {m(dim, dim), v(dim)}},
          {v(dim), v(dim)}, {{m(4 * dim, dim), v(4 * dim)}, {m(dim, 4 * dim), v(dim)}}};
}

}  // namespace

TEST_CASE("block forward with zero projections is the identity (both residual branches vanish)") {
  const std::size_t dim = 4, rows = 6;
  transformer_block<double> block(dim, 2, 3);
  auto p = make_block(dim, 1, true);
  Kokkos::deep_copy(p.attn.c_proj.weight, 0.0), Kokkos::deep_copy(p.attn.c_proj.bias, 0.0);
  Kokkos::deep_copy(p.mlp.c_proj.weight, 0.0), Kokkos::deep_copy(p.mlp.c_proj.bias, 0.0);
  auto x = random_matrix<double>(rows, dim, 20);
  matrix<double> y("y", rows, dim);
  auto cache = block.make_cache(rows);
  block.forward(p, x, y, cache);
  CHECK(to_vector(y) == to_vector(x));
}

TEST_CASE("block backward matches central differences (double), dx aliasing dy") {
  const std::size_t dim = 4, heads = 2, seq = 3, rows = 2 * seq;
  transformer_block<double> block(dim, heads, seq);
  auto p = make_block(dim, 1, true);
  auto g = make_block(dim, 0, false);
  auto x = random_matrix<double>(rows, dim, 30);
  auto weights = random_matrix<double>(rows, dim, 31);
  matrix<double> y("y", rows, dim), stream("stream", rows, dim);
  auto cache = block.make_cache(rows);
  auto loss = [&] {
    block.forward(p, x, y, cache);
    return weighted_sum(y, weights);
  };
  loss();
  Kokkos::deep_copy(stream, weights);
  block.backward(p, g, cache, stream, stream);  // in place, as gpt runs it
  check_gradient("dx", x, stream, loss);
  check_gradient("ln_1.weight", p.ln_1.weight, g.ln_1.weight, loss);
  check_gradient("ln_1.bias", p.ln_1.bias, g.ln_1.bias, loss);
  check_gradient("attn.c_attn.weight", p.attn.c_attn.weight, g.attn.c_attn.weight, loss);
  check_gradient("attn.c_attn.bias", p.attn.c_attn.bias, g.attn.c_attn.bias, loss);
  check_gradient("attn.c_proj.weight", p.attn.c_proj.weight, g.attn.c_proj.weight, loss);
  check_gradient("attn.c_proj.bias", p.attn.c_proj.bias, g.attn.c_proj.bias, loss);
  check_gradient("ln_2.weight", p.ln_2.weight, g.ln_2.weight, loss);
  check_gradient("ln_2.bias", p.ln_2.bias, g.ln_2.bias, loss);
  check_gradient("mlp.c_fc.weight", p.mlp.c_fc.weight, g.mlp.c_fc.weight, loss);
  check_gradient("mlp.c_fc.bias", p.mlp.c_fc.bias, g.mlp.c_fc.bias, loss);
  check_gradient("mlp.c_proj.weight", p.mlp.c_proj.weight, g.mlp.c_proj.weight, loss);
  check_gradient("mlp.c_proj.bias", p.mlp.c_proj.bias, g.mlp.c_proj.bias, loss);
}
