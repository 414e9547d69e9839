// The run-time Llama's network (make_llama's descriptor type) for float and double, compiled once here.
#include <kfsdp/train/llama.hpp>

namespace kfsdp {
template class network<llama_descriptor, float>;
template class network<llama_descriptor, double>;
}  // namespace kfsdp
