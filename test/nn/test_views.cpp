// Tests of include/kfsdp/nn/views.hpp.
#include "nn_test_helpers.hpp"

using namespace kfsdp::nn;

TEST_CASE("shape errors name the parameter, the shape seen and the shape expected") {
  matrix<double> m("m", 2, 3);
  CHECK_NOTHROW(detail::check_matrix("f", "m", m, 2, 3));
  CHECK_THROWS_WITH_AS(detail::check_matrix("f", "m", m, 3, 2),
                       "f: m has shape [2, 3], expected [3, 2]", std::invalid_argument);
  CHECK(detail::shape_string({1, 2, 3, 4}) == "[1, 2, 3, 4]");
}

TEST_CASE("views are LayoutRight: row-major like PyTorch") {
  matrix<double> m("m", 2, 3);
  CHECK(&m(1, 0) - &m(0, 0) == 3);
}
