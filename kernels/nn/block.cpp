// Explicit instantiations of kfsdp::nn::transformer_block for float and double.
#include <kfsdp/nn/detail/block_impl.hpp>

namespace kfsdp::nn {
template class transformer_block<float>;
template class transformer_block<double>;
}  // namespace kfsdp::nn
