// Must NOT compile: two sharding policies for one fsdp<...>.
#include <kfsdp/fsdp/policies.hpp>
constexpr auto chosen = kfsdp::detail::fsdp_policies<kfsdp::zero2, kfsdp::zero3>::sharding;
int main() { return static_cast<int>(chosen); }
