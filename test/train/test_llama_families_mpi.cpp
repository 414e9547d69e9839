// Llama-family checkpoints as published (test/model/families, made by transformers with make_fixture.py)
// under mpirun with 1, 2 and 3 ranks: Llama 3.2's llama3 RoPE scaling and tied head, Qwen2.5's q/k/v
// biases, Mistral's explicit head_dim, and Llama's linear scaling with attention_bias. Each read with
// read_llama_config and load_pretrained gives transformers' logits (f32 within 2e-6, f64 within 1e-10
// of transformers with its f32 RMSNorm and RoPE patched to f64); saved with save_pretrained and loaded
// again after an SGD step, the same logits and the config as read. With KFSDP_FAMILIES_SAVE_TO set, the
// saves and kfsdp's logits go there too, for make_fixture.py --check (from_pretrained;
// test_families_from_pretrained.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/checkpoint/hf_checkpoint.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/optim/sgd.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/llama.hpp>
#include <kfsdp/train/trainer.hpp>

#include "../support/scratch_directory.hpp"

using namespace kfsdp;

namespace {

namespace fs = std::filesystem;

const fs::path fixture = fs::path(KFSDP_SOURCE_ROOT) / "test" / "model" / "families";
constexpr std::size_t window = 32;  // the reference's window 0: the first 33 bytes of the shipped text
const std::vector<std::string> families{"llama3.2", "qwen2.5", "mistral", "llama-linear-bias"};

const state_dict& reference() {
  static const state_dict r = io::load_state_dict_file(fixture / "reference.safetensors");
  return r;
}

template <class Scalar>
double max_abs_difference(const std::vector<Scalar>& got, std::span<const Scalar> want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
  return worst;
}

io::text_windows text() {
  return io::text_windows::from_file(fs::path(KFSDP_SOURCE_ROOT) / "data" / "kjv-genesis-exodus.txt", window);
}

// The logits of window 0, [window, vocab] row-major, on every rank.
template <class Scalar>
std::vector<Scalar> logits_of(trainer<llama_descriptor, Scalar>& t) {
  std::vector<int> tokens, targets;
  text().append(0, tokens, targets);
  std::vector<Scalar> logits;
  t.with_full_model([&] {
    const auto view = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.predict(device_ids(tokens)));
    logits.assign(view.data(), view.data() + view.span());
  });
  return logits;
}

// A trainer holding the weights of `directory` (trainers do not move: held by pointer).
template <class Scalar>
std::unique_ptr<trainer<llama_descriptor, Scalar>> loaded(comm::mpi& world, const fs::path& directory, fsdp_options options) {
  auto t = std::make_unique<trainer<llama_descriptor, Scalar>>(make_llama(io::read_llama_config(directory), window), world, options);
  io::load_pretrained(directory, t->engine());
  return t;
}

const fsdp_options zero3_block{.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block};

}  // namespace

TEST_CASE("rope_scaling's frequencies are transformers' (llama3, linear, default), to the bit in float") {
  for (const std::string& family : families) {
    const llama_config config = io::read_llama_config(fixture / family);
    const auto want32 = reference().at(family + ".inv_freq.f32").values<float>();
    const auto want64 = reference().at(family + ".inv_freq.f64").values<double>();
    REQUIRE(want32.size() == config.head_dim() / 2);
    for (std::size_t i = 0; i < want32.size(); ++i) {
      INFO(family, " pair ", i);
      CHECK(config.rope.inverse_frequency<float>(i, config.head_dim(), config.rope_theta) == want32[i]);
      CHECK(config.rope.inverse_frequency<double>(i, config.head_dim(), config.rope_theta) ==
            doctest::Approx(want64[i]).epsilon(1e-15));
    }
  }
}

TEST_CASE("each family read with read_llama_config and load_pretrained gives transformers' logits") {
  comm::mpi world;
  for (const std::string& family : families) {
    auto f32 = loaded<float>(world, fixture / family, zero3_block);
    auto f64 = loaded<double>(world, fixture / family, zero3_block);  // the f32 file read into doubles: exact
    const std::vector<float> logits32 = logits_of(*f32);
    const double error32 = max_abs_difference<float>(logits32, reference().at(family + ".logits.f32").values<float>());
    // float's own rounding, beside transformers' (both against the float64 result)
    const std::vector<double> widened(logits32.begin(), logits32.end());
    const double rounding = max_abs_difference<double>(widened, reference().at(family + ".logits.f64").values<double>());
    const double error64 = max_abs_difference<double>(logits_of(*f64), reference().at(family + ".logits.f64").values<double>());
    MESSAGE(family, " at ", world.size(), " ranks: logits within ", error32, " (f32), ", error64,
            " (f64) of transformers'; f32 within ", rounding, " of the f64 result");
    CHECK(error32 <= 2e-6);
    CHECK(error64 <= 1e-10);
  }
}

