#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::session — one object brings a job up and takes it down (opt-in: this header includes
// mpi.h): MPI at the thread level the engine needs, Kokkos, the world communicator with its
// collective guards, and the HSDP groups. It is what a program passes around.
//
//   int main(int argc, char** argv) {
//     kfsdp::session job(argc, argv);                   // or (argc, argv, {.hybrid_shard = 4})
//     return job.run([&] {                              // a bad flag or KFSDP_* variable: "error: ..." and 2
//       kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(), job.fsdp());
//       ...
//     });
//   }                                                   // groups freed, Kokkos and MPI finalised
//
// The environment variables it reads (docs/training.md, "Environment variables"):
//   KFSDP_CHECK_COLLECTIVES   1|on|0|off  compare every collective across ranks first (on without NDEBUG)
//   KFSDP_COLLECTIVE_TIMEOUT  seconds     a collective waiting longer throws, naming the call (600; 0: none)
//   KFSDP_HYBRID_SHARD        N|node|0    HSDP shard groups of N consecutive ranks, or per node (0: flat)
//   KFSDP_SHARED_MEMORY       1|on|0|off  shards in shared memory on one node, gathered without messages (on)
// A bad value is reported by run() as every bad input is: one "error:" line naming the variable, exit 2.

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/environment.hpp>
#include <kfsdp/fsdp/memory_fit.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/meta/parse.hpp>

