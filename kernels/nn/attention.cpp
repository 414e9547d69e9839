// Explicit instantiations of kfsdp::nn::causal_self_attention for float and double.
#include <kfsdp/nn/detail/attention_impl.hpp>

namespace kfsdp::nn {
template class causal_self_attention<float>;
template class causal_self_attention<double>;
}  // namespace kfsdp::nn
