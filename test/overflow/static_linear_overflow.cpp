// Must not compile: a static linear whose weight cannot exist (2^62 · 8 doubles).
#include <kfsdp/compute/ops.hpp>

using too_wide = kfsdp::linear<"fc", (std::size_t(1) << 62), 8>;
kfsdp::compute_t<too_wide, double>* op = nullptr;
