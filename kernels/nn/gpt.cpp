// Explicit instantiations of kfsdp::nn::gpt and its helpers for float and double.
#include <kfsdp/nn/detail/gpt_impl.hpp>

namespace kfsdp::nn {

void gpt_config::validate() const {
  auto require_positive = [](std::size_t value, const char* name) {
    if (value == 0) throw std::invalid_argument(std::string("gpt_config: ") + name + " must be > 0");
  };
  require_positive(layers, "layers");
  require_positive(dim, "dim");
  require_positive(heads, "heads");
  require_positive(seq_len, "seq_len");
  require_positive(vocab, "vocab");
  if (dim % heads != 0)
    throw std::invalid_argument("gpt_config: heads = " + std::to_string(heads) +
                                " must divide dim = " + std::to_string(dim));
}

template class gpt<float>;
template class gpt<double>;
template gpt_tensors<float> allocate_gpt_tensors<float>(const gpt_config&);
template gpt_tensors<double> allocate_gpt_tensors<double>(const gpt_config&);
template void fill_zero<float>(const gpt_tensors<float>&);
template void fill_zero<double>(const gpt_tensors<double>&);
template void init_gpt2<float>(const gpt_tensors<float>&, const gpt_config&, std::uint64_t);
template void init_gpt2<double>(const gpt_tensors<double>&, const gpt_config&, std::uint64_t);
template std::vector<int> generate<float>(
    const gpt_config&, const std::function<gpt_stage_tensors<const float>(std::size_t)>&,
    std::vector<int>, std::size_t, sampling);
template std::vector<int> generate<double>(
    const gpt_config&, const std::function<gpt_stage_tensors<const double>(std::size_t)>&,
    std::vector<int>, std::size_t, sampling);
template std::string generate<float>(const gpt_config&, const gpt_tensors<const float>&,
                                     std::string_view, std::size_t, sampling);
template std::string generate<double>(const gpt_config&, const gpt_tensors<const double>&,
                                      std::string_view, std::size_t, sampling);
}  // namespace kfsdp::nn
