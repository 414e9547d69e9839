// libFuzzer target for kfsdp's checks of what HDF5 reports of a dataset (hdf5_detail::open_dataset in
// kfsdp/io/data/hdf5.hpp: links, object type, filters, datatype, dims), on the input opened as an HDF5
// file image (core driver, no file on disk, no MPI). Clang builds with parallel HDF5:
//   CXX=clang++-19 meson setup build-fuzz -Dbenches=false && ninja -C build-fuzz test/io/fuzz_hdf5
//   mkdir -p fuzz-work && LSAN_OPTIONS=suppressions=test/sanitizers/lsan.supp \
//     build-fuzz/test/io/fuzz_hdf5 fuzz-work test/io/hdf5 -dict=test/io/hdf5.dict
// Any input may be refused (open_dataset's message); anything else in kfsdp's code (a crash, a sanitizer
// report, an exception, an accepted dataset of a shape or type it should have refused) is a bug.
// libhdf5 is not instrumented: the crashes inside it that test/io/fuzz_hdf5_known.txt lists (one reason
// each) do not fail io_fuzz_hdf5_bounded (test/io/fuzz_hdf5_bounded.sh).
#include <kfsdp/io/data/hdf5.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace {

using kfsdp::io::hdf5_detail::handle;

void inspect(hid_t file, const char* name) {
  kfsdp::io::hdf5_detail::checked_dataset dataset;
  const std::string refusal = kfsdp::io::hdf5_detail::open_dataset(file, "fuzz.h5", name, dataset);
  if (!refusal.empty()) return;
  if (!dataset.dataset.valid() || dataset.count == 0 || dataset.width == 0 ||
      (dataset.dtype_bytes != 2 && dataset.dtype_bytes != 4 && dataset.dtype_bytes != 8) ||
      (dataset.vector && dataset.width != 1))
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // kfsdp reports HDF5's failures itself (hdf5_dataset silences the stack the same way).
  (void)H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;  // H5Pset_file_image takes no empty image
  const handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // The core driver on a copy of the input, never written back.
  if (H5Pset_fapl_core(access.get(), 1 << 16, 0) < 0 ||
      H5Pset_file_image(access.get(), const_cast<std::uint8_t*>(data), size) < 0)
    __builtin_trap();
  const handle file(H5Fopen("fuzz.h5", H5F_ACC_RDONLY, access.get()), H5Fclose);
  if (!file.valid()) return 0;
  // The fixtures' names (test/io/hdf5/make_fixtures.py): a dataset, a vector and one in a group.
  for (const char* name : {"x", "y", "train/x", "absent"}) inspect(file.get(), name);
  return 0;
}
