// Explicit instantiations of kfsdp::nn::mlp for float and double.
#include <kfsdp/nn/detail/mlp_impl.hpp>

namespace kfsdp::nn {
template class mlp<float>;
template class mlp<double>;
}  // namespace kfsdp::nn
