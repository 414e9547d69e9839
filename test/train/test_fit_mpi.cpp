// kfsdp::fit and kfsdp::session: the same losses at any world size (against a one-rank session on
// every rank), resuming from the newest complete checkpoint, keeping the last N, refusing another
// configuration, the evaluation metrics against hand-computed ones, a NaN loss named by its step, a
// signal on one rank stopping every rank, the session's HSDP groups and bad settings, and
// kfsdp::evaluate in a loop of one's own (flat and HSDP).
// Run with 1, 2 and 3 ranks.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <kfsdp/optim/any_optimizer.hpp>
#include <kfsdp/session.hpp>
#include <kfsdp/train/evaluate.hpp>
#include <kfsdp/train/fit.hpp>
#include <kfsdp/train/step_log.hpp>

#include "../support/messages.hpp"

namespace {

using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 3, 16>, kfsdp::gelu<>, kfsdp::linear<"fc2", 16, 1>,
                              kfsdp::mse<>>;
using wide_mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 3, 32>, kfsdp::gelu<>, kfsdp::linear<"fc2", 32, 1>,
                                   kfsdp::mse<>>;
using classifier = kfsdp::sequential<"", kfsdp::linear<"fc1", 3, 16>, kfsdp::gelu<>,
                                     kfsdp::linear<"fc2", 16, 3>, kfsdp::cross_entropy<"", 3>>;

constexpr std::size_t global_batch = 12;  // splits over 1, 2 and 3 ranks

// y = sin(x0) + x1·x2 (regression), or the class of the largest feature (classification).
kfsdp::io::array_dataset samples(std::size_t count, std::uint64_t seed, bool classes = false) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(count * 3), y(count);
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < 3; ++j) x[i * 3 + j] = u(rng);
    const double* row = &x[i * 3];
    y[i] = classes ? double(std::max_element(row, row + 3) - row) : std::sin(row[0]) + row[1] * row[2];
  }
  return kfsdp::io::array_dataset(x, 3, y, 1);
}

// A directory every rank names alike (from rank 0's process id), empty at the start.
std::filesystem::path shared_dir(kfsdp::comm::mpi& world, const std::string& name) {
  std::uint64_t id[1] = {std::uint64_t(::getpid())};
  kfsdp::comm::broadcast(world, std::span<std::uint64_t>(id), 0);
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kfsdp-test-fit-{}-{}", id[0], name);
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  return dir;
}

std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The training losses of a fit's metrics file (its "loss" fields, not "eval_loss").
std::vector<double> losses_in(const std::filesystem::path& path) {
  std::vector<double> losses;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("\"loss\": ");
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 8)));
  }
  return losses;
}

kfsdp::fit_result train(kfsdp::session& job, const kfsdp::io::array_dataset& data,
                        const kfsdp::fit_options& options) {
  kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                    job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                              .bucketing_strategy = kfsdp::bucketing::layer}));
  model.initialize(7);
  kfsdp::optim::adamw<double> adam(model, {.weight_decay = 0.01});
  const kfsdp::fit_result result =
      kfsdp::fit(model, adam, kfsdp::optim::cosine(1e-2, 40), data, options);
  job.world().barrier();  // rank 0's files are complete and closed for every rank to read
  return result;
}

// The metrics of a model with one output, recomputed here from every rank predicting every sample
// (each call collective alike): MSE (the loss), relative L2, and the one user metric, |p - t| a sample.
template <class Trainer>
void check_regression_metrics(Trainer& model, const kfsdp::io::array_dataset& data, const kfsdp::eval_metrics& got,
                              const std::string& user_metric) {
  auto [x, y] = data.rows<double>(0, data.count());
  const auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.predict(x));
  const auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  double squared = 0, target = 0, absolute = 0;
  for (std::size_t r = 0; r < data.count(); ++r) {
    squared += (p(r, 0) - t(r, 0)) * (p(r, 0) - t(r, 0));
    target += t(r, 0) * t(r, 0);
    absolute += std::abs(p(r, 0) - t(r, 0));
  }
  const double n = double(data.count());
  CHECK(got.mse == doctest::Approx(squared / n).epsilon(1e-12));
  CHECK(got.loss == doctest::Approx(squared / n).epsilon(1e-12));
  CHECK(got.relative_l2 == doctest::Approx(std::sqrt(squared / target)).epsilon(1e-12));
  REQUIRE(got.user.size() == 1);
  CHECK(got.user[0].first == user_metric);
  CHECK(got.user[0].second == doctest::Approx(absolute / n).epsilon(1e-12));
  CHECK(std::isnan(got.accuracy));
}

