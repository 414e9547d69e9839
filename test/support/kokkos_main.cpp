// A doctest main for tests that need Kokkos: kfsdp::environment around the whole session.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <kfsdp/environment.hpp>

int main(int argc, char** argv) {
  kfsdp::environment kokkos(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
