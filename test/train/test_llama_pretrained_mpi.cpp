// Llama from Hugging Face directories (io/checkpoint/hf_checkpoint.hpp) under mpirun with 1, 2 and 3 ranks:
// the tiny fixture that transformers wrote (test/model/llama) read with read_llama_config and
// load_pretrained gives transformers' logits and loss; trained 3 SGD steps, saved with
// save_pretrained and loaded again, it holds torch's parameters; a tied model saves without
// lm_head.weight and loads an untied directory when told to ignore it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
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

#include "../support/llama_fixture.hpp"
#include "../support/scratch_directory.hpp"

using namespace kfsdp;

namespace {

namespace fs = std::filesystem;

const fs::path fixture = test::llama_fixture;

const state_dict& reference() { return test::llama_reference(); }
io::text_windows text() { return test::llama_fixture_text(); }
using test::max_abs_difference;

template <class Scalar>
using llama_trainer = trainer<llama_descriptor, Scalar>;
const fsdp_options zero3_block{.sharding_strategy = sharding_strategy::zero3,
                               .bucketing_strategy = bucketing::block};

// transformers' logits on window 0 and mean loss over windows 0..3, from the directory as read.
template <class Scalar>
void check_against_transformers(comm::mpi& world, const fs::path& directory, const char* suffix, double logits_tolerance,
                                double loss_tolerance) {
  const llama_config config = io::read_llama_config(directory);
  llama_trainer<Scalar> t(make_llama(config), world, zero3_block);
  io::load_pretrained(directory, t.engine());
  test::check_logits_and_loss<Scalar>(t, world, suffix, directory.filename().string(), logits_tolerance, loss_tolerance);
}

}  // namespace

TEST_CASE("the fixture read with read_llama_config and load_pretrained gives transformers' logits and loss") {
  comm::mpi world;
  check_against_transformers<float>(world, fixture / "tiny-f32", "f32", 1e-5, 1e-6);
  check_against_transformers<double>(world, fixture / "tiny-f64-sharded", "f64", 1e-10, 1e-10);
}

TEST_CASE("3 SGD steps from the loaded fixture, saved with save_pretrained and loaded again, hold torch's parameters") {
  comm::mpi world;
  test::scratch_directory scratch(world, "llama-pretrained");
  const llama_config config = io::read_llama_config(fixture / "tiny-f64-sharded");
  llama_trainer<double> t(make_llama(config), world, zero3_block);
  io::load_pretrained(fixture / "tiny-f64-sharded", t.engine());
  const auto data = text();
  optim::sgd<double> sgd(t.engine().plan().shard_numel, {.lr = 0.1});
  const std::size_t ws = std::size_t(world.size());
  for (std::size_t s = 0; s < 3; ++s) {  // step s: windows 3s, 3s + 1, 3s + 2 over the ranks
    std::vector<int> tokens, targets;
    const std::vector<std::size_t> windows{3 * s, 3 * s + 1, 3 * s + 2};
    if (3 % ws != 0) {  // ranks that do not divide the batch: every rank takes the whole batch (the same mean)
      for (std::size_t w : windows) data.append(w, tokens, targets);
    } else {
      data.rank_slice(windows, std::size_t(world.rank()), ws, tokens, targets);
    }
    t.step({{device_ids(tokens), device_ids(targets)}}, sgd);
  }
  io::save_pretrained(scratch.path / "trained", t.engine(), io::llama_config_json(config, dtype::F64));

  const llama_config again = io::read_llama_config(scratch.path / "trained");
  CHECK(again.rope_theta == config.rope_theta);
  CHECK(again.kv_heads == config.kv_heads);
  trainer<llama_descriptor, double> loaded(
      make_llama(again), world, {.sharding_strategy = sharding_strategy::zero3});  // another bucketing
  io::load_pretrained(scratch.path / "trained", loaded.engine());
  double worst = 0;
  for (const tensor& p : loaded.engine().original_state_dict())
    worst = std::max(worst, max_abs_difference<double>(p.values<double>(), reference().at("trained." + p.name).values<double>()));
  MESSAGE("parameters after 3 SGD steps at ", world.size(), " ranks, saved and loaded: within ", worst, " of torch's");
  CHECK(worst <= 1e-9);
}

TEST_CASE("a tied Llama saves without lm_head.weight and loads an untied directory that names it in `ignore`") {
  comm::mpi world;
  test::scratch_directory scratch(world, "llama-pretrained");
  llama_config config = io::read_llama_config(fixture / "tiny-f32");
  config.tie_weights = true;
  llama_trainer<float> tied(make_llama(config), world, zero3_block);
  CHECK_THROWS_AS(io::load_pretrained(fixture / "tiny-f32", tied.engine()), io::format_error);
  io::load_pretrained(fixture / "tiny-f32", tied.engine(), {"lm_head.weight"});
  io::save_pretrained(scratch.path / "tied", tied.engine(), io::llama_config_json(config));
  CHECK(io::read_llama_config(scratch.path / "tied").tie_weights);
  const state_dict saved = io::load_state_dict_file(scratch.path / "tied" / "model.safetensors");
  CHECK(saved.find("lm_head.weight") == nullptr);
  const state_dict original = io::load_state_dict_file(fixture / "tiny-f32" / "model.safetensors");
  CHECK(max_abs_difference<float>(saved.at("model.embed_tokens.weight").values<float>(),
                                  original.at("model.embed_tokens.weight").values<float>()) == 0);
}
