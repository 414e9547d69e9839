// Llama (model/llama.hpp) trained by kfsdp::trainer: the concat container equals one linear over
// the concatenated weights; the whole model's gradients equal central differences of its loss;
// sharded training equals one process at every world size; on the tiny fixture of
// test/model/llama (made by transformers), the logits, the loss and 3 SGD steps equal transformers'.
// Run with 1, 2 and 3 ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/optim/sgd.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/llama.hpp>
#include <kfsdp/train/trainer.hpp>

#include "gradient_check.hpp"
#include "../support/llama_fixture.hpp"

using namespace kfsdp;

namespace {

const llama_config tiny{.vocab = 256, .dim = 8, .hidden = 12, .layers = 2, .heads = 2, .kv_heads = 1, .seq = 4};

io::text_windows sample_text(std::size_t seq) {
  const std::string line = "In the beginning God created the heaven and the earth. And the earth was without form. ";
  std::string text;
  for (int i = 0; i < 6; ++i) text += line + std::to_string(i * 7919) + "\n";
  return io::text_windows(std::vector<std::uint8_t>(text.begin(), text.end()), seq);
}

nn::matrix<double> random_matrix(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  nn::matrix<double> m("m", rows, cols);
  const auto h = Kokkos::create_mirror_view(m);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = normal(rng);
  Kokkos::deep_copy(m, h);
  return m;
}

// Rows r of `m` with r % size == rank: this rank's slice of a global batch.
nn::matrix<double> rows_of_rank(const nn::matrix<double>& m, int rank, int size) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  const std::size_t rows = m.extent(0) / std::size_t(size);
  nn::matrix<double> out("slice", rows, m.extent(1));
  const auto o = Kokkos::create_mirror_view(out);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < m.extent(1); ++c) o(r, c) = h(r + rows * std::size_t(rank), c);
  Kokkos::deep_copy(out, o);
  return out;
}

// The fixture (test/model/llama/README.md): transformers' LlamaForCausalLM, its config.json's sizes.
const std::filesystem::path fixture = test::llama_fixture;
const llama_config fixture_config{.vocab = 256, .dim = 64, .hidden = 176, .layers = 2, .heads = 4, .kv_heads = 2,
                                  .seq = 64, .rope_theta = 5000.0, .rms_norm_eps = 1e-6};

// Every tensor of the safetensors files of a Hugging Face checkpoint directory.
state_dict read_directory(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  state_dict all;
  for (const auto& file : files)
    for (const tensor& t : io::load_state_dict_file(file)) all.add(t);
  return all;
}

using test::max_abs_difference;
const state_dict& reference() { return test::llama_reference(); }

