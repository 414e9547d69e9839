#include <kfsdp/environment.hpp>

#include <Kokkos_Core.hpp>

namespace kfsdp {

environment::environment(int& argc, char** argv) {
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize(argc, argv);
    owns_ = true;
  }
}

environment::environment() {
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize();
    owns_ = true;
  }
}

environment::~environment() {
  if (owns_) Kokkos::finalize();
}

}  // namespace kfsdp
