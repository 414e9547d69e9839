// bench/step — one training step of the example GPT for every sharding × bucketing at the world
// size it runs with: step time and tokens/s, the ZeRO3/ZeRO2 step-time ratio, the peak memory per
// rank and the bytes communicated per step, each against its theory.
//
//   mpirun -np 2 build/bench/bench_step                 (default model of train_gpt, AdamW, float)
//   mpirun -np 2 build/bench/bench_step --overlap off --steps 20 --trace step
//
// --rounds times over, every combination gets a fresh engine (same initial weights, same batches),
// runs --warmup steps, then --steps timed steps; the rounds interleave the combinations, so a burst
// of load from elsewhere on the machine does not fall on one of them alone. A step starts after a
// barrier and lasts until the slowest rank is done; the table shows the median over every timed
// step of every round. tokens/s = batch · seq / median step time (the global batch).
// GFLOP/s per rank = the step's credited FLOPs (bench/roofline.hpp) / median step time / ranks,
// against the single-core sgemm measured in the same run (before and after the steps, every rank
// at once; the better of the two), at c_attn's product over one rank's tokens.
//
// Memory per rank (bytes, the most over ranks and timed steps):
//   measured = engine.memory(): sharded_params + sharded_grads + unsharded_peak, plus the AdamW
//              moments (exp_avg + exp_avg_sq). Activations of the layers are not counted.
//   theory   = (2 + k)·Ψ/N (sharded parameters, gradients and optimizer state; k = 2 for AdamW;
//              Ψ = padded parameter bytes = N · shard bytes) + U, where U, the unsharded bytes the
//              schedule cannot do without, is the most over the step of the bytes alive, with
//              P(u) = the padded bytes of unit u's buckets (unit 0 the root: embeddings, ln_f, lm_head;
//              units 1..L the blocks) and the schedule of kfsdp::trainer with one-unit prefetch — the
//              root gathered first and kept, with its gradient, until the end of backward:
//                ZeRO2: forward of u holds 0..u+1; backward of u holds 0..L and the gradients of 0 and u;
//                ZeRO3: forward of u holds 0, u, u+1; backward of u holds 0, u, u-1 and the gradients of 0 and u.
//              U leaves out a reduced shard of a bucket that reduces into an add (not after
//              zero_grad, so never in this benchmark), and counts the root's gradient through all of
//              backward, where the embeddings' gradients come only at its end: measured can be
//              below U by those (wte + wpe).
// Bytes per step: engine.bytes_communicated() (every all-gather and reduce-scatter counts its full
// buffer, N · bucket shard bytes) against ZeRO2: 2Ψ (gather once, reduce-scatter once), ZeRO3:
// 3Ψ − P(0) (the blocks gathered again in backward; the root stays gathered). The two one-double all-reduces of the step (loss, gradient norm) are
// not counted.
//
// --trace FILE records the last timed step of every combination (inside a "step <sharding>
// <bucketing>" region) into FILE.rank<r>.json, one Chrome/Perfetto timeline per rank.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <fmt/format.h>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/threaded/threaded.hpp>
#include <kfsdp/environment.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/trainer.hpp>
#include <kfsdp/fsdp/trace.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/session.hpp>

#include "../examples/cli.hpp"
#include "roofline.hpp"

