// LD_PRELOAD shim for tests: a rename() onto the path KFSDP_TEST_SLOW_RENAME_TO sleeps
// KFSDP_TEST_SLOW_RENAME seconds first, so a checkpoint (written to a temporary name, then renamed
// into place) takes that long to complete.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" int rename(const char* from, const char* to) {
  using rename_function = int (*)(const char*, const char*);
  static const auto next = reinterpret_cast<rename_function>(dlsym(RTLD_NEXT, "rename"));
  const char* seconds = std::getenv("KFSDP_TEST_SLOW_RENAME");
  const char* slow_path = std::getenv("KFSDP_TEST_SLOW_RENAME_TO");
  if (seconds != nullptr && slow_path != nullptr && std::strcmp(to, slow_path) == 0) sleep(unsigned(std::atoi(seconds)));
  return next(from, to);
}
