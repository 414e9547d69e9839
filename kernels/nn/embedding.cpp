// Explicit instantiations of kfsdp::nn::embedding for float and double.
#include <kfsdp/nn/detail/embedding_impl.hpp>

namespace kfsdp::nn {
template class embedding<float>;
template class embedding<double>;
}  // namespace kfsdp::nn
