#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::environment — starts and stops Kokkos exactly once for a program (RAII).
//
//   int main(int argc, char** argv) {
//     kfsdp::environment env(argc, argv);   // a Kokkos::ScopeGuard, or nothing if Kokkos is already up
//     ...                                    // views may live here
//   }                                        // Kokkos::finalize if this guard started it

#include <memory>

namespace Kokkos {
class ScopeGuard;
}

namespace kfsdp {

KFSDP_EXPORT class environment {
 public:
  environment(int& argc, char** argv);
  environment();
  ~environment();
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  // True when this guard initialised Kokkos (and so will finalize it).
  [[nodiscard]] bool owns_kokkos() const noexcept { return kokkos_ != nullptr; }

 private:
  std::unique_ptr<Kokkos::ScopeGuard> kokkos_;  // Kokkos' own guard, where this one started it
};

}  // namespace kfsdp
