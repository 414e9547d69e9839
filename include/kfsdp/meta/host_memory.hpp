#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The host memory a rank may still use, and the one check that refuses a size before it is
// allocated. Every size read from a file or a flag goes through require_host_memory (or, with a
// session, session::require_memory, its collective form) before the allocation it sizes: model
// configs, checkpoint metadata, a predictor's weights, npy and HDF5 shapes. fsdp/memory_fit.hpp
// estimates what a model needs; this says what there is.
//
//   kfsdp::require_host_memory(double(rows) * double(columns) * sizeof(double), "x.npy's shape (1000000000000, 6)");
//     -> std::invalid_argument: "x.npy's shape (1000000000000, 6) does not fit: it needs 43.7 TiB, and 11.21 GiB of
//        memory is available to each of the 1 ranks on this node"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <fmt/format.h>

namespace kfsdp {

// "1.50 GiB": bytes for people.
inline std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : bytes < 1e6 ? fmt::format("{:.2f} {}", bytes, units[u])
                                                                : fmt::format("{:.3g} {}", bytes, units[u]);
}

namespace detail {

// The first number of the line of `file` that starts with `key` ("" : the file's first number);
// -1 where the file or the line is missing or holds no number ("max": no limit).
inline double read_number(const std::string& file, std::string_view key = {}) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream fields(line.substr(key.size()));
      double value = -1;
      return fields >> value ? value : -1.0;
    }
  return -1;
}

// What this process's memory cgroup still allows: its limit less what it uses but could not give
// back (page cache it may drop, inactive_file, is not counted); -1 where there is no limit. cgroup
// v2 (memory.max) or v1 (memory/memory.limit_in_bytes), at the process's own cgroup or, inside a
// container whose cgroup namespace hides that path, at the root of the mount.
inline double cgroup_memory_left() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, v2 = "/", v1 = "/";
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
    else if (const auto at = line.find(":memory:"); at != std::string::npos) v1 = line.substr(at + 8);
  }
  const std::string base = "/sys/fs/cgroup";
  for (const auto& [dir, limit, usage, inactive] :
       {std::tuple{base + v2, "/memory.max", "/memory.current", "inactive_file "}, {base, "/memory.max", "/memory.current", "inactive_file "},
        {base + "/memory" + v1, "/memory.limit_in_bytes", "/memory.usage_in_bytes", "total_inactive_file "},
        {base + "/memory", "/memory.limit_in_bytes", "/memory.usage_in_bytes", "total_inactive_file "}}) {
    const double most = read_number(dir + limit);
    if (most < 0) continue;  // no such file, or "max"
    if (most >= 0x1p60) return -1;  // v1 writes "no limit" as a page-rounded 2^63
    const double used = read_number(dir + usage), cache = read_number(dir + "/memory.stat", inactive);
    return most - (used > 0 ? used : 0) + (cache > 0 ? cache : 0);
  }
  return -1;
}

}  // namespace detail

// The host memory this process can still have: MemAvailable of /proc/meminfo or what its memory
// cgroup still allows (a Slurm job's or a container's limit), whichever is lower; the largest double
// where neither is known, so that no check refuses on a guess.
inline double available_host_memory() {
  double available = detail::read_number("/proc/meminfo", "MemAvailable:") * 1024;
  if (available < 0) available = std::numeric_limits<double>::max();
  const double cgroup = detail::cgroup_memory_left();
  return cgroup >= 0 && cgroup < available ? cgroup : available;
}

// The ranks on this node as the launcher tells them (Open MPI, MPICH and Intel MPI, Slurm's srun
// with one task count for every node); 1 where none does. A session counts them exactly
// (session::host_memory_per_rank); this serves code that runs without one: a predictor, the C API,
// a file reader.
inline int ranks_on_node_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* text = std::getenv(name)) {
      const double n = std::atof(text);
      if (n >= 1 && n <= 1e6) return int(n);
    }
  return 1;
}

namespace detail {
inline std::string does_not_fit(std::string_view what, std::string_view need, double available, int node_ranks) {
  return fmt::format("{} does not fit: it needs {}, and {} of memory is available to each of the {} ranks on this node",
                     what, need, format_bytes(available), node_ranks);
}
}  // namespace detail

/// Refuses a size before it is allocated: throws std::invalid_argument when `bytes` exceed this
/// rank's share of the host memory (available_host_memory() over the ranks on the node, from the
/// launcher's environment where `ranks_on_node` is 0), naming `what` and both figures. Serves the
/// code that sizes from a file or a flag without a session: readers, predictors, the C API; a
/// session's require_memory is the collective form.
///
///   kfsdp::require_host_memory(double(rows) * double(columns) * 8, fmt::format("'{}' of {}", name, path));
///     -> "'x' of big.npy does not fit: it needs 7.28 TiB, and 11.2 GiB of memory is available to each of the 1 ranks on this node"
KFSDP_EXPORT inline void require_host_memory(double bytes, std::string_view what, int ranks_on_node = 0) {
  const int node_ranks = ranks_on_node > 0 ? ranks_on_node : ranks_on_node_from_environment();
  const double available = available_host_memory() / double(node_ranks);
  if (!(bytes <= available)) throw std::invalid_argument(detail::does_not_fit(what, format_bytes(bytes), available, node_ranks));
}

}  // namespace kfsdp
