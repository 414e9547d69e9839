// Must not compile: a linear layer gives features, an embedding takes token ids. The error names
// the two layers (check_chain<kfsdp::linear<"fc", ...>, kfsdp::embedding<"wte", ...>>).
#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>

using mismatched = kfsdp::sequential<"", kfsdp::linear<"fc", 4, 8>, kfsdp::embedding<"wte", 10, 8>>;
mismatched model;

int main() { return 0; }
