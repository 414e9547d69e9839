// Explicit instantiations of kfsdp::nn::mse_loss for float and double.
#include <kfsdp/nn/detail/mse_impl.hpp>

namespace kfsdp::nn {
template class mse_loss<float>;
template class mse_loss<double>;
}  // namespace kfsdp::nn
