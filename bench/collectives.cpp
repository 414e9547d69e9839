// bench/collectives — one bucket's collectives in kfsdp against raw MPI on the same bytes.
//
// For each shard size S (bytes per rank, float, powers of 4 from --min-bytes to --max-bytes):
//   all-gather:     kfsdp fsdp_engine::unshard (the bucket's parameters as one batch, each into
//                   its place: no unpack; the buffer from the engine's pool),
//                   kfsdp::comm::all_gather over mpi alone (= iall_gather + wait), raw
//                   MPI_Allgather and raw MPI_Iallgather + MPI_Wait;
//   reduce-scatter: kfsdp fsdp_engine::reduce_gradients after zero_grad, as in every step (the
//                   bucket's gradients as one batch, comm::ireduce_scatter_sum_parts: one ring
//                   from the gradients into the gradient shard, the division by the ranks folded
//                   into its last addition), kfsdp::comm::reduce_scatter_sum over mpi
//                   alone (the ring above its threshold), raw MPI_Reduce_scatter_block and raw
//                   MPI_Ireduce_scatter_block + MPI_Wait;
//   raw_p:          the bucket's parameters by hand: for the all-gather a message a parameter a
//                   peer, straight into place (the fewest a parameter-major bucket can send), for
//                   the reduction a MPI_Reduce_scatter_block a parameter.
// The raw and raw_i columns show what a blocking MPI call would save over kfsdp's non-blocking one.
// The all-gathers all run on the same memory, the engine's: its bucket's shard and the gathered
// buffer its pool hands out again at each unshard. Which physical pages a buffer gets moves a
// 1 MiB all-gather by up to 10 % from one run to the next (the same exchange on two buffer sets,
// swapped between runs, swaps which is faster), so forms on buffers of their own would compare
// their pages as much as their code. The reductions keep buffers of their own, each writing its
// input untimed first, as the engine's backward writes its gradients.
// Each repeat starts after a barrier and counts the slowest rank; the table shows medians. Within a
// repeat the raw, comm and engine forms run in turn, so that load from elsewhere falls on them alike.
// Bus bandwidth follows nccl-tests: busbw = (n-1)/n * (n*S) / time.
//
//   mpirun -np 2 build/bench/bench_collectives --bucket-params 4
//   mpirun -np 4 --oversubscribe build/bench/bench_collectives --max-bytes 67108864
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/environment.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/model/param_table.hpp>

// The engine's per-bucket collectives, which these benchmarks drive directly (a trainer leaves them to its schedule).
template <class Engine>
auto buckets(Engine& engine) {
  return kfsdp::detail::bucket_collectives(engine);
}

namespace {

struct bench_options {
  std::size_t min_bytes = 4 * 1024;
  std::size_t max_bytes = 256 * 1024 * 1024;
  std::size_t repeats = 30;       // at small sizes; fewer from 1 MiB up (at least min_repeats)
  std::size_t bucket_params = 1;  // 1: the gathered buffer is the parameter, no unpack
  std::size_t memory_budget_bytes = std::size_t{6} << 30;  // all ranks of the node together
  std::size_t ring_min_bytes = kfsdp::comm::mpi::default_reduce_scatter_ring_min_bytes;
  bool help = false;
};

constexpr std::string_view usage =
    "usage: bench_collectives [--min-bytes N] [--max-bytes N] [--repeats N] [--bucket-params K] "
    "[--memory-budget-bytes N] [--ring-min-bytes N]\n";

constexpr std::size_t min_repeats = 5;

std::size_t parse_size(std::string_view flag, std::string_view text) {
  std::size_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    throw std::invalid_argument(fmt::format("{}: '{}' is not a non-negative integer", flag, text));
  return value;
}

bench_options parse_options(int argc, char** argv) {
  bench_options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help") {
      options.help = true;
      return options;
    }
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const std::size_t value = parse_size(flag, argv[++i]);
    if (flag == "--min-bytes") options.min_bytes = value;
    else if (flag == "--max-bytes") options.max_bytes = value;
    else if (flag == "--repeats") options.repeats = value;
    else if (flag == "--bucket-params") options.bucket_params = value;
    else if (flag == "--memory-budget-bytes") options.memory_budget_bytes = value;
    else if (flag == "--ring-min-bytes") options.ring_min_bytes = value;
    else throw std::invalid_argument(fmt::format("unknown flag {} (see --help)", flag));
  }
  if (options.bucket_params == 0) throw std::invalid_argument("--bucket-params is 0, expected >= 1");
  if (options.repeats == 0) throw std::invalid_argument("--repeats is 0, expected >= 1");
  if (options.min_bytes < options.bucket_params * sizeof(float))
    throw std::invalid_argument(fmt::format("--min-bytes {} leaves a parameter with no element",
                                            options.min_bytes));
  return options;
}

