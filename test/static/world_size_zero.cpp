// Must NOT compile: a static plan at world size 0.
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/containers.hpp>
#include <kfsdp/plan/shard_plan.hpp>
using m = kfsdp::sequential<"", kfsdp::linear<"fc", 4, 2>>;
constexpr auto& plan = kfsdp::static_shard_plan<m, 0, kfsdp::bucketing::layer>;
int main() { return static_cast<int>(plan.shard_numel); }