std::string error_of(const auto& run) {
  try {
    run();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("fit: the losses are the same at any world size (the sampler's global batches), flat or HSDP") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "invariance");
  const auto data = samples(60, 1);
  kfsdp::fit_options options{.steps = 8,
                             .global_batch = global_batch,
                             .seed = 3,
                             .log_every = 1,
                             .metrics_file = dir / "world.jsonl"};
  if (job.is_root()) std::filesystem::create_directories(dir);
  job.world().barrier();
  const kfsdp::fit_result world = train(job, data, options);
  {
    kfsdp::session alone({.ranks = MPI_COMM_SELF});  // every rank, a job of one rank
    options.metrics_file = dir / fmt::format("alone{}.jsonl", job.rank());
    const kfsdp::fit_result one = train(alone, data, options);
    CHECK(one.loss == doctest::Approx(world.loss).epsilon(1e-12));
  }
  const std::vector<double> losses = losses_in(dir / "world.jsonl");
  const std::vector<double> alone = losses_in(dir / fmt::format("alone{}.jsonl", job.rank()));
  REQUIRE(losses.size() == 8);
  REQUIRE(alone.size() == 8);
  for (std::size_t step = 0; step < losses.size(); ++step) {
    CAPTURE(step);
    CHECK(alone[step] == doctest::Approx(losses[step]).epsilon(1e-12));
  }
  CHECK(losses.back() < losses.front());
  {
    // HSDP: each rank its own shard group, replicated over all; checkpoints through the first group.
    kfsdp::session hybrid({.hybrid_shard = 1});
    options.metrics_file = dir / "hybrid.jsonl";
    options.checkpoint_dir = dir / "hybrid";
    const kfsdp::fit_result replicated = train(hybrid, data, options);
    CHECK(replicated.loss == doctest::Approx(world.loss).epsilon(1e-12));
    CHECK(kfsdp::checkpoint_steps(dir / "hybrid") == std::vector<std::size_t>{8});
    CHECK(train(hybrid, data, options).resumed_from == 8);
  }
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE(
    "fit: resumes from the newest complete checkpoint; one cut short and a half-written one are skipped") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "resume");
  const auto data = samples(60, 2);
  const kfsdp::fit_options options{.steps = 6,
                                   .global_batch = global_batch,
                                   .seed = 3,
                                   .checkpoint_dir = dir,
                                   .checkpoint_every = 2,
                                   .keep_last = 10,
                                   .metadata = {{"user.note", "kept"}}};
  const kfsdp::fit_result first = train(job, data, options);
  CHECK(first.resumed_from == 0);
  CHECK(first.step == 6);
  CHECK(kfsdp::checkpoint_steps(dir) == std::vector<std::size_t>{2, 4, 6});
  const std::string final_bytes = bytes_of(kfsdp::checkpoint_path(dir, 6));
  job.world().barrier();  // every rank has read it before rank 0 cuts it

  // The last checkpoint cut to half its size (a copy interrupted), and a save killed after its header.
  if (job.is_root()) std::filesystem::resize_file(kfsdp::checkpoint_path(dir, 6), final_bytes.size() / 2);
  {
    kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                      job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                                .bucketing_strategy = kfsdp::bucketing::layer}));
    model.initialize(7);
    kfsdp::io::testing::set_stop_after_header([](const std::filesystem::path&) { return true; });
    CHECK_THROWS_AS(kfsdp::io::save_model(kfsdp::checkpoint_path(dir, 8), model.engine()),
                    std::runtime_error);
    kfsdp::io::testing::set_stop_after_header({});
  }
  job.world().barrier();
  CHECK(kfsdp::checkpoint_steps(dir) ==
        std::vector<std::size_t>{2, 4, 6});  // the half-written file is not listed

  const kfsdp::fit_result resumed = train(job, data, options);
  CHECK(resumed.resumed_from == 4);
  CHECK(resumed.step == 6);
  CHECK(resumed.metadata.at("user.note") == "kept");
  CHECK(resumed.loss == first.loss);
  CHECK(bytes_of(kfsdp::checkpoint_path(dir, 6)) == final_bytes);

  // Nothing left to do: it resumes at the last step and trains no more.
  const kfsdp::fit_result again = train(job, data, options);
  CHECK(again.resumed_from == 6);
  CHECK(again.step == 6);

  // Another configuration is refused before its data is read, naming the file and the key (not
  // skipped as incomplete); resume = false starts afresh.
  kfsdp::fit_options other = options;
  other.seed = 4;
  const std::string seed_error = error_of([&] { train(job, data, other); });
  CHECK(seed_error.find("fit: resuming from " + kfsdp::checkpoint_path(dir, 6).string()) != std::string::npos);
  CHECK(seed_error.find("'sampler.seed' is '3', expected '4'") != std::string::npos);
  {
    kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                      job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3}));
    model.initialize(7);
    kfsdp::optim::sgd<double> sgd(model.engine().plan().shard_numel, {.lr = 0.1, .momentum = 0.9});
    CHECK(error_of([&] { kfsdp::fit(model, sgd, kfsdp::optim::constant(0.1), data, options); })
              .find("'optimizer' is 'adamw', expected 'sgd'") != std::string::npos);
    kfsdp::trainer<wide_mlp, double> wide(wide_mlp{}, job.shard_group(),
                                          job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3}));
    kfsdp::optim::adamw<double> adam(wide);
    CHECK(error_of([&] { kfsdp::fit(wide, adam, kfsdp::optim::constant(0.1), data, options); })
              .find("'kfsdp.numel' is '81', expected '161'") != std::string::npos);
  }
  CHECK(kfsdp::checkpoint_steps(dir) == std::vector<std::size_t>{2, 4, 6});  // nothing written over
  other.resume = false;
  CHECK(train(job, data, other).resumed_from == 0);
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE("fit: SGD's momentum goes through the checkpoint protocol: resuming is bit for bit") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "sgd");
  const auto data = samples(60, 6);
  const kfsdp::fit_options options{.steps = 4, .global_batch = global_batch, .checkpoint_dir = dir,
                                   .checkpoint_every = 2};
  const auto run = [&] {
    kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                      job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero2}));
    model.initialize(7);
    kfsdp::optim::sgd<double> sgd(model.engine().plan().shard_numel, {.lr = 0.05, .momentum = 0.9});
    const kfsdp::fit_result result = kfsdp::fit(model, sgd, kfsdp::optim::cosine(0.05, 4), data, options);
    job.world().barrier();
    return result;
  };
  CHECK(run().resumed_from == 0);
  const std::string final_bytes = bytes_of(kfsdp::checkpoint_path(dir, 4));
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove(kfsdp::checkpoint_path(dir, 4));
  job.world().barrier();
  CHECK(run().resumed_from == 2);
  CHECK(bytes_of(kfsdp::checkpoint_path(dir, 4)) == final_bytes);
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE("fit with a frozen group (any_optimizer): the group stays as it was, and resuming is bit for bit") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "frozen");
  const auto data = samples(60, 8);
  const kfsdp::fit_options options{.steps = 6, .global_batch = global_batch, .checkpoint_dir = dir,
                                   .checkpoint_every = 3};
  const auto run = [&](kfsdp::state_dict* initial, kfsdp::state_dict* final) {
    kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                      job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                                .bucketing_strategy = kfsdp::bucketing::layer}));
    model.initialize(9);
    if (initial != nullptr) *initial = model.engine().original_state_dict();
    kfsdp::optim::any_optimizer<double> adam(model, {.kind = "adamw", .lr = 1e-2, .weight_decay = 0.1},
                                             {{.name_contains = "fc1.", .frozen = true}});
    const kfsdp::fit_result result = kfsdp::fit(model, adam, kfsdp::optim::cosine(1e-2, 6), data, options);
    if (final != nullptr) *final = model.engine().original_state_dict();
    job.world().barrier();
    return result;
  };
  kfsdp::state_dict initial, final;
  CHECK(run(&initial, &final).resumed_from == 0);
  for (const char* frozen : {"fc1.weight", "fc1.bias"}) CHECK(final.at(frozen).bytes == initial.at(frozen).bytes);
  CHECK(final.at("fc2.weight").bytes != initial.at("fc2.weight").bytes);
  // The checkpoint holds no optimizer state for the frozen group.
  const auto saved = kfsdp::io::load_state_dict_file(kfsdp::checkpoint_path(dir, 6));
  CHECK(saved.find("optimizer.exp_avg.fc1.weight") == nullptr);
  CHECK(saved.find("optimizer.exp_avg.fc2.weight") != nullptr);
  const std::string final_bytes = bytes_of(kfsdp::checkpoint_path(dir, 6));
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove(kfsdp::checkpoint_path(dir, 6));
  job.world().barrier();
  CHECK(run(nullptr, nullptr).resumed_from == 3);
  CHECK(bytes_of(kfsdp::checkpoint_path(dir, 6)) == final_bytes);
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE("step_log: one JSON line per step with the step's loss, memory that sums, communication and rate; a bad path "
          "is refused on every rank") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "step-log");
  std::filesystem::create_directories(dir);
  const kfsdp::io::array_dataset data = samples(48, 3);
  kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                    job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                              .bucketing_strategy = kfsdp::bucketing::layer}));
  model.initialize(7);
  kfsdp::optim::adamw<double> adam(model, {.lr = 1e-2});
  std::vector<kfsdp::step_result> stepped;
  {
    kfsdp::step_log log(job.world(), {.program = "probe", .metrics = dir / "steps.jsonl", .steps = 4, .log_every = 2});
    kfsdp::io::distributed_sampler sampler(data, global_batch, 1);
    for (std::size_t step = 0; step < 4; ++step) {
      auto [x, y] = sampler.next<double>(data, std::size_t(job.rank()), std::size_t(job.size()));
      stepped.push_back(log.measure(step, model, adam, 1e-2, global_batch, [&] { return model.step({{x, y}}, adam); }));
    }
  }
  job.world().barrier();
  std::ifstream in(dir / "steps.jsonl");
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto number = [&](const std::string& key) {
      const auto at = line.find("\"" + key + "\": ");
      REQUIRE(at != std::string::npos);
      return std::stod(line.substr(at + key.size() + 4));
    };
    REQUIRE(lines < stepped.size());
    CHECK(number("step") == double(lines + 1));
    CHECK(number("loss") == stepped[lines].loss);  // the shortest round trip: the very double
    CHECK(number("grad_norm") == stepped[lines].grad_norm);
    CHECK(number("memory_per_rank_bytes") == number("params_bytes") + number("grads_bytes") + number("optimizer_bytes") +
                                                 number("unsharded_peak_bytes"));
    CHECK(number("optimizer_bytes") == double(adam.state_bytes()));
    CHECK(number("samples_per_s") * number("step_time_s") == doctest::Approx(double(global_batch)));
    CHECK((job.size() == 1 || number("comm_bytes") > 0));
  }
  CHECK(lines == 4u);  // rank 0 wrote every step; every rank reads its file
  const std::string refused = kfsdp::test::error_message([&] {
    kfsdp::step_log bad(job.world(), {.program = "probe", .metrics = dir / "no-dir" / "m.jsonl"});
  });
  CHECK(refused == fmt::format("probe: --metrics '{}' cannot be opened for writing: No such file or directory",
                               (dir / "no-dir" / "m.jsonl").string()));
  job.world().barrier();
  if (job.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("fit: keeps the last N checkpoints") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "keep");
  const kfsdp::fit_result result = train(job, samples(60, 3),
                                         {.steps = 10,
                                          .global_batch = global_batch,
                                          .checkpoint_dir = dir,
                                          .checkpoint_every = 2,
                                          .keep_last = 2});
  CHECK(result.checkpoint == kfsdp::checkpoint_path(dir, 10));
  CHECK(kfsdp::checkpoint_steps(dir) == std::vector<std::size_t>{8, 10});
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE(
    "fit: keeping the last N removes only its own checkpoints; files and folders it did not name stay") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "keep-others");
  if (job.is_root()) {
    std::filesystem::create_directories(dir / "step-00000001.safetensors");  // a folder with fit's name
    std::ofstream(dir / "step-5.safetensors") << "a user's file";            // not a name fit gives
    std::ofstream(dir / "step-000000003.safetensors") << "nor this";
    std::ofstream(dir / "notes.txt") << "lr 1e-2";
  }
  job.world().barrier();
  CHECK(kfsdp::checkpoint_steps(dir).empty());
  const kfsdp::fit_result result = train(job, samples(60, 3),
                                         {.steps = 10,
                                          .global_batch = global_batch,
                                          .checkpoint_dir = dir,
                                          .checkpoint_every = 2,
                                          .keep_last = 2});
  CHECK(result.resumed_from == 0);
  CHECK(kfsdp::checkpoint_steps(dir) == std::vector<std::size_t>{8, 10});
  CHECK(std::filesystem::is_directory(dir / "step-00000001.safetensors"));
  CHECK(bytes_of(dir / "step-5.safetensors") == "a user's file");
  CHECK(bytes_of(dir / "step-000000003.safetensors") == "nor this");
  CHECK(bytes_of(dir / "notes.txt") == "lr 1e-2");
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE("fit: evaluation metrics equal the hand-computed ones") {
  kfsdp::session job;
  const auto test = samples(20, 9);
  const auto test_classes = samples(20, 9, /*classes=*/true);
  const kfsdp::fit_metric mean_abs_error{
      .name = "mean_abs_error", .per_sample = [](std::span<const double> p, std::span<const double> t) {
        return std::abs(p[0] - t[0]);
      }};
  SUBCASE("mse: loss, mse, relative L2, a user metric") {
    kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                      job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3}));
    model.initialize(5);
    kfsdp::optim::adamw<double> adam(model);
    const kfsdp::fit_result result = kfsdp::fit(
        model, adam, kfsdp::optim::constant(1e-2), samples(60, 4),
        {.steps = 3, .global_batch = global_batch, .eval_data = &test, .metrics = {mean_abs_error}});
    check_regression_metrics(model, test, result.eval, "mean_abs_error");
    CHECK(std::isnan(result.eval.perplexity));
  }
  SUBCASE("cross-entropy: loss, accuracy, perplexity") {
    kfsdp::trainer<classifier, double> model(
        classifier{}, job.shard_group(), job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3}));
    model.initialize(5);
    kfsdp::optim::adamw<double> adam(model);
    const kfsdp::fit_result result =
        kfsdp::fit(model, adam, kfsdp::optim::constant(1e-2), samples(60, 4, true),
                   {.steps = 3, .global_batch = global_batch, .eval_data = &test_classes});
    auto [x, y] = test_classes.rows<double>(0, test_classes.count());
    const auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.predict(x));
    const auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    double correct = 0, loss = 0;
    for (std::size_t r = 0; r < test_classes.count(); ++r) {
      std::size_t best = 0;
      double largest = logits(r, 0), sum = 0;
      for (std::size_t c = 1; c < 3; ++c)
        if (logits(r, c) > largest) largest = logits(r, best = c);
      for (std::size_t c = 0; c < 3; ++c) sum += std::exp(logits(r, c) - largest);
      const auto label = std::size_t(t(r, 0));
      correct += best == label ? 1 : 0;
      loss += std::log(sum) + largest - logits(r, label);
    }
    const double n = double(test_classes.count());
    CHECK(result.eval.loss == doctest::Approx(loss / n).epsilon(1e-10));
    CHECK(result.eval.accuracy == doctest::Approx(correct / n).epsilon(1e-12));
    CHECK(result.eval.perplexity == doctest::Approx(std::exp(loss / n)).epsilon(1e-10));
    CHECK(std::isnan(result.eval.mse));
  }
}

