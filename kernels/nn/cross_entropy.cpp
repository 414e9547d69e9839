// Explicit instantiations of kfsdp::nn::cross_entropy for float and double.
#include <kfsdp/nn/detail/cross_entropy_impl.hpp>

namespace kfsdp::nn {
template class cross_entropy<float>;
template class cross_entropy<double>;
}  // namespace kfsdp::nn
