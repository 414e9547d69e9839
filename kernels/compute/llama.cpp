// The run-time Llama's network (make_llama's descriptor type) for float and double, compiled once here.
#include <kfsdp/compute/network.hpp>
#include <kfsdp/model/llama.hpp>

namespace kfsdp {
template class network<llama_descriptor, float>;
template class network<llama_descriptor, double>;
}  // namespace kfsdp