namespace kfsdp {

/// session_options::hybrid_shard for one shard group per node (the ranks sharing memory).
KFSDP_EXPORT inline constexpr std::size_t shard_per_node = std::numeric_limits<std::size_t>::max();

/// How a session starts; every field has a default.
///
///   kfsdp::session job(argc, argv, {.hybrid_shard = kfsdp::shard_per_node});
struct session_options {
  // SERIALIZED: with overlap (comm::threaded) a worker thread makes the MPI calls.
  int thread_level = MPI_THREAD_SERIALIZED;
  // The job's ranks (duplicated): MPI_COMM_WORLD, or a part of it (MPI_COMM_SELF: a one-rank job).
  MPI_Comm ranks = MPI_COMM_WORLD;
  // HSDP: parameters sharded within groups of this many consecutive ranks (shard_per_node: within
  // each node) and replicated across groups; 0: flat FSDP over the world. Unset: KFSDP_HYBRID_SHARD.
  std::optional<std::size_t> hybrid_shard{};
  // The world communicator's guards. Unset: comm::mpi_options{} (KFSDP_CHECK_COLLECTIVES,
  // KFSDP_COLLECTIVE_TIMEOUT).
  std::optional<comm::mpi_options> collectives{};
};

namespace detail {
// KFSDP_HYBRID_SHARD: a count, "node", or unset/empty (flat).
inline std::size_t hybrid_shard_from_environment() {
  const char* value = std::getenv("KFSDP_HYBRID_SHARD");
  if (value == nullptr || *value == '\0') return 0;
  const std::string_view text(value);
  if (text == "node") return shard_per_node;
  try {
    return parse_count(text, "KFSDP_HYBRID_SHARD", 0, std::numeric_limits<int>::max());
  } catch (const std::invalid_argument& bad) {
    throw std::invalid_argument(fmt::format("{} (ranks per shard group), node, or 0 (flat)", bad.what()));
  }
}
}  // namespace detail

KFSDP_EXPORT class session {
 public:
  /// Starts MPI (unless it runs already: a test main) and Kokkos (likewise), then the world
  /// communicator and the HSDP groups. A bad setting is kept and thrown by run(), so that every
  /// rank reports it alike; the world then has the guards off.
  session(int& argc, char**& argv, session_options options = {})
      : mpi_up_(argc, argv, options.thread_level),
        kokkos_up_(argc, argv),
        world_(options.ranks, world_options(options)) {
    make_groups(options);
  }
  explicit session(session_options options = {})
      : mpi_up_(options.thread_level), world_(options.ranks, world_options(options)) {
    make_groups(options);
  }
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Every rank of the job (session_options::ranks, duplicated).
  [[nodiscard]] comm::mpi& world() noexcept { return world_; }
  /// The ranks that shard the parameters among them: the world, or this rank's HSDP group.
  [[nodiscard]] comm::mpi& shard_group() noexcept { return shard_group_ ? *shard_group_ : world_; }
  /// Under HSDP the ranks holding the same shard as this one (one per group); else none.
  [[nodiscard]] comm::mpi* replicas() noexcept { return replicas_ ? &*replicas_ : nullptr; }
  [[nodiscard]] int rank() const noexcept { return world_.rank(); }
  [[nodiscard]] int size() const noexcept { return world_.size(); }
  /// Forms the HSDP groups anew, as session_options::hybrid_shard says (a program's flag, read after
  /// the session started); collective. Throws std::invalid_argument naming the value, every rank alike.
  ///
  ///   job.set_hybrid_shard(flags.hybrid_node ? kfsdp::shard_per_node : flags.hybrid_shard);
  void set_hybrid_shard(std::size_t ranks_per_group) {
    if (std::string bad = form_groups(ranks_per_group); !bad.empty()) throw std::invalid_argument(bad);
  }
  /// True on the one rank that prints and writes logs.
  [[nodiscard]] bool is_root() const noexcept { return world_.rank() == 0; }

  /// `options` with this session's replica group set (HSDP); pass it with shard_group() to a trainer.
  ///
  ///   kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
  ///       job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3, .broadcast_from = 0}));
  [[nodiscard]] fsdp_options fsdp(fsdp_options options = {}) {
    if (replicas_) options.replica_group = comm::any_communicator(*replicas_);
    return options;
  }

  /// The host memory this rank may use: what its node has available (available_host_memory()),
  /// shared by the ranks on the node. Collective: the ranks on each node are counted.
  [[nodiscard]] double host_memory_per_rank() {
    return available_host_memory() / double(world_.ranks_on_node());
  }

  /// Whether every rank has a core to spare for a communication thread (comm::threaded, the
  /// examples' --overlap auto): the CPUs this rank may run on (its affinity) exceed its share of
  /// them, the ranks on its node when it is not bound, itself when it is. Collective: every rank
  /// gets the same answer. 2 ranks on 2 cores: false; 2 ranks on 8 cores, or bound to 4 each: true.
  [[nodiscard]] bool has_spare_core() {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    const int cpus = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 1;
    const int node_cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int sharing = cpus >= node_cpus ? world_.ranks_on_node() : 1;  // unbound: the node's ranks share its CPUs
    int spare = cpus > sharing ? 1 : 0, everywhere = 0;
    MPI_Allreduce(&spare, &everywhere, 1, MPI_INT, MPI_MIN, world_.native());
    return everywhere == 1;
  }

  /// Stops the job before anything is allocated when `need` (one rank's: estimate_memory) exceeds
  /// host_memory_per_rank() on any rank. Every rank throws std::invalid_argument: where it does not
  /// fit, with the figures and `set_by` (what sets the sizes: the program's flags, say); elsewhere,
  /// naming another rank's node. Collective.
  ///
  ///   job.require_memory(kfsdp::estimate_memory(plan, units, sizeof(float), 2, options), "--dim 4096");
  void require_memory(const memory_need& need, std::string_view set_by) {
    const int node_ranks = world_.ranks_on_node();
    const double available = available_host_memory() / double(node_ranks);
    double too_big[1] = {need.total() > available ? 1.0 : 0.0};  // the ranks that do not fit
    const bool here = too_big[0] > 0;
    comm::all_reduce_sum(world_, std::span<double>(too_big));
    if (here)
      throw std::invalid_argument(fmt::format("{}; set by {}", detail::does_not_fit("the model", describe(need) + " per rank",
                                                                                      available, node_ranks), set_by));
    if (too_big[0] > 0)
      throw std::invalid_argument(fmt::format("the model does not fit the memory of another rank's node; set by {}", set_by));
  }

  /// Runs program() on every rank under comm::run_or_abort: its result (0 for a void program), or
  /// 2 after an error (a bad setting of this session's included), printed once when every rank
  /// failed alike, by the failing rank otherwise (which then ends the job instead of hanging).
  template <class Program>
  int run(Program&& program) {
    return comm::run_or_abort(world_, [&]() -> int {
      if (!bad_setting_.empty()) throw std::invalid_argument(bad_setting_);
      if constexpr (std::is_void_v<std::invoke_result_t<Program&>>) {
        program();
        return 0;
      } else {
        return static_cast<int>(program());
      }
    });
  }

 private:
  // The options' guards, or the environment's; a bad variable leaves the guards off and run() reports it.
  comm::mpi_options world_options(const session_options& options) {
    if (options.collectives) return *options.collectives;
    try {
      return comm::mpi_options{};
    } catch (const std::invalid_argument& bad) {
      bad_setting_ = bad.what();
      // Every field given: a default would read the environment again and throw out of this handler.
      return comm::mpi_options{.check_collectives = false,
                               .timeout = std::chrono::duration<double>(0),
                               .device_memory = comm::mpi_options::device_memory_path::automatic,
                               .shared_memory = false};
    }
  }

  void make_groups(const session_options& options) {
    try {
      const std::size_t group = options.hybrid_shard ? *options.hybrid_shard : detail::hybrid_shard_from_environment();
      if (bad_setting_.empty()) bad_setting_ = form_groups(group);
    } catch (const std::invalid_argument& bad) {
      if (bad_setting_.empty()) bad_setting_ = bad.what();
    }
  }

  // The shard groups of `group` ranks (0: none); returns what is wrong instead, leaving none.
  std::string form_groups(std::size_t group) {
    replicas_.reset();
    shard_group_.reset();
    if (group == 0) return {};
    if (group == shard_per_node) {
      shard_group_.emplace(world_.split_shared());
      // Every node must hold as many ranks, so that the groups shard alike (every rank sees the same answer).
      const comm::value_range per_node = comm::range_over_ranks(world_, std::uint64_t(shard_group_->size()));
      if (per_node.lowest != per_node.highest) {
        shard_group_.reset();
        return fmt::format("session: hybrid_shard is node, and the nodes hold {} to {} ranks, expected as many on "
                           "every node", per_node.lowest, per_node.highest);
      }
    } else if (std::size_t(world_.size()) % group != 0) {
      return fmt::format("session: hybrid_shard is {}, expected a divisor of the {} ranks (or 0: flat)", group,
                         world_.size());
    } else {
      const int ranks = static_cast<int>(group);
      shard_group_.emplace(world_.split(world_.rank() / ranks, world_.rank()));
    }
    replicas_.emplace(world_.split(shard_group_->rank(), world_.rank()));
    return {};
  }

  comm::mpi::environment mpi_up_;
  environment kokkos_up_;
  std::string bad_setting_;  // thrown by run() on every rank
  comm::mpi world_;
  std::optional<comm::mpi> shard_group_, replicas_;
};

}  // namespace kfsdp
