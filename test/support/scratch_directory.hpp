#pragma once
// A directory for an MPI test's files: made by rank 0 under the system's temporary directory with a
// random name, the same path on every rank, removed (by rank 0, after a barrier) at the end.
//   kfsdp::test::scratch_directory scratch(world, "checkpoint");   // /tmp/kfsdp-checkpoint-test-3f9c...

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>

#include <mpi.h>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/checkpoint/checksum.hpp>

namespace kfsdp::test {

// Rank 0's `text` on every rank.
inline std::string broadcast_from_rank0(comm::mpi& world, std::string text) {
  std::uint64_t length = text.size();
  MPI_Bcast(&length, 1, MPI_UINT64_T, 0, world.native());
  text.resize(length);
  MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, world.native());
  return text;
}

class scratch_directory {
 public:
  scratch_directory(comm::mpi& world, const std::string& what) : world_(world) {
    std::string name;
    if (world.rank() == 0) {
      std::random_device entropy;
      const std::filesystem::path made =
          std::filesystem::temp_directory_path() /
          (std::string("kfsdp-") + what + "-test-" + io::format_hex64((std::uint64_t{entropy()} << 32) ^ entropy()));
      std::filesystem::create_directories(made);
      name = made.string();
    }
    path = broadcast_from_rank0(world, name);
  }
  ~scratch_directory() {
    world_.barrier();
    if (world_.rank() == 0) std::filesystem::remove_all(path);
  }
  scratch_directory(const scratch_directory&) = delete;
  scratch_directory& operator=(const scratch_directory&) = delete;

  std::filesystem::path path;

 private:
  comm::mpi& world_;
};

}  // namespace kfsdp::test
