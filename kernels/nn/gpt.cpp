// Explicit instantiations of kfsdp::nn::gpt and its helpers for float and double.
#include <kfsdp/nn/detail/gpt_impl.hpp>

namespace kfsdp::nn {

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
