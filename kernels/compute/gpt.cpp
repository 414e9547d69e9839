// The example GPT's network (make_gpt's descriptor type) for float and double, compiled once here.
#include <kfsdp/compute/network.hpp>
#include <kfsdp/model/gpt.hpp>

namespace kfsdp {
template class network<gpt_descriptor, float>;
template class network<gpt_descriptor, double>;
}  // namespace kfsdp
