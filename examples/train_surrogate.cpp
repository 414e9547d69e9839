// train_surrogate — scientific ML with FSDP: an MLP learns the steady heat equation's solution
// u(x, y; x0, y0, amplitude, width) for Gaussian sources (examples/heat_problem.hpp), from
// finite-difference solutions of --train-problems sources, and is tested on other sources.
//
//   mpirun -np 2 build/examples/train_surrogate --save surrogate.safetensors
//   mpirun -np 3 build/examples/train_surrogate --load surrogate.safetensors --eval on
//   mpirun -np 2 build/examples/train_surrogate --data samples.npz   # numpy.savez(x=[N, 6], y=[N])
//   mpirun -np 2 build/examples/train_surrogate --data samples.h5 --features x --targets u   # HDF5 datasets
//
// The model is one descriptor: input layer, --depth residual hidden layers (each an FSDP unit),
// output layer, MSE. Features and targets are normalised with the training set's statistics,
// which --save stores in the file's metadata beside the sizes, so --load --eval needs no flag
// of the training run but the test set's. Errors are relative L2 in physical units:
// ||u_pred − u||₂ / ||u||₂ over every sample of the set. kfsdp::step_log prints the steps, and
// --metrics F writes one JSON line per step (loss, samples/s, memory, comm bytes).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/comm/threaded/threaded.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/io/data/distributed_sampler.hpp>
#include <kfsdp/io/data/numpy.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/schedule.hpp>
#include <kfsdp/session.hpp>
#include <kfsdp/train/preemption.hpp>
#include <kfsdp/train/step_log.hpp>
#include <kfsdp/train/trainer.hpp>
#endif
#ifdef KFSDP_HAVE_HDF5  // built with parallel HDF5 (meson: hdf5 found), the header build only
#include <kfsdp/io/data/hdf5.hpp>
#endif

#include "cli.hpp"
#include "heat_problem.hpp"
#include "heat_surrogate.hpp"
#include "stop_report.hpp"

namespace {

using stats = kfsdp::io::array_dataset::column_stats;

struct settings {
  std::size_t train_problems, test_problems, grid, width, depth, steps, batch, log_every;
  double lr, weight_decay, clip;
  std::uint64_t seed, test_seed;
  std::string dtype, save, load, metrics, data, features, targets;
  bool eval;
  kfsdp::examples::fsdp_flags flags;  // sharding, bucketing, checkpointing, wire dtypes, overlap
};

settings read(const kfsdp::examples::cli& c, int world_size) {
  settings s;
  s.train_problems = c.size("train-problems");
  s.test_problems = c.size("test-problems");
  s.grid = c.size("grid");
  s.width = c.size("width");
  s.depth = c.size("depth");
  s.steps = c.size("steps");
  s.batch = c.size("batch");
  s.log_every = std::max<std::size_t>(1, c.size("log-every"));
  s.lr = c.real("lr");
  s.weight_decay = c.real("weight-decay");
  s.clip = c.real_at_least("clip", 0);
  s.seed = c.size("seed");
  s.test_seed = c.size("test-seed");
  s.dtype = c.choice("dtype", {"f32", "f64"});
  s.flags = kfsdp::examples::fsdp_flags_of(c);
  s.save = c.str("save");
  s.load = c.str("load");
  s.eval = c.choice("eval", {"on", "off"}) == "on";
  s.metrics = c.str("metrics");
  s.data = c.str("data");
  s.features = c.str("features");
  s.targets = c.str("targets");
  auto fail = [](const std::string& m) { throw std::invalid_argument("train_surrogate: " + m); };
  if (s.eval != !s.load.empty()) fail("--load FILE and --eval on go together (evaluate the saved model, then exit)");
  if (s.eval && !s.metrics.empty()) fail("--metrics and --eval on both given: --eval trains no steps");
  if (s.grid == 0 || s.test_problems == 0) fail("--grid and --test-problems must be at least 1");
  if (!s.eval && (s.train_problems == 0 || s.width == 0 || s.depth == 0))
    fail("--train-problems, --width and --depth must be at least 1");
  if (!s.eval && (s.batch == 0 || s.batch % std::size_t(world_size) != 0))
    fail(fmt::format("--batch is {}, expected a positive multiple of the {} ranks", s.batch, world_size));
  return s;
}

// What --save records beside the weights: the normalisation (predictors apply it) and the sizes.
kfsdp::io::metadata_map metadata_of(const kfsdp::io::array_dataset::normalization& normalization, const settings& s) {
  kfsdp::io::metadata_map metadata = kfsdp::io::stats_metadata(normalization);
  metadata["surrogate.width"] = std::to_string(s.width);
  metadata["surrogate.depth"] = std::to_string(s.depth);
  return metadata;
}

// ||pred − u||₂ / ||u||₂ over the whole set, in physical units: each rank predicts a contiguous
// slice with the full model gathered once, and the sums are all-reduced.
template <class Trainer>
double relative_l2(Trainer& t, const kfsdp::io::array_dataset& set, const std::vector<double>& u, const stats& target,
                   kfsdp::comm::mpi& world) {
  using scalar = typename Trainer::scalar_type;
  const std::size_t first = set.count() * std::size_t(world.rank()) / std::size_t(world.size());
  const std::size_t last = set.count() * std::size_t(world.rank() + 1) / std::size_t(world.size());
  double sums[2] = {0, 0};  // squared error, squared truth
  t.with_full_model([&] {
    for (std::size_t begin = first; begin < last; begin += 4096) {
      const std::size_t rows = std::min<std::size_t>(4096, last - begin);
      const auto pred = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, t.predict(set.rows<scalar>(begin, rows).first));
      for (std::size_t r = 0; r < rows; ++r) {
        const double p = double(pred(r, 0)) * target.stddev[0] + target.mean[0], y = u[begin + r];
        sums[0] += (p - y) * (p - y);
        sums[1] += y * y;
      }
    }
  });
  kfsdp::comm::all_reduce_sum(world, std::span<double>(sums));
  return std::sqrt(sums[0] / sums[1]);
}

