// Explicit instantiations of kfsdp::nn::gelu for float and double.
#include <kfsdp/nn/detail/gelu_impl.hpp>

namespace kfsdp::nn {
template class gelu<float>;
template class gelu<double>;
}  // namespace kfsdp::nn