TEST_CASE("fit: a NaN loss stops training, naming the step, and saves nothing") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "nan");
  std::vector<double> x(24 * 3, 0.5), y(24, std::nan(""));
  const kfsdp::io::array_dataset poisoned(x, 3, y, 1);
  const std::string error = error_of([&] {
    train(job, poisoned,
          {.steps = 5, .global_batch = global_batch, .checkpoint_dir = dir, .checkpoint_every = 1});
  });
  CHECK(error.find("fit: step 1 of 5") != std::string::npos);
  CHECK(error.find("the loss is nan") != std::string::npos);
  CHECK(kfsdp::checkpoint_steps(dir).empty());
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE("fit: SIGUSR1 on one rank stops every rank at the next step boundary, after a checkpoint") {
  kfsdp::session job;
  const auto dir = shared_dir(job.world(), "signal");
  const auto test = samples(20, 9);
  const int signalling = job.size() - 1;
  bool raised = false;
  // Raised on the last rank only, during the evaluation after step 4.
  const kfsdp::fit_metric signal_once{.name = "signal", .per_sample = [&](auto, auto) {
                                        if (job.rank() == signalling && !raised)
                                          raised = std::raise(SIGUSR1) == 0;
                                        return 0.0;
                                      }};
  const kfsdp::fit_result result = train(job, samples(60, 5),
                                         {.steps = 10,
                                          .global_batch = global_batch,
                                          .eval_data = &test,
                                          .eval_every = 4,
                                          .metrics = {signal_once},
                                          .checkpoint_dir = dir});
  CHECK(result.preempted);
  CHECK(result.step == 4);
  CHECK(result.checkpoint == kfsdp::checkpoint_path(dir, 4));
  CHECK(kfsdp::checkpoint_steps(dir) == std::vector<std::size_t>{4});
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove_all(dir);
}

