// Explicit instantiations of kfsdp::nn::layer_norm for float and double.
#include <kfsdp/nn/detail/layer_norm_impl.hpp>

namespace kfsdp::nn {
template class layer_norm<float>;
template class layer_norm<double>;
}  // namespace kfsdp::nn
