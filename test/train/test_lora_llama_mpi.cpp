// LoRA on Llama's projections with peft's files (io/checkpoint/peft_adapter.hpp), under mpirun with 1,
// 2 and 3 ranks: peft's adapter on the tiny Qwen2 of test/model/families (test/model/lora, B not zero,
// adapters beside q/v biases and without) loads with peft's logits; kfsdp's saved adapter has peft's names, shapes and config and loads back bit for bit; the
// merged directory has the same logits, and the merge leaves the engine as it was; a rank-0 config
// leaves the Llama as it was; 20 steps with the base frozen leave it bit for bit, with the adapters
// alone holding optimizer state and no weight-gradient product for the base; bad configs are named.
// With KFSDP_LORA_SAVE_TO set, rank 0's run also writes adapter/, merged/ and reference.safetensors
// there for test/model/lora/make_fixture.py --check (peft's and transformers' from_pretrained).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/io/checkpoint/hf_checkpoint.hpp>
#include <kfsdp/io/checkpoint/peft_adapter.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/llama.hpp>
#include <kfsdp/train/trainer.hpp>

#include "../support/host_values.hpp"
#include "../support/llama_fixture.hpp"
#include "../support/scratch_directory.hpp"

using namespace kfsdp;

namespace {

namespace fs = std::filesystem;

const fs::path base_dir = test::llama_fixture / "tiny-f32";
const fs::path lora_fixture = fs::path(KFSDP_SOURCE_ROOT) / "test" / "model" / "lora";
const fs::path peft_adapter = lora_fixture / "peft-adapter";
const fs::path peft_base = fs::path(KFSDP_SOURCE_ROOT) / "test" / "model" / "families" / "qwen2.5";  // the adapter's base
constexpr std::size_t peft_window = 32;  // the families' window: logits on bytes [0, 32) of the shipped text

io::text_windows peft_text() {
  return io::text_windows::from_file(fs::path(KFSDP_SOURCE_ROOT) / "data" / "kjv-genesis-exodus.txt", peft_window);
}

const state_dict& peft_reference() {
  static const state_dict r = io::load_state_dict_file(lora_fixture / "reference.safetensors");
  return r;
}

constexpr double f32_tolerance = 2e-6;  // float32 rounding; float64 compares to 1e-10

template <class Scalar>
using llama_trainer = trainer<llama_descriptor, Scalar>;
const fsdp_options zero3_block{.sharding_strategy = sharding_strategy::zero3, .bucketing_strategy = bucketing::block};

// A base with `lora`'s adapters, the base loaded from `base` (tiny-f32 unless told), windows of `window` tokens.
template <class Scalar>
struct adapted : llama_trainer<Scalar> {
  adapted(comm::mpi& world, const lora_config& lora, const fsdp_options& options = zero3_block, const fs::path& base = base_dir,
          std::size_t window = 0)
      : llama_trainer<Scalar>(make_llama(io::read_llama_config(base), window, lora), world, options) {
    this->initialize(7);  // the adapters' start (A uniform, B zero); the base comes from the directory
    io::load_pretrained(base, this->engine());
  }
};

}  // namespace

