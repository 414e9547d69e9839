// Tests of reference/activation.hpp.
#include "../nn/nn_test_helpers.hpp"

#include <activation.hpp>

#include <numbers>

using namespace kfsdp::nn;
using namespace kfsdp::reference;
using namespace kfsdp::nn::testing;

namespace {

constexpr activation_kind kinds[] = {activation_kind::gelu, activation_kind::gelu_tanh,
                                     activation_kind::relu, activation_kind::silu,
                                     activation_kind::tanh};

// The formulas written with std:: on the host.
double reference(activation_kind kind, double x) {
  switch (kind) {
    case activation_kind::gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case activation_kind::gelu_tanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    case activation_kind::relu: return std::max(x, 0.0);
    case activation_kind::silu: return x / (1 + std::exp(-x));
    case activation_kind::tanh: return std::tanh(x);
  }
  return 0;
}

}  // namespace

TEST_CASE("activation forward matches the std:: formulas") {
  const std::vector<double> points = {-3.0, -1.0, -0.25, 0.0, 0.5, 2.0};
  matrix<double> x("x", 2, 3), y("y", 2, 3);
  for (std::size_t i = 0; i < points.size(); ++i) set_entry(x, i, points[i]);
  for (activation_kind kind : kinds) {
    INFO(std::string(name(kind)));
    activation<double>(kind, 3).forward(x, y);
    for (std::size_t i = 0; i < points.size(); ++i)
      CHECK(entry(y, i) == doctest::Approx(reference(kind, points[i])).epsilon(1e-14));
  }
  CHECK(reference(activation_kind::gelu_tanh, 1.0) == doctest::Approx(0.8411919906082768));  // PyTorch
}

TEST_CASE("activation backward matches central differences (double)") {
  for (activation_kind kind : kinds) {
    INFO(std::string(name(kind)));
    const activation<double> act(kind, 6);
    matrix<double> x("x", 4, 6), y("y", 4, 6), dx("dx", 4, 6);
    fill_uniform(x, 1, -3.0, 3.0);
    auto dy = random_matrix<double>(4, 6, 2);
    auto loss = [&] {
      act.forward(x, y);
      return weighted_sum(y, dy);
    };
    act.backward(x, dy, dx);
    check_gradient("dx", x, dx, loss);
  }
}

TEST_CASE("activation backward in place: dx may be dy") {
  for (activation_kind kind : kinds) {
    INFO(std::string(name(kind)));
    const activation<double> act(kind, 5);
    auto x = random_matrix<double>(3, 5, 5);
    auto dy = random_matrix<double>(3, 5, 6);
    matrix<double> dx("dx", 3, 5), in_place("in_place", 3, 5);
    Kokkos::deep_copy(in_place, dy);
    act.backward(x, dy, dx);
    act.backward(x, in_place, in_place);
    CHECK(to_vector(in_place) == to_vector(dx));
  }
}

TEST_CASE("activation names, parsing and shape errors") {
  for (activation_kind kind : kinds) CHECK(parse_activation(name(kind)) == kind);
  CHECK_THROWS_WITH_AS(parse_activation("swish"),
                       "kfsdp: activation 'swish' is not one of gelu, gelu_tanh, relu, silu, tanh",
                       std::invalid_argument);
  const activation<double> act(activation_kind::silu, 4);
  CHECK(act.kind() == activation_kind::silu);
  CHECK(act.features() == 4);
  matrix<double> x("x", 2, 4), y("y", 2, 3);
  CHECK_THROWS_WITH_AS(act.forward(x, y), "activation::forward: y has shape [2, 3], expected [2, 4]",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(act.backward(x, x, y),
                       "activation::backward: dx has shape [2, 3], expected [2, 4]",
                       std::invalid_argument);
}
