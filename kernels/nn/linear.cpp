// Explicit instantiations of kfsdp::nn::linear for float and double.
#include <kfsdp/nn/detail/linear_impl.hpp>

namespace kfsdp::nn {
template class linear<float>;
template class linear<double>;
}  // namespace kfsdp::nn
