// Explicit instantiations of kfsdp::nn::activation for float and double, and the kind names.
#include <kfsdp/nn/detail/activation_impl.hpp>

#include <stdexcept>
#include <string>

namespace kfsdp::nn {

namespace {
constexpr activation_kind all_kinds[] = {activation_kind::gelu, activation_kind::gelu_tanh,
                                         activation_kind::relu, activation_kind::silu,
                                         activation_kind::tanh};
}  // namespace

const char* name(activation_kind kind) {
  switch (kind) {
    case activation_kind::gelu: return "gelu";
    case activation_kind::gelu_tanh: return "gelu_tanh";
    case activation_kind::relu: return "relu";
    case activation_kind::silu: return "silu";
    case activation_kind::tanh: return "tanh";
  }
  return "unknown";
}

activation_kind parse_activation(std::string_view text) {
  for (activation_kind kind : all_kinds)
    if (text == name(kind)) return kind;
  throw std::invalid_argument("kfsdp: activation '" + std::string(text) +
                              "' is not one of gelu, gelu_tanh, relu, silu, tanh");
}

template class activation<float>;
template class activation<double>;

}  // namespace kfsdp::nn
