#include <kfsdp/environment.hpp>

#include <Kokkos_Core.hpp>

namespace kfsdp {

// Kokkos::ScopeGuard refuses to start a Kokkos that is already up (Kokkos 4); so the guard is made
// only where this environment is the first.
environment::environment(int& argc, char** argv) {
  if (!Kokkos::is_initialized()) kokkos_ = std::make_unique<Kokkos::ScopeGuard>(argc, argv);
}

environment::environment() {
  if (!Kokkos::is_initialized()) kokkos_ = std::make_unique<Kokkos::ScopeGuard>();
}

environment::~environment() = default;

}  // namespace kfsdp