TEST_CASE("peft's adapter loads onto the fixture with peft's logits, and saves back as peft's") {
  comm::mpi world;
  test::scratch_directory scratch(world, "lora-llama");
  const lora_config lora = io::read_lora_config(peft_adapter);
  CHECK(lora.rank == 4);
  CHECK(lora.alpha == 8);
  CHECK(lora.targets == std::vector<std::string>{"down_proj", "o_proj", "q_proj", "v_proj"});

  adapted<float> t(world, lora, zero3_block, peft_base, peft_window);
  CHECK(t.engine().params().size() == 2 + 12 * 2 + 2 * 4 * 2);  // 2 layers of 12 (3 biases), 4 adapted projections each: A and B
  io::load_adapter(peft_adapter, t.engine());
  const std::vector<float> logits = test::window0_logits<float>(t, peft_text());
  const double error = test::max_abs_difference<float>(logits, peft_reference().at("logits.f32").values<float>());
  MESSAGE("peft's adapter at ", world.size(), " ranks: logits within ", error, " of PeftModel's");
  CHECK(error <= f32_tolerance);

  // In float64 (transformers' RMSNorm and RoPE patched to float64 in the fixture), to 1e-10.
  {
    adapted<double> t64(world, lora, zero3_block, peft_base, peft_window);  // the float32 file, exact in float64
    io::load_adapter(peft_adapter, t64.engine());
    const double error64 = test::max_abs_difference<double>(test::window0_logits<double>(t64, peft_text()),
                                                            peft_reference().at("logits.f64").values<double>());
    MESSAGE("peft's adapter at ", world.size(), " ranks in float64: logits within ", error64, " of PeftModel's");
    CHECK(error64 <= 1e-10);
  }

  // kfsdp's adapter: peft's tensor names and shapes, its config's settings; loaded back, the same logits.
  io::save_adapter(scratch.path / "adapter", t.engine(), lora, "test/model/families/qwen2.5");
  if (world.rank() == 0) {
    const state_dict mine = io::load_state_dict_file(scratch.path / "adapter" / "adapter_model.safetensors");
    const state_dict theirs = io::load_state_dict_file(peft_adapter / "adapter_model.safetensors");
    CHECK(mine.size() == theirs.size());
    for (const tensor& want : theirs) {
      CAPTURE(want.name);
      const tensor* got = mine.find(want.name);
      REQUIRE(got != nullptr);
      CHECK(got->shape == want.shape);
      const auto a = got->values<float>(), b = want.values<float>();
      CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));  // peft's values, back as they came
    }
    const lora_config again = io::read_lora_config(scratch.path / "adapter");
    CHECK(again.rank == lora.rank);
    CHECK(again.alpha == lora.alpha);
    CHECK(again.targets == lora.targets);
  }
  adapted<float> back(world, lora, {.sharding_strategy = sharding_strategy::zero2}, peft_base, peft_window);  // another sharding
  io::load_adapter(scratch.path / "adapter", back.engine());
  CHECK(test::window0_logits<float>(back, peft_text()) == logits);

  // The merged model: a plain Llama directory with the same logits; the engine as it was, bit for bit.
  const std::vector<double> before = test::host_values(t.engine().shards().flat());
  const std::string config_json = io::llama_config_json(io::read_llama_config(peft_base));
  io::save_merged(scratch.path / "merged", t.engine(), lora, config_json);
  CHECK(test::host_values(t.engine().shards().flat()) == before);
  llama_trainer<float> merged(make_llama(io::read_llama_config(scratch.path / "merged"), peft_window), world, zero3_block);
  io::load_pretrained(scratch.path / "merged", merged.engine());
  const double merged_error =
      test::max_abs_difference<float>(test::window0_logits<float>(merged, peft_text()), peft_reference().at("logits.f32").values<float>());
  MESSAGE("merged at ", world.size(), " ranks: logits within ", merged_error, " of PeftModel's");
  CHECK(merged_error <= f32_tolerance);

  // For the live check with peft and transformers (test_lora_from_pretrained.py).
  if (const char* to = std::getenv("KFSDP_LORA_SAVE_TO"); to != nullptr) {
    io::save_adapter(fs::path(to) / "adapter", t.engine(), lora, "test/model/families/qwen2.5");
    io::save_merged(fs::path(to) / "merged", t.engine(), lora, config_json);
    if (world.rank() == 0) {
      tensor saved = tensor::zeros("logits.f32", {1, peft_window, 256}, dtype::F32);
      std::copy(logits.begin(), logits.end(), saved.values<float>().begin());
      state_dict out;
      out.add(std::move(saved));
      io::save_state_dict_file(fs::path(to) / "reference.safetensors", out);
    }
  }
}

TEST_CASE("save_pretrained refuses a model with adapters, and the adapter functions a model without") {
  comm::mpi world;
  test::scratch_directory scratch(world, "lora-refusals");
  const lora_config lora{.rank = 2, .alpha = 4, .targets = {"o_proj"}};
  adapted<float> t(world, lora);
  CHECK_THROWS_WITH_AS(io::save_pretrained(scratch.path / "x", t.engine(), "{}"),
                       doctest::Contains("is a LoRA adapter, which transformers' model directory cannot hold"), std::invalid_argument);
  llama_trainer<float> plain(make_llama(io::read_llama_config(base_dir)), world, zero3_block);
  CHECK_THROWS_WITH_AS(io::save_adapter(scratch.path / "y", plain.engine(), lora), doctest::Contains("the model has no LoRA adapter"),
                       std::invalid_argument);
  // peft's adapter targets modules this model does not adapt: named by the strict load.
  CHECK_THROWS_WITH_AS(io::load_adapter(peft_adapter, t.engine()), doctest::Contains("o_proj.lora_A.weight"), io::format_error);
  CHECK_FALSE(fs::exists(scratch.path / "y"));
}

