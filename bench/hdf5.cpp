// Read rate of io::hdf5_dataset's per-batch reads (each rank its rows of a shuffled global batch,
// one hyperslab union, collective) against plain reads of the same data: the whole array with
// fread, the whole dataset with one H5Dread, and each batch's rows one pread each.
//
//   mpirun -np 2 build/bench/bench_hdf5 [directory] [rows] [features] [global batch]
//
// Rank 0 writes features f32 [rows, features] and targets f32 [rows] to directory/bench.h5 and the
// same features, raw, to directory/bench.raw. Prints one line per method: seconds, MB/s (10^6
// bytes of features and targets as stored, over all ranks) and rows/s (over all ranks). Reads come
// from the page cache (the files were just written): this measures the reading code, not a disk.
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <kfsdp/io/data/hdf5.hpp>

namespace {

// Seconds of `work` on every rank, from a common start to the slowest rank's end.
template <class Work>
double timed(Work&& work) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  work();
  MPI_Barrier(MPI_COMM_WORLD);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void write_files(const std::filesystem::path& h5, const std::filesystem::path& raw, std::size_t rows,
                 std::size_t features) {
  std::vector<float> x(rows * features), y(rows);
  for (std::size_t k = 0; k < x.size(); ++k) x[k] = float(k % 1000) / 1000.0f;
  for (std::size_t r = 0; r < rows; ++r) y[r] = float(r % 7);
  const hid_t file = H5Fcreate(h5.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  for (const auto& [name, shape, values] :
       {std::tuple<const char*, std::vector<hsize_t>, const std::vector<float>*>{"x", {rows, features}, &x},
        {"y", {rows}, &y}}) {
    const hid_t space = H5Screate_simple(int(shape.size()), shape.data(), nullptr);
    const hid_t dataset = H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values->data());
    H5Dclose(dataset);
    H5Sclose(space);
  }
  H5Fclose(file);
  std::FILE* out = std::fopen(raw.c_str(), "wb");
  std::fwrite(x.data(), sizeof(float), x.size(), out);
  std::fwrite(y.data(), sizeof(float), y.size(), out);
  std::fclose(out);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const std::filesystem::path dir = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
    const std::size_t rows = argc > 2 ? std::stoull(argv[2]) : 1u << 20, features = argc > 3 ? std::stoull(argv[3]) : 16,
                      batch = argc > 4 ? std::stoull(argv[4]) : 1024;
    const auto h5 = dir / "bench.h5", raw = dir / "bench.raw";
    if (rank == 0) write_files(h5, raw, rows, features);
    MPI_Barrier(MPI_COMM_WORLD);
    const double row_bytes = double((features + 1) * sizeof(float));
    const auto report = [&](const std::string& method, double seconds, double rows_read) {
      if (rank == 0)
        fmt::print("{:<44} {:8.4f} s {:9.1f} MB/s {:12.0f} rows/s\n", method, seconds,
                   rows_read * row_bytes / seconds / 1e6, rows_read / seconds);
    };
    if (rank == 0)
      fmt::print("bench_hdf5: {} ranks, {} rows of {} f32 features + 1 f32 target ({:.1f} MB), global batch {}\n",
                 ranks, rows, features, double(rows) * row_bytes / 1e6, batch);

    // Every rank reads the whole array once, plain: the baseline of a file's read rate.
    std::vector<float> all(rows * (features + 1));
    const double fread_s = timed([&] {
      std::FILE* in = std::fopen(raw.c_str(), "rb");
      if (std::fread(all.data(), sizeof(float), all.size(), in) != all.size()) std::perror("fread");
      std::fclose(in);
    });
    report("whole array, fread (every rank)", fread_s, double(rows) * ranks);
    const double h5read_s = timed([&] {
      const hid_t file = H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      for (const auto& [name, offset] : {std::pair<const char*, std::size_t>{"x", 0}, {"y", rows * features}}) {
        const hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
        H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data() + offset);
        H5Dclose(dataset);
      }
      H5Fclose(file);
    });
    report("whole dataset, one H5Dread (every rank)", h5read_s, double(rows) * ranks);

    // One pass over the data in shuffled global batches, each rank its rows. The batches are drawn
    // before the clocks start (a shuffle of all rows per epoch costs more than reading a batch).
    const std::size_t steps = rows / batch, local = batch / std::size_t(ranks);
    const std::vector<std::size_t> order = kfsdp::io::epoch_permutation(rows, 1, 0);
    const auto batch_of = [&](std::size_t step) {
      return std::vector<std::size_t>(order.begin() + std::ptrdiff_t(step * batch),
                                      order.begin() + std::ptrdiff_t((step + 1) * batch));
    };
    for (const bool collective : {true, false}) {
      const kfsdp::io::hdf5_dataset data(h5, "x", "y", MPI_COMM_WORLD, {.collective = collective});
      const double seconds = timed([&] {
        for (std::size_t step = 0; step < steps; ++step)
          (void)data.rank_slice<float>(batch_of(step), std::size_t(rank), std::size_t(ranks));
      });
      report(fmt::format("hdf5_dataset per batch, {}", collective ? "collective" : "independent"), seconds,
             double(steps * batch));
    }
    // The same rows, one pread each (features then target), into host memory only.
    const int fd = ::open(raw.c_str(), O_RDONLY);
    std::vector<float> row(features);
    const double pread_s = timed([&] {
      for (std::size_t step = 0; step < steps; ++step) {
        const auto samples = batch_of(step);
        for (std::size_t k = std::size_t(rank) * local; k < (std::size_t(rank) + 1) * local; ++k) {
          float target = 0;
          if (::pread(fd, row.data(), features * sizeof(float), off_t(samples[k] * features * sizeof(float))) < 0 ||
              ::pread(fd, &target, sizeof(float), off_t((rows * features + samples[k]) * sizeof(float))) < 0)
            std::perror("pread");
        }
      }
    });
    ::close(fd);
    report("the same rows, one pread each", pread_s, double(steps * batch));
    if (rank == 0) {
      std::filesystem::remove(h5);
      std::filesystem::remove(raw);
    }
  }
  MPI_Finalize();
  return 0;
}
