// Tests for include/kfsdp/io/data/numpy.hpp on files numpy itself wrote (test/io/numpy/make_fixtures.py):
// numpy.savez archives (zip64 members), C and Fortran order, both byte orders, f2/f4/f8 and
// integers; and the refusals, each naming the file, the array and the expectation.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <kfsdp/io/data/numpy.hpp>

#include "../support/messages.hpp"

namespace {
const std::string dir = KFSDP_NUMPY_FIXTURES;

using kfsdp::test::error_message;
}  // namespace

TEST_CASE("an .npz of numpy.savez: its arrays by name, converted to double") {
  CHECK(kfsdp::io::npz_names(dir + "/data.npz") == std::vector<std::string>{"x", "y", "ids", "y2"});
  const kfsdp::io::numpy_array x = kfsdp::io::read_npz(dir + "/data.npz", "x");
  CHECK(x.shape == std::vector<std::size_t>{10, 3});
  CHECK(x.dtype == "<f4");
  REQUIRE(x.values.size() == 30);
  for (std::size_t i = 0; i < 30; ++i) CHECK(x.values[i] == double(float(double(i) / 7)));
  const kfsdp::io::numpy_array y = kfsdp::io::read_npz(dir + "/data.npz", "y");
  CHECK(y.shape == std::vector<std::size_t>{10});
  for (std::size_t i = 0; i < 10; ++i) CHECK(y.values[i] == std::sin(double(i)));
  CHECK(kfsdp::io::read_npz(dir + "/data.npz", "ids").values[9] == 9.0);
}

TEST_CASE("a dataset from two arrays: features [N, F], targets [N] or [N, T]") {
  const kfsdp::io::array_dataset data = kfsdp::io::numpy_dataset(dir + "/data.npz", "x", "y");
  CHECK(data.count() == 10);
  CHECK(data.in_features() == 3);
  CHECK(data.out_features() == 1);
  const kfsdp::io::array_dataset wide = kfsdp::io::numpy_dataset(dir + "/data.npz", "x", "y2");
  CHECK(wide.out_features() == 2);
  auto [features, targets] = wide.rows<double>(4, 1);
  const auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), targets);
  const auto f = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), features);
  CHECK(t(0, 0) == std::sin(4.0));
  CHECK(t(0, 1) == -std::sin(4.0));
  CHECK(f(0, 2) == double(float(14.0 / 7)));
}

TEST_CASE(".npy: Fortran order read back in C order, big-endian, f16 and integers") {
  const auto fortran = kfsdp::io::read_npy(dir + "/fortran.npy");
  CHECK(fortran.shape == std::vector<std::size_t>{3, 4});
  for (std::size_t i = 0; i < 12; ++i) CHECK(fortran.values[i] == double(i));
  const auto big = kfsdp::io::read_npy(dir + "/big_endian.npy");
  CHECK(big.dtype == ">f4");
  CHECK(big.values == std::vector<double>{-2.5, -1.5, -0.5, 0.5, 1.5, 2.5});
  CHECK(kfsdp::io::read_npy(dir + "/half.npy").values == std::vector<double>{1.0, -0.5, 65504.0});
  CHECK(kfsdp::io::read_npy(dir + "/cube.npy").shape == std::vector<std::size_t>{2, 2, 2});
}

TEST_CASE("refusals name the file, the array and what was expected") {
  CHECK(error_message([] { (void)kfsdp::io::numpy_dataset(dir + "/short.npz", "x", "y"); }) ==
        "kfsdp::io: " + dir + "/short.npz: array 'y' has shape (9), expected 10 rows, as 'x' has (shape (10, 3))");
  CHECK(error_message([] { (void)kfsdp::io::read_npz(dir + "/data.npz", "u"); }) ==
        "kfsdp::io: " + dir + "/data.npz: no array 'u', expected one of: x, y, ids, y2");
  CHECK(error_message([] { (void)kfsdp::io::read_npz(dir + "/compressed.npz", "x"); }) ==
        "kfsdp::io: " + dir + "/compressed.npz: array 'x' is compressed (numpy.savez_compressed), expected an archive "
        "of numpy.savez (stored), or a .npy file");
  CHECK(error_message([] { (void)kfsdp::io::read_npy(dir + "/strings.npy"); }) ==
        "kfsdp::io: " + dir + "/strings.npy: dtype '<U1', expected a number: f2, f4, f8, i1-i8, u1-u8 or b1, in either "
        "byte order");
  CHECK(error_message([] { (void)kfsdp::io::numpy_dataset(dir + "/data.npz", "x", "x2"); }).find("no array 'x2'") !=
        std::string::npos);
  CHECK(error_message([] { (void)kfsdp::io::read_npy(dir + "/data.npz"); }) ==
        "kfsdp::io: " + dir + "/data.npz: not a .npy file (no \\x93NUMPY magic), expected one written by numpy.save or "
        "numpy.savez");
  CHECK(error_message([] { (void)kfsdp::io::read_npy(dir + "/missing.npy"); }) ==
        "kfsdp::io::read_npy: '" + dir + "/missing.npy' is not a regular file");
  CHECK(error_message([] {
          (void)kfsdp::io::numpy_dataset(dir + "/data.npz", "x", "ids");  // fine: integer targets convert
          (void)kfsdp::io::numpy_dataset(dir + "/cube.npy", "x", "y");
        }).find("not a readable .npz (zip) archive") != std::string::npos);
}

