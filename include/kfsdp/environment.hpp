#pragma once
// kfsdp::environment — starts and stops Kokkos exactly once for a program (RAII).
//
//   int main(int argc, char** argv) {
//     kfsdp::environment env(argc, argv);   // Kokkos::initialize, or nothing if already up
//     ...                                    // views may live here
//   }                                        // Kokkos::finalize if this guard started it

namespace kfsdp {

class environment {
 public:
  environment(int& argc, char** argv);
  environment();
  ~environment();
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  // True when this guard initialised Kokkos (and so will finalize it).
  [[nodiscard]] bool owns_kokkos() const noexcept { return owns_; }

 private:
  bool owns_ = false;
};

}  // namespace kfsdp