// The training samples of --data: an .npz (numpy.savez) or an HDF5 file (.h5, .hdf5) with features
// [N, 6] and targets [N] or [N, 1]. The whole file: every sample is evaluated at the end.
kfsdp::examples::surrogate_samples samples_from(const settings& s, kfsdp::comm::mpi& world) {
  if (s.data.ends_with(".h5") || s.data.ends_with(".hdf5")) {
#ifdef KFSDP_HAVE_HDF5
    const kfsdp::io::hdf5_dataset file(s.data, s.features, s.targets, world.native());
    if (file.in_features() != 6 || file.out_features() != 1)
      throw std::invalid_argument(fmt::format("train_surrogate: --data {}: datasets '{}' and '{}' have widths {} and {}, "
                                              "expected 6 (x, y, x0, y0, amplitude, width) and 1 (u)",
                                              s.data, s.features, s.targets, file.in_features(), file.out_features()));
    const auto [x, u] = file.rows<double>(0, file.count());  // collective: every rank reads it all
    const auto host_x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, x);
    const auto host_u = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, u);
    return {std::vector<double>(host_x.data(), host_x.data() + host_x.size()),
            std::vector<double>(host_u.data(), host_u.data() + host_u.size()), file.count()};
#else
    (void)world;
    throw std::invalid_argument(fmt::format("train_surrogate: --data {}: this build has no HDF5 (meson found no "
                                            "hdf5-openmpi: Debian libhdf5-openmpi-dev), expected an .npz", s.data));
#endif
  }
  const kfsdp::io::numpy_array x = kfsdp::io::read_npz(s.data, s.features), u = kfsdp::io::read_npz(s.data, s.targets);
  const std::size_t n = x.shape.empty() ? 0 : x.shape[0];
  if (x.shape.size() != 2 || x.shape[1] != 6 || n == 0)
    throw std::invalid_argument(fmt::format("train_surrogate: --data {}: array '{}' has shape ({}), expected (N, 6): x, y, "
                                            "x0, y0, amplitude, width", s.data, s.features, fmt::join(x.shape, ", ")));
  if (u.shape != std::vector<std::size_t>{n} && u.shape != std::vector<std::size_t>{n, 1})
    throw std::invalid_argument(fmt::format("train_surrogate: --data {}: array '{}' has shape ({}), expected ({}) or ({}, 1), "
                                            "u at the {} samples of '{}'", s.data, s.targets, fmt::join(u.shape, ", "), n, n, n,
                                            s.features));
  return {x.values, u.values, n};
}