// Fewer repeats for big shards: the medians of big transfers settle quickly.
std::size_t repeats_for(const bench_options& options, std::size_t shard_bytes) {
  constexpr std::size_t full_repeats_up_to = std::size_t{1} << 20;
  if (shard_bytes <= full_repeats_up_to) return options.repeats;
  return std::max(std::min(options.repeats, min_repeats),
                  options.repeats * full_repeats_up_to / shard_bytes);
}

// One operation to time: `prepare` runs untimed before each repeat, `timed` is measured.
struct timed_operation {
  std::function<void()> prepare, timed;
};

// For each operation, the median over repeats of the slowest rank's time. Every repeat runs the
// operations in turn, so that a burst of load on the machine falls on all of them alike, in a
// fresh random order each repeat, so that none always runs after the same other one (whose
// traffic it would find in or out of the cache): their ratios compare like with like.
std::vector<double> interleaved_medians(kfsdp::comm::mpi& world, std::size_t repeats,
                                        const std::vector<timed_operation>& operations) {
  for (const timed_operation& operation : operations) {  // warm-up: first touch, MPI's connection setup
    operation.prepare();
    operation.timed();
  }
  std::vector<std::vector<double>> slowest(operations.size(), std::vector<double>(repeats));
  std::vector<std::size_t> order(operations.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffler(12345);  // the same orders on every rank
  for (std::size_t repeat = 0; repeat < repeats; ++repeat) {
    std::shuffle(order.begin(), order.end(), shuffler);
    for (const std::size_t op : order) {
      operations[op].prepare();
      MPI_Barrier(world.native());
      const double start = MPI_Wtime();
      operations[op].timed();
      double mine = MPI_Wtime() - start;
      MPI_Allreduce(&mine, &slowest[op][repeat], 1, MPI_DOUBLE, MPI_MAX, world.native());
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& times : slowest) {
    std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(repeats / 2), times.end());
    medians.push_back(times[repeats / 2]);
  }
  return medians;
}

// k one-dimensional parameters of one layer (one bucket under layer bucketing) whose chunks add
// up to shard_numel elements per rank; no padding, so every byte moved is a real element.
std::vector<kfsdp::param_info> bucket_table(std::size_t shard_numel, std::size_t params,
                                            std::size_t world_size) {
  std::vector<kfsdp::param_info> table(params);
  for (std::size_t p = 0; p < params; ++p) {
    const std::size_t chunk = shard_numel / params + (p + 1 == params ? shard_numel % params : 0);
    kfsdp::param_info& info = table[p];
    info.name = kfsdp::inline_string<kfsdp::max_param_name>(fmt::format("bucket.p{}", p));
    info.rank = 1;
    info.shape[0] = chunk * world_size;
    info.numel = info.shape[0];
    info.layer = 0;
  }
  return table;
}

// Per-rank bytes alive at the worst moment: the four other forms' buffers (a shard and a gathered
// buffer each) and the engine's shards and gradient shards plus its gathered and unpacked buffers
// (k > 1), or full gradients and the reduced shard (k = 1).
std::size_t peak_bytes_per_rank(std::size_t shard_bytes, std::size_t ranks, std::size_t params) {
  const std::size_t others = 4 * (ranks + 1) * shard_bytes;
  const std::size_t engine = params > 1 ? (2 * ranks + 2) * shard_bytes : (ranks + 3) * shard_bytes;
  return others + engine;
}

double bus_bandwidth_gbs(std::size_t shard_bytes, int ranks, double seconds) {
  const double total = static_cast<double>(shard_bytes) * ranks;
  return seconds > 0 ? (ranks - 1.0) / ranks * total / seconds / 1e9 : 0.0;
}

struct timings {
  double engine = 0;  // fsdp_engine: unshard or reduce_gradients
  double comm = 0;    // kfsdp::comm collective over mpi alone
  double raw = 0;     // MPI_Allgather or MPI_Reduce_scatter_block
  double raw_nonblocking = 0;  // MPI_Iallgather or MPI_Ireduce_scatter_block, then MPI_Wait
  double raw_parts = 0;        // the bucket's parameters by hand: a message each (all-gather) or a collective each
};

// The five forms of one collective (the columns of a row), timed interleaved.
timings time_forms(kfsdp::comm::mpi& world, std::size_t repeats, timed_operation raw,
                   timed_operation raw_nonblocking, timed_operation raw_parts, timed_operation comm,
                   timed_operation engine) {
  const std::vector<double> medians =
      interleaved_medians(world, repeats, {raw, raw_nonblocking, raw_parts, comm, engine});
  return {.engine = medians[4], .comm = medians[3], .raw = medians[0], .raw_nonblocking = medians[1],
          .raw_parts = medians[2]};
}

void print_row(std::string_view operation, std::size_t shard_bytes, int ranks, const timings& t) {
  fmt::print("{:<15} {:>11} {:>11.4f} {:>11.4f} {:>11.4f} {:>11.4f} {:>11.4f} {:>9.2f} {:>9.2f} {:>10.2f} "
             "{:>10.2f}\n",
             operation, shard_bytes, t.engine * 1e3, t.comm * 1e3, t.raw * 1e3,
             t.raw_nonblocking * 1e3, t.raw_parts * 1e3, t.engine / t.raw, t.comm / t.raw,
             bus_bandwidth_gbs(shard_bytes, ranks, t.engine),
             bus_bandwidth_gbs(shard_bytes, ranks, t.raw));
}

// The least a parameter-major bucket's all-gather sends: each parameter's chunk to each peer as a
// message of its own, received straight into its place, and this rank's chunks copied in after.
// E.g. chunks {2, 3} at 2 ranks: rank 1 sends shard[0..2) into gathered[2..4) and shard[2..5) into
// gathered[7..10) on rank 0. (kfsdp sends parts under 8 KiB together, typed: not here.)
void raw_gather_parts(kfsdp::comm::mpi& world, std::span<const std::size_t> chunks, std::span<const float> shard,
                      std::span<float> gathered) {
  const int ranks = world.size(), rank = world.rank();
  std::vector<MPI_Request> pending;
  for (int pass = 0; pass < 2; ++pass)  // the receives first, then the sends
    for (int peer = 0; peer < ranks; ++peer) {
      if (peer == rank) continue;
      std::size_t from = 0, to = 0;
      for (const std::size_t chunk : chunks) {
        MPI_Request& r = pending.emplace_back();
        if (pass == 0)
          MPI_Irecv(gathered.data() + to + peer * chunk, static_cast<int>(chunk), MPI_FLOAT, peer, 7, world.native(), &r);
        else
          MPI_Isend(shard.data() + from, static_cast<int>(chunk), MPI_FLOAT, peer, 7, world.native(), &r);
        from += chunk;
        to += chunk * static_cast<std::size_t>(ranks);
      }
    }
  MPI_Waitall(static_cast<int>(pending.size()), pending.data(), MPI_STATUSES_IGNORE);
  std::size_t from = 0, to = 0;
  for (const std::size_t chunk : chunks) {
    std::copy_n(shard.data() + from, chunk, gathered.data() + to + static_cast<std::size_t>(rank) * chunk);
    from += chunk;
    to += chunk * static_cast<std::size_t>(ranks);
  }
}

// The bucket's reduce-scatter one collective a parameter, as kfsdp made it before it batched them.
void raw_reduce_scatter_parts(kfsdp::comm::mpi& world, std::span<const std::size_t> chunks,
                              std::span<const float> gathered, std::span<float> shard) {
  std::size_t from = 0, to = 0;
  for (const std::size_t chunk : chunks) {
    MPI_Reduce_scatter_block(gathered.data() + from, shard.data() + to, static_cast<int>(chunk), MPI_FLOAT, MPI_SUM,
                             world.native());
    from += chunk * static_cast<std::size_t>(world.size());
    to += chunk;
  }
}

// HSDP by node's all-reduce over the replicas (a rank of each node, as kfsdp::session groups them) of
// one shard: the slowest rank's median, on more than one node only (null: one node).
void bench_replica_sum(kfsdp::comm::mpi& world, kfsdp::comm::mpi* replicas, const bench_options& options,
                       std::size_t shard_bytes) {
  if (replicas == nullptr) return;
  std::vector<float> shard(shard_bytes / sizeof(float));
  const double seconds = interleaved_medians(world, repeats_for(options, shard_bytes),
      {{[&] { std::fill(shard.begin(), shard.end(), 1.0F); },
        [&] { kfsdp::comm::all_reduce_sum(*replicas, std::span(shard)); }}})[0];
  if (world.rank() == 0) {
    fmt::print("{:<15} {:>11} {:>11.4f}\n", "replica-sum", shard_bytes, 1e3 * seconds);
    std::fflush(stdout);
  }
}

void bench_size(kfsdp::comm::mpi& world, const bench_options& options, std::size_t shard_bytes) {
  const int ranks = world.size();
  const auto world_size = static_cast<std::size_t>(ranks);
  const std::size_t shard_numel = shard_bytes / sizeof(float);
  const std::size_t repeats = repeats_for(options, shard_bytes);
  const auto nothing = [] {};

  // Each form on buffers of its own, shard (S) and gathered (n*S), as the engine has its own: on
  // shared ones a form finds the bytes the form before it just left in cache (1.2x at 16 MiB). The
  // engine has one bucket of bucket_params parameters.
  struct buffers {
    std::vector<float> shard, gathered;
  };
  const auto make_buffers = [&] {
    return buffers{std::vector<float>(shard_numel, 1.0F), std::vector<float>(shard_numel * world_size, 1.0F)};
  };
  buffers raw = make_buffers(), raw_i = make_buffers(), raw_p = make_buffers(), comm = make_buffers();
  const int count = static_cast<int>(shard_numel);
  const kfsdp::fsdp_options fsdp{.bucketing_strategy = kfsdp::bucketing::layer};
  kfsdp::fsdp_engine<float> engine(bucket_table(shard_numel, options.bucket_params, world_size), world,
                                   fsdp);
  Kokkos::deep_copy(engine.shards().flat(), 1.0F);
  const auto fill_full_grads = [&] {  // a step's backward: zero_grad, then the gradients
    buckets(engine).reshard(0);
    engine.zero_grad();
    for (std::size_t p = 0; p < options.bucket_params; ++p) Kokkos::deep_copy(engine.full_grad(p), 1.0F);
  };

  std::vector<std::size_t> chunks;  // each parameter's elements a rank, as bucket_table splits them
  for (const kfsdp::param_info& info : bucket_table(shard_numel, options.bucket_params, world_size))
    chunks.push_back(info.numel / world_size);
  // The engine's memory for every all-gather: bucket 0's shard, and the gathered buffer (no padding:
  // parameter 0 starts it), which the pool hands back at each unshard after a reshard.
  buckets(engine).unshard(0);
  const std::span<const float> shard(engine.shards().bucket(0).data(), shard_numel);
  const std::span<float> gathered(engine.full_param(0).data(), shard_numel * world_size);
  const timings gather = time_forms(world, repeats,
      {nothing, [&] {
         MPI_Allgather(shard.data(), count, MPI_FLOAT, gathered.data(), count, MPI_FLOAT, world.native());
       }},
      {nothing, [&] {
         MPI_Request pending = MPI_REQUEST_NULL;
         MPI_Iallgather(shard.data(), count, MPI_FLOAT, gathered.data(), count, MPI_FLOAT, world.native(), &pending);
         MPI_Wait(&pending, MPI_STATUS_IGNORE);
       }},
      {nothing, [&] { raw_gather_parts(world, chunks, shard, gathered); }},
      {nothing, [&] { kfsdp::comm::all_gather(world, shard, gathered); }},
      {[&] { buckets(engine).reshard(0); }, [&] { buckets(engine).unshard(0); }});
  buckets(engine).unshard(0);
  if (engine.full_param(0).data() != gathered.data())
    throw std::logic_error("bench_collectives: the engine's pool handed out another gathered buffer; the forms "
                           "no longer share their memory");

  // Each reduction's input written first, as the engine's backward writes its gradients: all read warm.
  const auto write_input = [](buffers& b) {
    return [&b] { std::fill(b.gathered.begin(), b.gathered.end(), 1.0F); };
  };
  const timings scatter = time_forms(world, repeats,
      {write_input(raw), [&] {
         MPI_Reduce_scatter_block(raw.gathered.data(), raw.shard.data(), count, MPI_FLOAT, MPI_SUM, world.native());
       }},
      {write_input(raw_i), [&] {
         MPI_Request pending = MPI_REQUEST_NULL;
         MPI_Ireduce_scatter_block(raw_i.gathered.data(), raw_i.shard.data(), count, MPI_FLOAT, MPI_SUM,
                                   world.native(), &pending);
         MPI_Wait(&pending, MPI_STATUS_IGNORE);
       }},
      {write_input(raw_p), [&] { raw_reduce_scatter_parts(world, chunks, raw_p.gathered, raw_p.shard); }},
      {write_input(comm), [&] {
         kfsdp::comm::reduce_scatter_sum(world, std::span<const float>(comm.gathered), std::span(comm.shard));
       }},
      {fill_full_grads, [&] { buckets(engine).reduce_gradients(0); }});
  if (world.rank() == 0) {
    print_row("all-gather", shard_bytes, ranks, gather);
    print_row("reduce-scatter", shard_bytes, ranks, scatter);
    std::fflush(stdout);
  }
}

int run(int argc, char** argv) {
  const bench_options options = parse_options(argc, argv);
  kfsdp::comm::mpi world;
  if (options.help) {
    if (world.rank() == 0) fmt::print("{}", usage);
    return 0;
  }
  world.set_reduce_scatter_ring_min_bytes(options.ring_min_bytes);
  const int ranks = world.size();
  // On more than one node: the replica groups of HSDP by node, a rank of each node (the same node-local rank).
  const kfsdp::comm::mpi node = world.split_shared();
  std::optional<kfsdp::comm::mpi> replicas;
  if (node.size() < ranks) replicas.emplace(world.split(node.rank(), world.rank()));
  if (world.rank() == 0) {
    fmt::print("# bench_collectives: {} ranks, float, one bucket of {} parameter(s), kfsdp ring "
               "reduce-scatter from {} B chunks; median of the slowest rank over repeats "
               "({} up to 1 MiB shards, fewer above)\n",
               ranks, options.bucket_params, options.ring_min_bytes, options.repeats);
    fmt::print("# engine: fsdp_engine unshard / reduce_gradients; comm: kfsdp::comm over mpi "
               "alone; raw: MPI_Allgather / MPI_Reduce_scatter_block; raw_i: their MPI_I* forms "
               "+ MPI_Wait; raw_p: the bucket's parameters by hand, MPI_Isend/MPI_Irecv a parameter "
               "a peer / MPI_Reduce_scatter_block a parameter; busbw = (n-1)/n * n*S / time\n");
    if (replicas)
      fmt::print("# replica-sum (on more than one node): kfsdp::comm::all_reduce_sum of one shard over HSDP by "
                 "node's replicas, a rank of each node; its ms in the engine_ms column\n");
    fmt::print("{:<15} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>10} {:>10}\n",
               "operation", "shard_B", "engine_ms", "comm_ms", "raw_ms", "raw_i_ms", "raw_p_ms", "eng/raw",
               "comm/raw", "eng_GB/s", "raw_GB/s");
  }
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
    const std::size_t node_bytes =
        peak_bytes_per_rank(bytes, static_cast<std::size_t>(ranks), options.bucket_params) *
        static_cast<std::size_t>(ranks);
    if (node_bytes > options.memory_budget_bytes) {
      if (world.rank() == 0)
        fmt::print("# {} B shards skipped: about {} MiB over all ranks, above "
                   "--memory-budget-bytes {}\n",
                   bytes, node_bytes >> 20, options.memory_budget_bytes);
      continue;
    }
    bench_size(world, options, bytes);
    bench_replica_sum(world, replicas ? &*replicas : nullptr, options, bytes);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::comm::mpi::environment mpi_up(argc, argv);
  kfsdp::environment kokkos(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "bench_collectives: {}\n", error.what());
    MPI_Abort(MPI_COMM_WORLD, 2);  // a rank alone in an error would leave the others waiting
    return 2;
  }
}
