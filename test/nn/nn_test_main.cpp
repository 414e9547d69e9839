// doctest main for the nn tests: Kokkos is up for the whole run (kfsdp::environment).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <kfsdp/environment.hpp>

int main(int argc, char** argv) {
  kfsdp::environment env(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
