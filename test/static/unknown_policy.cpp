// Must NOT compile: a type that is not an fsdp policy.
#include <kfsdp/fsdp/policies.hpp>
constexpr auto chosen = kfsdp::detail::fsdp_policies<kfsdp::zero3, int>::sharding;
int main() { return static_cast<int>(chosen); }