TEST_CASE("session: HSDP groups from the option or later, memory checks; a bad setting is an error from run()") {
  {
    kfsdp::session job({.hybrid_shard = 1});  // every rank its own shard group, replicated over all
    CHECK(job.shard_group().size() == 1);
    REQUIRE(job.replicas() != nullptr);
    CHECK(job.replicas()->size() == job.size());
    CHECK(job.fsdp().replica_group.has_value());
    CHECK(job.run([] { return 7; }) == 7);
  }
  {
    kfsdp::session per_node({.hybrid_shard = kfsdp::shard_per_node});  // the test's ranks share one node
    CHECK(per_node.shard_group().size() == per_node.size());
    REQUIRE(per_node.replicas() != nullptr);
    CHECK(per_node.replicas()->size() == 1);
  }
  {
    kfsdp::session flat({.hybrid_shard = 0});
    CHECK(&flat.shard_group() == &flat.world());
    CHECK(flat.replicas() == nullptr);
    flat.set_hybrid_shard(1);  // from a flag read after the start: the groups form then
    CHECK(flat.shard_group().size() == 1);
    REQUIRE(flat.replicas() != nullptr);
    CHECK(flat.replicas()->size() == flat.size());
    CHECK_THROWS_WITH_AS(flat.set_hybrid_shard(std::size_t(flat.size() + 1)),
                         fmt::format("session: hybrid_shard is {}, expected a divisor of the {} ranks (or 0: flat)",
                                     flat.size() + 1, flat.size()).c_str(),
                         std::invalid_argument);
    CHECK(&flat.shard_group() == &flat.world());  // a refused setting leaves none
    flat.set_hybrid_shard(0);
    CHECK(flat.replicas() == nullptr);
    // Memory: a need that fits passes; one that cannot stops every rank, the figures named.
    CHECK(flat.host_memory_per_rank() > 0);
    CHECK_NOTHROW(flat.require_memory({.params = 1024}, "--size 1"));
    const std::string refused = kfsdp::test::error_message([&] { flat.require_memory({.params = 1e30}, "--size 1e30"); });
    CHECK(refused.starts_with(fmt::format("the model does not fit: it needs {} (params {}, grads 0 B",
                                          kfsdp::format_bytes(1e30), kfsdp::format_bytes(1e30))));
    CHECK(refused.ends_with("ranks on this node; set by --size 1e30"));
    const std::string other = kfsdp::test::error_message(
        [&] { flat.require_memory({.params = flat.rank() == 0 ? 1e30 : 0.0}, "--size 1e30"); });
    if (flat.rank() > 0) CHECK(other == "the model does not fit the memory of another rank's node; set by --size 1e30");
  }
  {
    kfsdp::session job(
        {.hybrid_shard = std::size_t(kfsdp::comm::mpi().size() + 1)});  // divides no world size
    bool ran = false;
    CHECK(job.run([&] { ran = true; }) == 2);
    CHECK_FALSE(ran);
  }
  {
    ::setenv("KFSDP_HYBRID_SHARD", "abc", 1);
    kfsdp::session job;
    ::unsetenv("KFSDP_HYBRID_SHARD");
    CHECK(job.run([] {}) == 2);
  }
}

