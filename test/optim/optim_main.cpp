// doctest main for the optimizer tests: Kokkos is up for the whole run (views live in test cases).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <kfsdp/environment.hpp>

int main(int argc, char** argv) {
  kfsdp::environment kokkos(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