template <class Scalar>
int run(const settings& s, kfsdp::session& job) {
  using namespace kfsdp::examples;
  kfsdp::comm::mpi& world = job.world();
  const bool root = job.is_root();
  const auto test = heat_samples(random_sources(s.test_problems, s.test_seed), s.grid);
  kfsdp::io::array_dataset test_set(test.features, 6, test.targets, 1);
  // Overlap: the engine's collectives go through a worker thread that keeps them progressing, or
  // the compute thread polls them between kernels.
  kfsdp::comm::threaded overlapped(job.shard_group());
  const auto overlap = kfsdp::examples::overlap_of(s.flags.overlap, job);
  const kfsdp::comm::any_communicator engine_comm = overlap == kfsdp::examples::overlap_mode::thread
                                                        ? kfsdp::comm::any_communicator(overlapped)
                                                        : kfsdp::comm::any_communicator(job.shard_group());
  const kfsdp::fsdp_options fsdp = job.fsdp(s.flags.fsdp);
  const kfsdp::trainer_options training{.checkpointing = s.flags.checkpointing};

  if (s.eval) {  // the sizes and the normalisation are the saved model's
    const kfsdp::io::metadata_map meta = kfsdp::io::read_metadata(s.load, world);
    const kfsdp::io::array_dataset::normalization saved = kfsdp::io::stats_from_metadata(meta, 6, 1);  // the surrogate's widths
    const stats target = saved.targets;
    test_set.normalize(saved);
    const auto model = make_saved_surrogate(meta, s.load, sizeof(Scalar));
    kfsdp::trainer<surrogate, Scalar> trainer(model, engine_comm, fsdp, training);
    kfsdp::io::load_model(s.load, trainer.engine());
    const double error = relative_l2(trainer, test_set, test.targets, target, world);
    if (root) fmt::print("test relative L2 {:.9g} ({} ranks, {} samples)\n", error, job.size(), test_set.count());
    return 0;
  }

  const auto train = s.data.empty() ? heat_samples(random_sources(s.train_problems, s.seed), s.grid) : samples_from(s, world);
  kfsdp::io::array_dataset train_set(train.features, 6, train.targets, 1);
  const kfsdp::io::array_dataset::normalization normalization = train_set.normalize();
  test_set.normalize(normalization);
  const stats target = normalization.targets;

  // Stops, before the model is built, one that cannot fit this rank's share of its node's memory.
  job.require_memory(kfsdp::estimate_sharded_memory(surrogate_parameters(s.width, s.depth), sizeof(Scalar), 2 /*AdamW*/,
                                                    std::size_t(job.shard_group().size())),
                     fmt::format("--width {} --depth {} --dtype {}", s.width, s.depth, s.dtype));
  kfsdp::trainer<surrogate, Scalar> trainer(make_surrogate(s.width, s.depth), engine_comm, fsdp, training);
  trainer.engine().set_progress_between_kernels(overlap == kfsdp::examples::overlap_mode::poll);
  trainer.initialize(s.seed);
  kfsdp::optim::adamw<Scalar> adam(trainer, {.weight_decay = s.weight_decay});  // 2-D weights decay, 1-D not
  const kfsdp::optim::cosine schedule(s.lr, s.steps);
  kfsdp::io::distributed_sampler sampler(train_set, s.batch, s.seed);
  if (root)
    fmt::print("train_surrogate: {} ranks, {}, {} parameters ({} per rank), {} hidden layers of {}, {} / {} bucketing, "
               "{} train and {} test samples\n",
               job.size(), s.dtype, trainer.engine().plan().full_numel, trainer.engine().plan().shard_numel, s.depth,
               s.width, kfsdp::to_string(s.flags.fsdp.sharding()),
               kfsdp::to_string(s.flags.fsdp.bucketing()), train_set.count(), test_set.count());
  kfsdp::step_log log(world, {.program = "train_surrogate", .metrics = s.metrics, .unit = "samples", .steps = s.steps,
                              .log_every = s.log_every});
  const auto start = std::chrono::steady_clock::now();
  const kfsdp::stop_signals signals;  // SIGTERM / SIGUSR1: every rank stops at the same step, as fit does
  std::size_t steps_done = 0;
  for (; steps_done < s.steps && !signals.stop_requested(world); ++steps_done) {
    const std::size_t step = steps_done;
    const double lr = schedule(step);
    adam.set_lr(lr);
    auto [x, y] = sampler.next<Scalar>(train_set, std::size_t(world.rank()), std::size_t(job.size()));
    log.measure(step, trainer, adam, lr, s.batch, [&] { return trainer.step({{x, y}}, adam, s.clip); });
  }
  const bool stopped = steps_done < s.steps;
  if (stopped) {  // the weights so far (no resume in this program), marked for the job script
    if (!s.save.empty()) kfsdp::io::save_model(s.save, trainer.engine(), metadata_of(normalization, s));
    report_stopped("train_surrogate", steps_done, s.save, root);
    return 0;
  }
  log.print_loss_change();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double train_error = relative_l2(trainer, train_set, train.targets, target, world);
  const double test_error = relative_l2(trainer, test_set, test.targets, target, world);
  if (root) fmt::print("train relative L2 {:.9g}\ntest relative L2 {:.9g}\ntrained in {:.1f} s\n", train_error, test_error, seconds);
  if (!s.save.empty()) {
    kfsdp::io::save_model(s.save, trainer.engine(), metadata_of(normalization, s));
    kfsdp::mark_finished(s.save, root);
    if (root) fmt::print("saved {}\n", s.save);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::session job(argc, argv);  // MPI, Kokkos, the world; a bad flag or KFSDP_* variable: "error: ..." and exit 2
  return job.run([&] {
    kfsdp::examples::cli c("train_surrogate", "train an MLP surrogate of the steady heat equation with FSDP (run under mpirun)");
    c.flag("train-problems", "512", "heat problems (random Gaussian sources) in the training set")
        .flag("test-problems", "32", "heat problems in the test set (drawn with --test-seed)")
        .flag("grid", "10", "finite-difference grid n: each problem gives n * n samples")
        .flag("width", "64", "hidden width")
        .flag("depth", "4", "residual hidden layers (each an FSDP unit)")
        .flag("steps", "4000", "optimizer steps")
        .flag("batch", "256", "global batch in samples, split evenly over the ranks")
        .flag("lr", "0.003", "AdamW peak learning rate (cosine decay to 0)")
        .flag("weight-decay", "0", "AdamW decoupled weight decay (of the 2-D weights; biases not)")
        .flag("clip", "1.0", "clip the global gradient norm to this (0: off)")
        .flag("seed", "1", "initialisation, batches and training problems")
        .flag("test-seed", "1000", "test problems (apart from the training ones)")
        .flag("dtype", "f64", "f32 | f64")
        .flag("log-every", "500", "print every k-th step")
        .flag("save", "", "write the weights and normalisation here (safetensors) at the end")
        .flag("load", "", "with --eval on: the weights to evaluate")
        .flag("eval", "off", "on (with --load FILE): print the test relative L2 of the saved model and exit")
        .flag("metrics", "", "write one JSON line per step here (rank 0; loss, samples/s, memory, comm bytes; overwritten)")
        .flag("data", "", "train on the samples of this .npz (numpy.savez) or .h5 (HDF5) instead of --train-problems sources")
        .flag("features", "x", "with --data: the array (HDF5: dataset) of features [N, 6] (x, y, x0, y0, amplitude, width)")
        .flag("targets", "y", "with --data: the array (HDF5: dataset) of targets [N] or [N, 1] (u)");
    kfsdp::examples::add_fsdp_flags(c, "zero3", "layer");
    if (!c.parse(argc, argv)) return 0;
    const settings s = read(c, job.size());
    return s.dtype == "f32" ? run<float>(s, job) : run<double>(s, job);
  });
}