namespace {
// A version 1 .npy file of shape `shape` (the header's text) over `data_bytes` zero bytes of f8.
std::string npy_file(const std::string& name, const std::string& shape, std::size_t data_bytes) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }";
  header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";
  const std::string path = std::filesystem::temp_directory_path() / ("kfsdp-test-numpy-" + name + ".npy");
  std::ofstream out(path, std::ios::binary);
  out << "\x93NUMPY\x01" << '\0' << char(header.size() % 256) << char(header.size() / 256) << header
      << std::string(data_bytes, '\0');
  return path;
}
}  // namespace

TEST_CASE("a .npy header's shape is bounded: an extent past 2^64, a product past it or past memory is refused") {
  // (3074457345618258603, 6): the product wrapped to 2 elements and 16 bytes of data were accepted.
  const std::string wraps = npy_file("wraps", "(3074457345618258603, 6)", 16);
  CHECK(error_message([&] { (void)kfsdp::io::read_npy(wraps); }) ==
        "kfsdp::io: " + wraps + ": shape (3074457345618258603, ...) of '<f8' needs more bytes of data than the file's 144");
  // (2^64 + 1, 6) read as (1, 6).
  const std::string past = npy_file("past", "(18446744073709551617, 6)", 48);
  CHECK(error_message([&] { (void)kfsdp::io::read_npy(past); })
            .starts_with("kfsdp::io: " + past + ": the .npy header's shape is not whole numbers below 2^64 (an extent is "
                         "'18446744073709551617', expected a whole number >= 0)"));
  // A shape that fits its file still reads.
  const std::string fine = npy_file("fine", "(2, 3)", 48);
  CHECK(kfsdp::io::read_npy(fine).shape == std::vector<std::size_t>{2, 3});
  for (const std::string& path : {wraps, past, fine}) std::filesystem::remove(path);
}

TEST_CASE("files that once crashed the reader are refused with invalid_argument (test/io/corpus_numpy, fuzz_numpy)") {
  const std::string seeds = dir + "/../corpus_numpy/";
  for (const char* file : {"npy_v2_cut_short.npy", "npy_empty_descr.npy", "npy_shape_not_a_tuple.npy",
                           "npy_shape_product_wraps.npy", "npy_extent_past_2_64.npy"})
    CHECK_THROWS_AS((void)kfsdp::io::read_npy(seeds + file), std::invalid_argument);
  CHECK(error_message([&] { (void)kfsdp::io::read_npy(seeds + "npy_v2_cut_short.npy"); }).find("cut short") !=
        std::string::npos);
  CHECK(error_message([&] { (void)kfsdp::io::read_npy(seeds + "npy_shape_not_a_tuple.npy"); })
            .find("shape is not a tuple") != std::string::npos);
  for (const char* file : {"zip64_record_offset_wraps.npz", "zip64_directory_offset_wraps.npz",
                           "zip64_extra_past_end.npz", "zip64_member_offset_wraps.npz", "zip64_member_size_wraps.npz"})
    CHECK_THROWS_AS((void)kfsdp::io::read_npz(seeds + file, "x"), std::invalid_argument);
  CHECK(error_message([&] { (void)kfsdp::io::read_npz(seeds + "zip64_member_size_wraps.npz", "x"); }) ==
        "kfsdp::io: " + seeds + "zip64_member_size_wraps.npz: array 'x' runs past the end (cut short?)");
}