// The fixture's weights from `dir` on `world`, against transformers' logits and loss.
template <class Scalar>
void check_fixture(comm::mpi& world, const std::filesystem::path& dir, const char* suffix, double logits_tolerance,
                   double loss_tolerance) {
  trainer<llama_descriptor, Scalar> t(
      make_llama(fixture_config), world,
      {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
  t.engine().load_original_state_dict(read_directory(dir));
  test::check_logits_and_loss<Scalar>(t, world, suffix, suffix, logits_tolerance, loss_tolerance);
}

}  // namespace

TEST_CASE("the fixture's logits and loss equal transformers' (f32: 1e-5 and 1e-6 relative)") {
  comm::mpi world;
  check_fixture<float>(world, fixture / "tiny-f32", "f32", 1e-5, 1e-6);
}

TEST_CASE("the fixture in f64 (sharded files): logits and loss equal transformers'") {
  comm::mpi world;
  check_fixture<double>(world, fixture / "tiny-f64-sharded", "f64", 1e-10, 1e-10);
}

TEST_CASE("3 SGD steps (zero3/block, f64) give transformers' parameters") {
  comm::mpi world;
  trainer<llama_descriptor, double> t(
      make_llama(fixture_config), world,
      {.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block});
  t.engine().load_original_state_dict(read_directory(fixture / "tiny-f64-sharded"));
  const auto data = io::text_windows::from_file(std::filesystem::path(KFSDP_SOURCE_ROOT) / "data" / "kjv-genesis-exodus.txt",
                                                fixture_config.seq);
  optim::sgd<double> sgd(t.engine().plan().shard_numel, {.lr = 0.1});
  const std::size_t ws = std::size_t(world.size());
  for (std::size_t s = 0; s < 3; ++s) {  // step s: windows 3s, 3s + 1, 3s + 2 over the ranks
    std::vector<int> tokens, targets;
    std::vector<std::size_t> windows{3 * s, 3 * s + 1, 3 * s + 2};
    if (3 % ws != 0) {  // ranks that do not divide the batch: every rank takes the whole batch (the same mean)
      for (std::size_t w : windows) data.append(w, tokens, targets);
    } else {
      data.rank_slice(windows, std::size_t(world.rank()), ws, tokens, targets);
    }
    t.step({{device_ids(tokens), device_ids(targets)}}, sgd);
  }
  const state_dict trained = t.engine().original_state_dict();
  double worst = 0;
  for (const tensor& p : trained)
    worst = std::max(worst, max_abs_difference<double>(p.values<double>(), reference().at("trained." + p.name).values<double>()));
  MESSAGE("parameters after 3 SGD steps at ", world.size(), " ranks within ", worst, " of torch's");
  CHECK(worst <= 1e-9);
}

TEST_CASE("concat of linears (q/k/v-style) trains as one linear over the concatenated weights") {
  comm::mpi world;
  using split = sequential<"", linear<"in", 3, 4>, concat<"", linear<"a", 4, 3, false>, linear<"b", 4, 5, false>>, mse<>>;
  using fused = sequential<"", linear<"in", 3, 4>, linear<"ab", 4, 8, false>, mse<>>;
  trainer<split, double> t_split(split{}, world, {.sharding_strategy = sharding_strategy::zero3});
  trainer<fused, double> t_fused(fused{}, world, {.sharding_strategy = sharding_strategy::zero3});
  t_split.initialize(7);
  state_dict weights = t_split.engine().original_state_dict();
  // ab.weight [8, 4] = [a.weight [3, 4]; b.weight [5, 4]]
  tensor ab = tensor::zeros("ab.weight", {8, 4}, dtype::F64);
  const auto a = weights.at("a.weight").values<double>(), b = weights.at("b.weight").values<double>();
  std::copy(a.begin(), a.end(), ab.values<double>().begin());
  std::copy(b.begin(), b.end(), ab.values<double>().begin() + 12);
  state_dict fused_weights;
  fused_weights.add(weights.at("in.weight"));
  fused_weights.add(weights.at("in.bias"));
  fused_weights.add(ab);
  t_fused.engine().load_original_state_dict(fused_weights);
  const auto x = random_matrix(6, 3, 1), y = random_matrix(6, 8, 2);
  const auto xs = rows_of_rank(x, world.rank(), world.size()), ys = rows_of_rank(y, world.rank(), world.size());
  optim::sgd<double> sgd_split(t_split.engine().plan().shard_numel, {.lr = 0.5}),
      sgd_fused(t_fused.engine().plan().shard_numel, {.lr = 0.5});
  for (int step = 0; step < 3; ++step) {
    const double l_split = t_split.step({{xs, ys}}, sgd_split).loss, l_fused = t_fused.step({{xs, ys}}, sgd_fused).loss;
    CHECK(l_split == doctest::Approx(l_fused).epsilon(1e-13));
  }
  const state_dict after_split = t_split.engine().original_state_dict(), after_fused = t_fused.engine().original_state_dict();
  const auto ab_after = after_fused.at("ab.weight").values<double>();
  const auto a_after = after_split.at("a.weight").values<double>(), b_after = after_split.at("b.weight").values<double>();
  for (std::size_t i = 0; i < 12; ++i) CHECK(a_after[i] == doctest::Approx(ab_after[i]).epsilon(1e-13));
  for (std::size_t i = 0; i < 20; ++i) CHECK(b_after[i] == doctest::Approx(ab_after[12 + i]).epsilon(1e-13));
  const auto in_split = after_split.at("in.weight").values<double>(), in_fused = after_fused.at("in.weight").values<double>();
  for (std::size_t i = 0; i < in_split.size(); ++i) CHECK(in_split[i] == doctest::Approx(in_fused[i]).epsilon(1e-13));
}

TEST_CASE("a Llama's gradients equal central differences of its loss (f64, one process), tied and untied") {
  comm::self one;
  for (bool tie : {false, true}) {
    CAPTURE(tie);
    llama_config c = tiny;
    c.tie_weights = tie;
    trainer<llama_descriptor, double> t(make_llama(c), one);
    t.initialize(3, llama_init(0.3));
    const auto data = sample_text(c.seq);
    std::vector<int> tokens, targets;
    data.rank_slice(data.micro_batch(io::window_sampling::sequential, 0, 0, 3), 0, 1, tokens, targets);
    testing::check_gradients(t, decltype(t)::batch{device_ids(tokens), device_ids(targets)}, 60);
  }
}

TEST_CASE("sharded Llama training equals one process (zero2/zero3 x none/block, f64 1e-10)") {
  comm::mpi world;
  comm::self one;
  const auto data = sample_text(tiny.seq);
  auto train = [&](comm::any_communicator comm, fsdp_options options) {
    trainer<llama_descriptor, double> t(make_llama(tiny), comm, options);
    t.initialize(11, llama_init(0.2));
    optim::sgd<double> sgd(t.engine().plan().shard_numel, {.lr = 0.2, .momentum = 0.9});
    const std::size_t ws = std::size_t(t.engine().world_size());
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      std::vector<int> tokens, targets;
      data.rank_slice(data.micro_batch(io::window_sampling::sequential, 0, 0, 6),
                      std::size_t(t.engine().rank()), ws, tokens,
                      targets);  // one batch again: the loss falls
      losses.push_back(t.step({{device_ids(tokens), device_ids(targets)}}, sgd).loss);
    }
    return std::pair{losses, t.engine().original_state_dict()};
  };
  const auto [reference_losses, reference_weights] = train(one, {});
  CHECK(reference_losses.back() < reference_losses.front());
  for (auto s : {sharding_strategy::zero2, sharding_strategy::zero3})
    for (auto b : {bucketing::none, bucketing::block}) {
      CAPTURE(to_string(s));
      CAPTURE(to_string(b));
      const auto [losses, weights] = train(world, {.sharding_strategy = s, .bucketing_strategy = b});
      for (std::size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(reference_losses[i]).epsilon(1e-10));
      for (const tensor& w : reference_weights) {
        const auto got = weights.at(w.name).values<double>(), want = w.values<double>();
        for (std::size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-10);
      }
    }
}
