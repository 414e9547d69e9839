// Checkpoint bandwidth of the default GPT (make_gpt({.layers = 4, .dim = 128, .seq = 64}), float):
// parallel save_model / load_model (MPI-IO, every rank its rows) against a plain sequential write
// and read of the same bytes from one process, and against gather-to-rank-0 + sequential writer.
//
//   mpirun -np 2 build/bench/bench_checkpoint [directory] [repetitions]
//
// Prints one line per method: median seconds and MB/s (10^6 bytes) over the repetitions. Every
// write is synced (MPI_File_sync / fsync), so it measures the storage, not only the page cache;
// reads come from the page cache (the file was just written).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/environment.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/model/param_table.hpp>

namespace {

double median(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Seconds of `work` on every rank, from a common start to the slowest rank's end.
template <class Work>
double timed(kfsdp::comm::mpi& world, Work&& work) {
  world.barrier();
  const auto start = std::chrono::steady_clock::now();
  work();
  world.barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<char> read_all(const std::filesystem::path& path) {
  std::vector<char> bytes(std::filesystem::file_size(path));
  const int file = ::open(path.c_str(), O_RDONLY);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(file, bytes.data() + done, bytes.size() - done);
    if (got <= 0) break;
    done += static_cast<std::size_t>(got);
  }
  ::close(file);
  return bytes;
}

void write_all_synced(const std::filesystem::path& path, const std::vector<char>& bytes) {
  const int file = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t put = ::write(file, bytes.data() + done, bytes.size() - done);
    if (put <= 0) break;
    done += static_cast<std::size_t>(put);
  }
  ::fsync(file);
  ::close(file);
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::comm::mpi::environment mpi_up(argc, argv);
  kfsdp::environment kokkos_up(argc, argv);
  {
    kfsdp::comm::mpi world;
    const std::filesystem::path directory =
        argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path();
    const int repetitions = argc > 2 ? std::stoi(argv[2]) : 10;
    const std::filesystem::path parallel = directory / fmt::format("bench_checkpoint_np{}.safetensors", world.size());
    const std::filesystem::path plain = directory / fmt::format("bench_checkpoint_np{}.plain", world.size());
    const std::filesystem::path gathered = directory / fmt::format("bench_checkpoint_np{}.gathered", world.size());

    const auto model = kfsdp::make_gpt({.layers = 4, .dim = 128, .seq = 64});
    kfsdp::fsdp_engine<float> engine(kfsdp::make_param_table(model), world, {});
    engine.initialize(1, [](const kfsdp::param_info&) {
      return kfsdp::param_init{kfsdp::param_init::normal, 0.02};
    });

    std::vector<double> save, load, plain_write, plain_read, gather_write;
    std::vector<char> bytes;
    for (int repetition = 0; repetition < repetitions; ++repetition) {
      save.push_back(timed(world, [&] { kfsdp::io::save_model(parallel, engine, {{"step", "0"}}); }));
      load.push_back(timed(world, [&] { (void)kfsdp::io::load_model(parallel, engine); }));
      if (world.rank() == 0) bytes = read_all(parallel);
      plain_write.push_back(timed(world, [&] {
        if (world.rank() == 0) write_all_synced(plain, bytes);
      }));
      plain_read.push_back(timed(world, [&] {
        if (world.rank() == 0) bytes = read_all(plain);
      }));
      gather_write.push_back(timed(world, [&] {
        const kfsdp::state_dict full = engine.original_state_dict(/*rank0_only=*/true);
        if (world.rank() == 0) kfsdp::io::save_state_dict_file(gathered, full, {{"step", "0"}});
      }));
    }
    if (world.rank() == 0) {
      const double megabytes = static_cast<double>(std::filesystem::file_size(parallel)) / 1e6;
      fmt::print("checkpoint of make_gpt({{.layers = 4, .dim = 128, .seq = 64}}), float: {:.2f} MB, "
                 "{} ranks, median of {}\n",
                 megabytes, world.size(), repetitions);
      const auto line = [&](const char* what, const std::vector<double>& seconds) {
        fmt::print("  {:<44} {:9.5f} s  {:9.1f} MB/s\n", what, median(seconds), megabytes / median(seconds));
      };
      line("save_model (parallel, MPI-IO, synced)", save);
      line("load_model (parallel, MPI-IO, verified)", load);
      line("plain sequential write + fsync (rank 0)", plain_write);
      line("plain sequential read (rank 0)", plain_read);
      line("gather to rank 0 + save_state_dict_file", gather_write);
      std::filesystem::remove(parallel);
      std::filesystem::remove(plain);
      std::filesystem::remove(gathered);
    }
  }
  return 0;
}
