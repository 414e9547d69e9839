// The example GPT's network (make_gpt's descriptor type) for float and double, compiled once here.
#include <kfsdp/train/gpt.hpp>

namespace kfsdp {
template class network<gpt_descriptor, float>;
template class network<gpt_descriptor, double>;
}  // namespace kfsdp