// One plain SGD step (lr 0.1) on windows 0, 1, 2: weights (the biases included) that no file holds yet.
void sgd_step(comm::mpi& world, trainer<llama_descriptor, double>& t) {
  const io::text_windows data = text();
  optim::sgd<double> sgd(t.engine().plan().shard_numel, {.lr = 0.1});
  std::vector<int> tokens, targets;
  const std::vector<std::size_t> windows{0, 1, 2};
  const std::size_t ws = std::size_t(world.size());
  if (3 % ws != 0) {  // ranks that do not divide the batch: every rank takes the whole batch (the same mean)
    for (std::size_t w : windows) data.append(w, tokens, targets);
  } else {
    data.rank_slice(windows, std::size_t(world.rank()), ws, tokens, targets);
  }
  t.step({{device_ids(tokens), device_ids(targets)}}, sgd);
}

TEST_CASE("each family trained a step, saved with save_pretrained and loaded again: the same logits, its config as read") {
  comm::mpi world;
  test::scratch_directory scratch(world, "llama-families");
  const char* save_to = std::getenv("KFSDP_FAMILIES_SAVE_TO");  // for make_fixture.py --check (from_pretrained)
  for (const std::string& family : families) {
    const llama_config config = io::read_llama_config(fixture / family);
    auto trained = loaded<double>(world, fixture / family, zero3_block);
    sgd_step(world, *trained);
    const double loss = evaluate_windows(*trained, text(), 3, world);
    const double want = reference().at(family + ".trained_loss.f64").values<double>()[0];
    MESSAGE(family, " at ", world.size(), " ranks: loss after an SGD step ", loss, ", torch's ", want, " (relative ",
            std::abs(loss - want) / want, ")");
    CHECK(std::abs(loss - want) <= 1e-10 * want);  // the gradients, the biases' and the scaled RoPE's included, are torch's
    const std::vector<double> logits = logits_of(*trained);
    const std::string json = io::llama_config_json(config, dtype::F64);
    for (const fs::path& directory : {scratch.path / family, save_to ? fs::path(save_to) / family : fs::path()})
      if (!directory.empty()) io::save_pretrained(directory, trained->engine(), json, dtype::F64);
    if (save_to != nullptr && world.rank() == 0) {  // what transformers must compute from the saved directory
      tensor saved = tensor::zeros("logits", {1, window, config.vocab}, dtype::F64);
      std::copy(logits.begin(), logits.end(), saved.values<double>().begin());
      io::save_state_dict_file(fs::path(save_to) / (family + ".kfsdp-logits.safetensors"), state_dict({saved}));
    }

    const llama_config again = io::read_llama_config(scratch.path / family);
    CHECK(again.rope == config.rope);
    CHECK(again.rope_theta == config.rope_theta);
    CHECK(again.head_dim() == config.head_dim());
    CHECK(again.qkv_bias == config.qkv_bias);
    CHECK(again.o_bias == config.o_bias);
    CHECK(again.family == config.family);
    CHECK(again.tie_weights == config.tie_weights);
    auto back = loaded<double>(world, scratch.path / family, {.sharding_strategy = sharding_strategy::zero3});  // another bucketing
    CHECK(max_abs_difference<double>(logits_of(*back), logits) == 0);
    CHECK(max_abs_difference<double>(logits, reference().at(family + ".logits.f64").values<double>()) > 1e-3);  // it trained
  }
}

TEST_CASE("the bias tensors load and save under transformers' names, o_proj's only where the family has it") {
  comm::mpi world;
  const auto names = [&](const std::string& family) {
    std::vector<std::string> bias;
    const auto t = loaded<float>(world, fixture / family, zero3_block);
    for (const param_info& p : t->engine().params())
      if (p.name.view().ends_with(".bias")) bias.emplace_back(p.name.view());
    return bias;
  };
  const std::vector<std::string> qwen = names("qwen2.5"), llama = names("llama-linear-bias");
  CHECK(qwen.size() == 2 * 3);
  CHECK(std::count(qwen.begin(), qwen.end(), "model.layers.1.self_attn.v_proj.bias") == 1);
  CHECK(std::none_of(qwen.begin(), qwen.end(), [](const std::string& n) { return n.ends_with("o_proj.bias"); }));
  CHECK(llama.size() == 2 * 4);
  CHECK(std::count(llama.begin(), llama.end(), "model.layers.0.self_attn.o_proj.bias") == 1);
  CHECK(names("mistral").empty());
}