// A user's own loop: trainer.step over rank slices, then kfsdp::evaluate on held-out data, as
// docs/training.md shows it; the metrics are the hand-computed ones over every sample, on every rank.
TEST_CASE("kfsdp::evaluate in a loop of one's own: the whole dataset's metrics, flat and HSDP") {
  for (const std::size_t hybrid : {std::size_t(0), std::size_t(1)}) {
    CAPTURE(hybrid);
    kfsdp::session job({.hybrid_shard = hybrid});  // 1: every rank its own shard group, replicated over all
    const auto train = samples(60, 4), test = samples(20, 9);
    kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                      job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3}));
    model.initialize(5);
    kfsdp::optim::adamw<double> adam(model, {.lr = 1e-2});
    for (std::size_t step = 0; step < 3; ++step) {
      auto [x, y] = train.rank_slice<double>(train.micro_batch(/*seed=*/0, step, global_batch), std::size_t(job.rank()),
                                             std::size_t(job.size()));
      (void)model.step({{x, y}}, adam);
    }
    const kfsdp::eval_metrics metrics = kfsdp::evaluate(
        model, test, {{.name = "max_abs_error", .per_sample = [](std::span<const double> p, std::span<const double> t) {
                         return std::abs(p[0] - t[0]);
                       }}});
    check_regression_metrics(model, test, metrics, "max_abs_error");
    // The same numbers on every rank: the sums went over the trainer's ranks, replicas included.
    double spread[2] = {metrics.relative_l2, -metrics.relative_l2};
    job.world().all_reduce_max(std::span<double>(spread));
    CHECK(spread[0] == -spread[1]);
    if (job.size() > 1) {
      const auto tiny = samples(std::size_t(job.size()) - 1, 3);
      CHECK(error_of([&] { (void)kfsdp::evaluate(model, tiny); }) ==
            fmt::format("kfsdp::evaluate: data has {} samples, expected at least one per rank ({} ranks)",
                        job.size() - 1, job.size()));
    }
  }
}
