#pragma once
// kfsdp::reference::activation, one of the hand-written kernels that the derived ones replaced: the
// reference test/expr compares them with and bench_derived times them against. An elementwise
// activation chosen at run time:
//   gelu       0.5 x (1 + erf(x/√2))                 (nanoGPT's nn.GELU())
//   gelu_tanh  0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³)))   (PyTorch's approximate='tanh')
//   relu       max(x, 0)                              (gradient 0 at x = 0, as PyTorch)
//   silu       x · sigmoid(x)
//   tanh       tanh(x)
//
//   kfsdp::reference::activation<double> act(kfsdp::reference::parse_activation("silu"), /*features=*/256);
//   act.forward(x, y);           // y = f(x)
//   act.backward(x, dy, dx);     // dx = dy · f'(x); dx may be dy itself (in place)
//
// Stateless: the caller keeps x for backward. Conventions: see kfsdp/nn/views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>
#include <string_view>

namespace kfsdp::reference {

enum class activation_kind { gelu, gelu_tanh, relu, silu, tanh };

// "gelu", "gelu_tanh", ...; parse_activation is its inverse and throws std::invalid_argument.
const char* name(activation_kind kind);
activation_kind parse_activation(std::string_view text);

template <class Scalar>
class activation {
 public:
  using scalar_type = Scalar;

  activation(activation_kind kind, std::size_t features);

  // x, y: [rows, features].
  void forward(nn::const_matrix<Scalar> x, nn::matrix<Scalar> y) const;
  // x, dy, dx: [rows, features]; dx overwritten, may alias dy.
  void backward(nn::const_matrix<Scalar> x, nn::const_matrix<Scalar> dy, nn::matrix<Scalar> dx) const;

  [[nodiscard]] activation_kind kind() const noexcept { return kind_; }
  [[nodiscard]] std::size_t features() const noexcept { return features_; }

 private:
  activation_kind kind_;
  std::size_t features_;
};

extern template class activation<float>;
extern template class activation<double>;

}  // namespace kfsdp::reference
