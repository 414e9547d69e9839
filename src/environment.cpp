#include <kfsdp/environment.hpp>

#include <string_view>
#include <vector>

#include <Kokkos_Core.hpp>

namespace kfsdp {

namespace {
// --help and -h belong to the program: Kokkos would print its own 40-line help for them first.
bool program_help(const char* arg) {
  const std::string_view a(arg);
  return a == "--help" || a == "-h";
}
}  // namespace

// Kokkos::ScopeGuard refuses to start a Kokkos that is already up (Kokkos 4); so the guard is made
// only where this environment is the first. Kokkos sees every argument but the program's help
// flags, and takes out its own (--kokkos-*); argv keeps the rest, help flags in place.
//   argv {prog, --kokkos-disable-warnings, --help, --steps, 5} -> {prog, --help, --steps, 5}
environment::environment(int& argc, char** argv) {
  if (Kokkos::is_initialized()) return;
  std::vector<char*> for_kokkos;
  for (int i = 0; i < argc; ++i)
    if (i == 0 || !program_help(argv[i])) for_kokkos.push_back(argv[i]);
  int kokkos_argc = int(for_kokkos.size());
  for_kokkos.push_back(nullptr);
  kokkos_ = std::make_unique<Kokkos::ScopeGuard>(kokkos_argc, for_kokkos.data());
  int kept = 0, next = 0;  // for_kokkos[0, kokkos_argc) is what Kokkos left, in argv's order
  for (int i = 0; i < argc; ++i)
    if ((i > 0 && program_help(argv[i])) || (next < kokkos_argc && argv[i] == for_kokkos[std::size_t(next)])) {
      if (!(i > 0 && program_help(argv[i]))) ++next;
      argv[kept++] = argv[i];
    }
  if (kept < argc) argv[kept] = nullptr;
  argc = kept;
}

environment::environment() {
  if (!Kokkos::is_initialized()) kokkos_ = std::make_unique<Kokkos::ScopeGuard>();
}

environment::~environment() = default;

}  // namespace kfsdp