TEST_CASE("a rank-0 LoRA config leaves the Llama as it was; bad configs are named") {
  const llama_config config = io::read_llama_config(base_dir);
  const auto plain = make_param_table(make_llama(config));
  const auto none = make_param_table(make_llama(config, 0, {}));
  CHECK(plain.size() == none.size());
  const auto all = make_param_table(make_llama(config, 0, {.rank = 2, .targets = {"all-linear"}}));
  CHECK(all.size() == plain.size() + 2 * 7 * config.layers);
  CHECK_THROWS_WITH_AS(make_llama(config, 0, {.rank = 2, .targets = {"qproj"}}),
                       "kfsdp::lora_config: target 'qproj' is not a module of the model, expected one of q_proj, k_proj, v_proj, "
                       "o_proj, gate_proj, up_proj, down_proj or all-linear",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_llama(config, 0, {.rank = 2}), doctest::Contains("targets is empty"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_llama(config, 0, {.rank = 0, .targets = {"q_proj"}}), doctest::Contains("rank is 0 but targets"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_llama(config, 0, {.rank = 2, .alpha = 0, .targets = {"q_proj"}}), doctest::Contains("alpha is 0"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(io::parse_lora_config(R"({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"], "use_rslora": true})"),
                       "kfsdp::io::read_lora_config: 'adapter_config.json': key 'use_rslora': a boolean 'true', expected it unset "
                       "(false, null or empty: kfsdp does not compute it)",
                       io::format_error);
  CHECK_THROWS_WITH_AS(io::parse_lora_config(R"({"peft_type": "LORA", "r": 8, "target_modules": ".*proj"})"),
                       doctest::Contains("a regular expression is not read"), io::format_error);
  CHECK_THROWS_WITH_AS(io::parse_lora_config(R"({"peft_type": "IA3", "r": 8, "target_modules": ["q_proj"]})"),
                       doctest::Contains("key 'peft_type': 'IA3', expected \"LORA\""), io::format_error);
}

namespace {
// LoRA steps [first, last) on the fixture's text: step s takes windows 6s .. 6s + 5 (mod 60), each rank its share.
template <class Trainer, class Optimizer>
std::vector<double> lora_steps(Trainer& t, Optimizer& optimizer, comm::mpi& world, std::size_t first, std::size_t last) {
  const auto data = test::llama_fixture_text();
  std::vector<double> losses;
  for (std::size_t step = first; step < last; ++step) {
    std::vector<int> tokens, targets;
    std::vector<std::size_t> windows;
    for (std::size_t w = 0; w < 6; ++w) windows.push_back((6 * step + w) % 60);
    data.rank_slice(windows, std::size_t(world.rank()), std::size_t(world.size()), tokens, targets);
    losses.push_back(t.step({{device_ids(tokens), device_ids(targets)}}, optimizer).loss);
  }
  return losses;
}
}  // namespace

TEST_CASE("a LoRA run resumed from its checkpoint: adapters and optimizer state restored, the same steps after") {
  comm::mpi world;
  test::scratch_directory scratch(world, "lora-resume");
  const lora_config lora{.rank = 2, .alpha = 4, .targets = {"k_proj", "o_proj", "up_proj"}};
  adapted<double> straight(world, lora);
  optim::adamw<double> adam(straight, {.lr = 1e-2}, {optim::lora_frozen_base()});
  const std::vector<double> first = lora_steps(straight, adam, world, 0, 5);
  io::save_training_state(scratch.path / "run.safetensors", straight.engine(), {{"step", "5"}}, adam);
  const std::vector<double> then = lora_steps(straight, adam, world, 5, 10);

  adapted<double> resumed(world, lora);  // the adapters at their start, the base from the directory
  optim::adamw<double> resumed_adam(resumed, {.lr = 1e-2}, {optim::lora_frozen_base()});
  CHECK(io::metadata_count(io::load_training_state(scratch.path / "run.safetensors", resumed.engine(), resumed_adam), "step") == 5);
  CHECK(lora_steps(resumed, resumed_adam, world, 5, 10) == then);  // bit for bit
  CHECK(test::host_values(resumed.engine().shards().flat()) == test::host_values(straight.engine().shards().flat()));
  CHECK(test::host_values(resumed_adam.exp_avg()) == test::host_values(adam.exp_avg()));
  MESSAGE("LoRA resumed at ", world.size(), " ranks: losses ", first.front(), " -> ", then.back(), ", the same after step 5");
}

TEST_CASE("20 LoRA steps: the base bit for bit as it was, the adapters alone stateful, no weight-gradient product for the base") {
  comm::mpi world;
  const lora_config lora{.rank = 4, .alpha = 8, .targets = {"q_proj", "v_proj", "down_proj"}};
  adapted<double> t(world, lora);
  auto& e = t.engine();
  optim::adamw<double> adam(t, {.lr = 1e-2}, {optim::lora_frozen_base()});
  std::size_t adapter_numel = 0;
  std::vector<std::vector<double>> base_before;
  for (std::size_t p = 0; p < e.params().size(); ++p) {
    CAPTURE(e.params()[p].name.view());
    CHECK(e.is_frozen(p) == !is_lora_adapter(e.params()[p].name.view()));
    if (e.is_frozen(p)) base_before.push_back(test::host_values(e.shards().chunk(p)));
    else adapter_numel += e.mapping().chunk(p).count;
  }
  CHECK(adam.state_size() == adapter_numel);  // the only optimizer state: the adapters'

  const std::size_t products = nn::detail::weight_gradient_products;
  const std::vector<double> losses = lora_steps(t, adam, world, 0, 20);
  CHECK(nn::detail::weight_gradient_products == products);  // no dW = dy^T x for any frozen weight, lm_head included
  MESSAGE("Llama LoRA at ", world.size(), " ranks: loss ", losses.front(), " -> ", losses.back(), " over 20 steps");
  CHECK(losses.back() < losses.front());
  std::size_t b = 0;
  for (std::size_t p = 0; p < e.params().size(); ++p)
    if (e.is_frozen(p)) CHECK(test::host_values(e.shards().chunk(p)) == base_before[b++]);
}
