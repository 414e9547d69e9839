// fit_surrogate — the README's whole user program: an MLP surrogate of the 2-D steady heat
// equation (finite-difference solutions for random Gaussian sources), trained with FSDP.
//   mpirun -np 2 build/examples/fit_surrogate        (examples/train_surrogate: the same with flags)
// Checkpoints go to checkpoints/ (a run resumes there); SIGTERM or SIGUSR1 saves, then exits cleanly.
#include <kfsdp/session.hpp>
#include <kfsdp/train/fit.hpp>
#include "heat_problem.hpp"

using namespace kfsdp;
// u(x, y; x0, y0, amplitude, width): 6 features in, 1 out, 4 residual hidden layers (each an FSDP unit).
using surrogate = sequential<"", linear<"input", 6, 64>, gelu<>,
                             repeat<"hidden", 4, residual<"", linear<"fc", 64, 64>, gelu<>>>,
                             linear<"output", 64, 1>, mse<>>;

int main(int argc, char** argv) {
  session job(argc, argv);  // MPI, Kokkos, the world communicator (docs/training.md: Environment variables)
  return job.run([&] {
    const auto train = examples::heat_samples(examples::random_sources(512, /*seed=*/1), /*grid=*/10);
    const auto test = examples::heat_samples(examples::random_sources(32, /*seed=*/1000), 10);
    io::array_dataset data(train.features, 6, train.targets, 1), held_out(test.features, 6, test.targets, 1);
    const auto stats = data.normalize();  // mean 0, stddev 1 per column; the test set takes the same
    held_out.normalize(stats);

    trainer<surrogate, double> model(surrogate{}, job.shard_group(),
        job.fsdp({.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::layer}));
    model.initialize(/*seed=*/1);
    optim::adamw<double> adam(model, {.weight_decay = 0.0});
    const fit_result result = fit(model, adam, optim::cosine(3e-3, 4000), data,
        {.steps = 4000, .global_batch = 256, .seed = 1, .max_norm = 1.0, .eval_data = &held_out,
         .checkpoint_dir = "checkpoints", .checkpoint_every = 1000, .metadata = io::stats_metadata(stats)});
    if (result.preempted) return;  // checkpoints/ holds the run and checkpoints.stopped says so: requeue
    io::save_model("surrogate.safetensors", model.engine());
    if (job.is_root()) fmt::print("test mse {:.3g} (in units of the training set's variance)\n", result.eval.mse);
  });
}