namespace {

using kfsdp::examples::cli;

constexpr std::size_t adamw_states = 2;  // k: exp_avg and exp_avg_sq, one shard each

struct settings {
  std::string data, dtype, trace;
  kfsdp::gpt_config model;
  std::size_t batch = 0, steps = 0, warmup = 0, rounds = 0;
  kfsdp::fsdp_options schedule;  // limit_all_gathers, overlap_reduce_scatter
  std::uint64_t seed = 0;
  kfsdp::examples::overlap_choice overlap_flag = kfsdp::examples::overlap_choice::automatic;
  kfsdp::examples::overlap_mode overlap = kfsdp::examples::overlap_mode::off;  // the flag resolved on this node
  std::vector<kfsdp::sharding_strategy> shardings;
  std::vector<kfsdp::bucketing> bucketings;
};

struct result {
  kfsdp::sharding_strategy sharding{};
  kfsdp::bucketing bucketing{};
  std::vector<double> seconds;      // every timed step of every round (slowest rank)
  double loss = 0;                   // of the last timed step
  std::size_t buckets = 0;
  std::size_t psi = 0;               // padded parameter bytes (N · shard bytes)
  std::size_t sharded = 0;           // measured: sharded params + grads + optimizer state
  std::size_t unsharded_peak = 0;    // measured, the most over ranks and timed steps
  std::size_t theory_unsharded = 0;  // U above
  std::size_t root_bytes = 0;        // P(0): the root unit, gathered once even under ZeRO3
  std::size_t bytes_per_step = 0;    // measured, the most over timed steps
  std::vector<double> minor_faults;  // page faults of every timed step (the most over ranks): 0 when nothing is allocated anew
};

// The minor page faults of this process so far (every thread): a fresh allocation's first touch.
long minor_faults_so_far() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

cli make_cli() {
  cli c("bench_step", "one training step of the example GPT for every sharding x bucketing (run under mpirun)");
  kfsdp::examples::add_gpt_flags(c)
      .flag("steps", "10", "timed steps per combination and round (the median over all is shown)")
      .flag("warmup", "2", "untimed steps per combination and round first")
      .flag("rounds", "3", "times over every combination (each with a fresh engine)")
      .flag("sharding", "all", "zero2 | zero3 | all")
      .flag("bucketing", "all", "none | layer | block | all")
      .flag("trace", "", "write the timeline of the last timed step of each combination (FILE.rank<r>.json)");
  kfsdp::examples::add_schedule_flags(c, "auto");
  return c;
}

settings read(const cli& c, int world_size) {
  settings s;
  s.data = c.str("data");
  s.model = kfsdp::examples::gpt_config_of(c);
  s.batch = c.size("batch");
  s.steps = c.size("steps");
  s.warmup = c.size("warmup");
  s.rounds = c.size("rounds");
  s.dtype = c.choice("dtype", {"f32", "f64"});
  s.seed = c.size("seed");
  s.trace = c.str("trace");
  auto fail = [](const std::string& m) { throw std::invalid_argument("bench_step: " + m); };
  s.overlap_flag = kfsdp::examples::read_schedule_flags(c, s.schedule);
  if (s.batch == 0 || s.batch % std::size_t(world_size) != 0)
    fail(fmt::format("--batch is {}, expected a positive multiple of the {} ranks", s.batch, world_size));
  if (s.steps == 0) fail("--steps is 0, expected at least 1");
  if (s.rounds == 0) fail("--rounds is 0, expected at least 1");
  const std::string sh = c.str("sharding"), bu = c.str("bucketing");
  if (sh == "all") s.shardings = {kfsdp::sharding_strategy::zero2, kfsdp::sharding_strategy::zero3};
  else s.shardings = {kfsdp::parse_sharding(sh)};
  if (bu == "all") s.bucketings = {kfsdp::bucketing::none, kfsdp::bucketing::layer, kfsdp::bucketing::block};
  else s.bucketings = {kfsdp::parse_bucketing(bu)};
  return s;
}

double mib(std::size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The most of `value` over ranks (an all-gather: the communicator has no all_reduce_max).
double max_over_ranks(kfsdp::comm::any_communicator& comm, double value) {
  std::vector<double> all(std::size_t(comm.size()));
  const double mine[1] = {value};
  kfsdp::comm::all_gather(comm, std::span<const double>(mine), std::span<double>(all));
  return *std::max_element(all.begin(), all.end());
}

// U of the header: the unsharded bytes of the schedule (parameters in flight + the gradients of
// the root and of the unit in backward), from the engine's plan and units.
template <class Trainer>
std::size_t theory_unsharded(Trainer& trainer, bool zero3) {
  using Scalar = typename Trainer::scalar_type;
  const auto& engine = trainer.engine();
  const std::size_t n = trainer.units().size();
  std::vector<std::size_t> p(n + 1, 0);  // p[n] = 0: no unit after the last
  for (std::size_t u = 0; u < n; ++u)
    for (std::size_t b : trainer.units()[u].buckets) p[u] += engine.plan().gathered_numel(b) * sizeof(Scalar);
  std::size_t most = 0, all = 0;
  for (std::size_t u = 0; u < n; ++u) all += p[u];
  for (std::size_t u = 1; u < n; ++u) {
    std::size_t forward = p[0], backward = p[0] + p[0] + p[u];  // the root and its gradient, the unit's gradient
    if (zero3) {
      forward += p[u] + p[u + 1];
      backward += p[u] + (u > 1 ? p[u - 1] : 0);
    } else {
      for (std::size_t t = 1; t <= u + 1 && t < n; ++t) forward += p[t];
      backward += all - p[0];
    }
    most = std::max({most, forward, backward});
  }
  return std::max(most, p[0] + p[0] + (n > 1 ? (zero3 ? p[n - 1] : all - p[0]) : 0));  // the head's backward
}

// One round of one combination, added to r (trace: record the last timed step there).
template <class Scalar>
void bench_one(const settings& s, const kfsdp::io::text_windows& data, kfsdp::comm::any_communicator comm,
               const kfsdp::fsdp_options& options, kfsdp::trace_recorder* trace, result& r) {
  const auto model = kfsdp::make_gpt(s.model);
  const std::size_t ws = std::size_t(comm.size()), rank = std::size_t(comm.rank());
  kfsdp::trainer<kfsdp::gpt_descriptor, Scalar> trainer(model, comm, options, {});
  auto& engine = trainer.engine();
  engine.set_progress_between_kernels(s.overlap == kfsdp::examples::overlap_mode::poll);
  using batch = typename std::remove_reference_t<decltype(trainer)>::batch;
  trainer.initialize(s.seed, kfsdp::gpt2_init(s.model.layers));
  const std::size_t shard = engine.plan().shard_numel;
  kfsdp::optim::adamw<Scalar> optimizer(shard, kfsdp::optim::adamw_options{.lr = 2e-3, .weight_decay = 0.01});
  const std::size_t optimizer_bytes = (optimizer.exp_avg().extent(0) + optimizer.exp_avg_sq().extent(0)) * sizeof(Scalar);

  r.sharding = options.sharding();
  r.bucketing = options.bucketing();
  r.buckets = engine.plan().buckets.size();
  r.psi = ws * shard * sizeof(Scalar);
  r.theory_unsharded = theory_unsharded(trainer, options.sharding() == kfsdp::sharding_strategy::zero3);
  r.root_bytes = 0;
  for (std::size_t b : trainer.units()[0].buckets) r.root_bytes += engine.plan().gathered_numel(b) * sizeof(Scalar);
  std::vector<batch> batches(1);
  double unsharded_peak = 0, sharded = 0;
  for (std::size_t step = 0; step < s.warmup + s.steps; ++step) {
    std::vector<int> tokens, targets;
    data.rank_slice(data.micro_batch(kfsdp::io::window_sampling::random, s.seed, step, s.batch), rank, ws, tokens, targets);
    batches[0] = {kfsdp::device_ids(tokens), kfsdp::device_ids(targets)};
    const bool timed = step >= s.warmup, traced = trace != nullptr && step + 1 == s.warmup + s.steps;
    if (traced) engine.set_trace(trace);
    std::optional<kfsdp::trace_recorder::scope> region;
    comm.barrier();
    engine.reset_peak_memory();
    const std::size_t bytes_before = engine.bytes_communicated();
    const long faults_before = minor_faults_so_far();
    const auto start = std::chrono::steady_clock::now();
    if (traced)
      region.emplace(trace, fmt::format("step {} {}", kfsdp::to_string(r.sharding), kfsdp::to_string(r.bucketing)),
                     "compute", kfsdp::trace_recorder::compute_lane, -1, 0);
    const kfsdp::step_result out =
        trainer.step(std::span<const batch>(batches), optimizer, 1.0, kfsdp::grad_accumulation::unsharded);
    region.reset();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double faults = double(minor_faults_so_far() - faults_before);
    if (traced) engine.set_trace(nullptr);
    const double slowest = max_over_ranks(comm, elapsed);
    const double most_faults = max_over_ranks(comm, faults);
    if (!timed) continue;
    r.seconds.push_back(slowest);
    r.minor_faults.push_back(most_faults);
    r.loss = out.loss;
    r.bytes_per_step = std::max(r.bytes_per_step, engine.bytes_communicated() - bytes_before);
    const kfsdp::memory_report m = engine.memory();
    unsharded_peak = std::max(unsharded_peak, double(m.unsharded_peak));
    sharded = std::max(sharded, double(m.sharded_params + m.sharded_grads + optimizer_bytes));
  }
  r.unsharded_peak = std::max(r.unsharded_peak, std::size_t(max_over_ranks(comm, unsharded_peak)));
  r.sharded = std::max(r.sharded, std::size_t(max_over_ranks(comm, sharded)));
}

template <class Scalar>
int run(const settings& s, kfsdp::comm::mpi& world) {
  const bool root = world.rank() == 0;
  const std::size_t ws = std::size_t(world.size());
  const auto data = kfsdp::io::text_windows::from_file(s.data, s.model.seq);
  kfsdp::comm::threaded overlapped(world);
  kfsdp::comm::any_communicator comm =
      s.overlap == kfsdp::examples::overlap_mode::thread ? kfsdp::comm::any_communicator(overlapped)
                                                         : kfsdp::comm::any_communicator(world);
  std::optional<kfsdp::trace_recorder> trace;
  if (!s.trace.empty()) trace.emplace(world.rank());

  if (root)
    fmt::print("bench_step: {} ranks, GPT layers {} dim {} heads {} seq {}, {}, AdamW (k = {}), global batch {} windows "
               "({} tokens/step), overlap {}, limit_all_gathers {}; {} rounds of {} warm-up + {} timed steps per combination\n",
               ws, s.model.layers, s.model.dim, s.model.heads, s.model.seq, s.dtype, adamw_states, s.batch,
               s.batch * s.model.seq, kfsdp::examples::to_string(s.overlap), s.schedule.limit_all_gathers, s.rounds, s.warmup, s.steps);
  if (root) fmt::print("BLAS: {}\n", kfsdp::bench::blas_in_use());
  // The sgemm rate of this run, at c_attn's product over one rank's tokens, on every rank at once
  // (as the step runs) before and after the steps; the best of them, so that %sgemm is not flattered.
  const std::size_t rank_tokens = s.batch / ws * s.model.seq;
  const auto sgemm_now = [&] { return max_over_ranks(comm, kfsdp::bench::sgemm_rate(rank_tokens, s.model.dim, 50)); };
  const double sgemm_before = sgemm_now();
  std::vector<result> results;
  std::vector<kfsdp::fsdp_options> combinations;
  for (const kfsdp::bucketing b : s.bucketings)
    for (const kfsdp::sharding_strategy sh : s.shardings) {
      kfsdp::fsdp_options options = s.schedule;
      options.sharding_strategy = sh;
      options.bucketing_strategy = b;
      combinations.push_back(options);
    }
  results.resize(combinations.size());
  for (std::size_t round = 0; round < s.rounds; ++round)
    for (std::size_t i = 0; i < combinations.size(); ++i) {
      const bool last_round = round + 1 == s.rounds;
      bench_one<Scalar>(s, data, comm, combinations[i], trace && last_round ? &*trace : nullptr, results[i]);
      if (root && last_round) {
        const result& r = results[i];
        fmt::print("  {} / {}: median {:.1f} ms (min {:.1f}, max {:.1f}) over {} steps, loss {:.4f}, "
                   "minor page faults per step: median {:.0f}, max {:.0f}\n",
                   kfsdp::to_string(r.sharding), kfsdp::to_string(r.bucketing), 1e3 * median(r.seconds),
                   1e3 * *std::min_element(r.seconds.begin(), r.seconds.end()),
                   1e3 * *std::max_element(r.seconds.begin(), r.seconds.end()), r.seconds.size(), r.loss,
                   median(r.minor_faults), *std::max_element(r.minor_faults.begin(), r.minor_faults.end()));
        std::fflush(stdout);
      }
    }

  const double sgemm_after = sgemm_now(), sgemm = std::max(sgemm_before, sgemm_after);
  const double step_flops = kfsdp::bench::gpt_step_flops(s.model, s.batch * s.model.seq);

  if (root && !results.empty()) {
    const std::size_t psi = results.front().psi;
    fmt::print("\nsgemm {}x{} * {}x{} (one rank's c_attn product), per core, in this run: {:.2f} GFLOP/s before the "
               "steps, {:.2f} after (the best of the ranks); the step is credited with {:.4f} GFLOP (bench/roofline.hpp)\n",
               rank_tokens, s.model.dim, s.model.dim, 3 * s.model.dim, sgemm_before / 1e9, sgemm_after / 1e9, step_flops / 1e9);
    for (const result& r : results) {
      const double per_rank = step_flops / median(r.seconds) / double(ws);
      fmt::print("  {} / {}: {:.2f} GFLOP/s per rank = {:.1f} % of the better sgemm\n", kfsdp::to_string(r.sharding),
                 kfsdp::to_string(r.bucketing), per_rank / 1e9, 100 * per_rank / sgemm);
    }
    fmt::print("\nPsi = {} bytes ({:.3f} MiB) padded parameters; shard {} bytes per rank\n", psi, mib(psi), psi / ws);
    fmt::print("{:<6} {:<6} {:>7} {:>9} {:>10} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}\n", "shard",
               "bucket", "buckets", "step ms", "tokens/s", "peak MiB", "theory", "ratio", "unshard", "theory", "ratio",
               "bytes/step", "theory", "ratio");
    for (const result& r : results) {
      const std::size_t theory_sharded = (2 + adamw_states) * r.psi / ws;
      const std::size_t peak = r.sharded + r.unsharded_peak, theory_peak = theory_sharded + r.theory_unsharded;
      const std::size_t theory_bytes =
          r.sharding == kfsdp::sharding_strategy::zero3 ? 3 * r.psi - r.root_bytes : 2 * r.psi;
      fmt::print("{:<6} {:<6} {:>7} {:>9.1f} {:>10.0f} {:>10.3f} {:>10.3f} {:>7.3f} {:>10.3f} {:>10.3f} {:>7.3f} "
                 "{:>10.3f} {:>10.3f} {:>7.3f}\n",
                 kfsdp::to_string(r.sharding), kfsdp::to_string(r.bucketing), r.buckets, 1e3 * median(r.seconds),
                 double(s.batch * s.model.seq) / median(r.seconds), mib(peak), mib(theory_peak),
                 double(peak) / double(theory_peak), mib(r.unsharded_peak), mib(r.theory_unsharded),
                 double(r.unsharded_peak) / double(r.theory_unsharded), mib(r.bytes_per_step), mib(theory_bytes),
                 double(r.bytes_per_step) / double(theory_bytes));
    }
    fmt::print("(peak = sharded params + grads + AdamW moments + unsharded peak; theory = (2+k) Psi/N + U; "
               "unshard = unsharded peak vs U; bytes/step in MiB vs 2 Psi (zero2) / 3 Psi - root (zero3))\n");
    for (const kfsdp::bucketing b : s.bucketings) {
      const result *z2 = nullptr, *z3 = nullptr;
      for (const result& r : results)
        if (r.bucketing == b) (r.sharding == kfsdp::sharding_strategy::zero2 ? z2 : z3) = &r;
      if (z2 && z3)
        fmt::print("step time zero3/zero2, {} bucketing: {:.3f}\n", kfsdp::to_string(b), median(z3->seconds) / median(z2->seconds));
    }
    std::fflush(stdout);
  }
  if (trace) {
    trace->write(fmt::format("{}.rank{}.json", s.trace, world.rank()));
    if (root) fmt::print("trace: {} events per rank in {}.rank<r>.json\n", trace->size(), s.trace);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::session job(argc, argv);  // MPI, Kokkos, the world; a bad flag or KFSDP_* variable: "error: ..." and exit 2
  return job.run([&] {
    cli c = make_cli();
    if (!c.parse(argc, argv)) return 0;
    settings s = read(c, job.size());
    s.overlap = kfsdp::examples::overlap_of(s.overlap_flag, job);
    return s.dtype == "f32" ? run<float>(s, job.world()) : run<double>(s, job.world());
  });
}
