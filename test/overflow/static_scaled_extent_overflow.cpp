// Must not compile: a GPT whose static dim makes its MLP (4 · dim) wider than 2^64.
#include <kfsdp/model/gpt.hpp>

constexpr std::size_t wide = kfsdp::scaled_extent<4, (std::size_t(1) << 62)>;
