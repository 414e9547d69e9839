// libFuzzer target for the .npy header and .npz (zip) directory readers of kfsdp/io/data/numpy.hpp (clang builds):
//   CXX=clang++-19 meson setup build-fuzz -Dbenches=false && ninja -C build-fuzz test/io/fuzz_numpy
//   mkdir -p fuzz-work && build-fuzz/test/io/fuzz_numpy fuzz-work test/io/numpy test/io/corpus_numpy -dict=test/io/numpy.dict
// The same bytes are read as a .npy file and as an .npz archive (each of its arrays by name). Any input
// may be refused with std::invalid_argument; anything else (a crash, a sanitizer report, another
// exception, an accepted array whose values do not fill its shape) is a bug.
#include <kfsdp/io/data/numpy.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// An accepted array holds one value for each element its shape names, and a dtype numpy writes.
void check_array(const kfsdp::io::numpy_array& array) {
  std::size_t elements = 1;
  for (const std::size_t extent : array.shape)
    if (__builtin_mul_overflow(elements, extent, &elements)) __builtin_trap();
  if (array.values.size() != elements || array.dtype.size() != 3) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const unsigned char> bytes(data, size);
  try {
    check_array(kfsdp::io::detail::parse_npy(bytes, "fuzz.npy"));
  } catch (const std::invalid_argument&) {
  }
  std::vector<std::string> names;
  try {
    for (const auto& member : kfsdp::io::detail::zip_directory(bytes, "fuzz.npz")) {
      if (member.name.ends_with(".npy")) names.push_back(member.name.substr(0, member.name.size() - 4));
      if (names.size() == 8) break;
    }
  } catch (const std::invalid_argument&) {
  }
  names.push_back("absent");  // the refusal that lists the archive's arrays
  for (const std::string& name : names) {
    try {
      check_array(kfsdp::io::detail::parse_npz(bytes, name, "fuzz.npz"));
    } catch (const std::invalid_argument&) {
    }
  }
  return 0;
}
