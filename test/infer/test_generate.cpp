// kfsdp::generate and the cached step under it (include/kfsdp/infer/generate.hpp, compute/kv_cache.hpp,
// nn/cached_attention.hpp): a prefill and one-row steps give the logits of the whole-window forward;
// each step runs every linear on one row; greedy gives transformers' tokens (test/infer/generation,
// made by make_fixture.py); sampling is seeded and top_k = 1 is greedy; bad requests are refused,
// naming the parameter; generation_config.json's eos_token_id is read as transformers writes it.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

#include <kfsdp/infer/generate.hpp>
#include <kfsdp/io/checkpoint/hf_config.hpp>
#include <kfsdp/model/llama.hpp>
#include <kfsdp/train/gpt.hpp>  // device_ids

#include "../support/messages.hpp"

namespace {

namespace fs = std::filesystem;
using kfsdp::device_ids;
using kfsdp::test::error_message;

const fs::path tiny = fs::path(KFSDP_SOURCE_ROOT) / "test" / "infer" / "generation" / "tiny-llama";

template <class S>
using llama_predictor = kfsdp::predictor<kfsdp::llama_descriptor, S>;

template <class S>
llama_predictor<S> load(const fs::path& directory, std::size_t window = 0) {
  return llama_predictor<S>(kfsdp::make_llama(kfsdp::io::read_llama_config(directory), window), directory / "model.safetensors");
}

template <class S>
std::vector<double> host_values(const kfsdp::nn::matrix<S>& m) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  std::vector<double> out;
  for (std::size_t r = 0; r < host.extent(0); ++r)
    for (std::size_t c = 0; c < host.extent(1); ++c) out.push_back(double(host(r, c)));
  return out;
}

// The ints of `"key": [...]` after `"model"` in greedy.json (the fixture's own layout: make_fixture.py).
std::vector<int> fixture_ints(const std::string& model, const std::string& key) {
  std::ifstream in(fs::path(KFSDP_SOURCE_ROOT) / "test" / "infer" / "generation" / "greedy.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t at = model.empty() ? 0 : text.find("\"" + model + "\"");
  REQUIRE(at != std::string::npos);
  at = text.find("\"" + key + "\": [", at);
  REQUIRE(at != std::string::npos);
  std::vector<int> out;
  for (std::size_t i = text.find('[', at) + 1; text[i] != ']';) {
    std::size_t used = 0;
    out.push_back(std::stoi(text.substr(i), &used));
    i += used;
    while (text[i] == ',' || text[i] == ' ' || text[i] == '\n') ++i;
  }
  return out;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kfsdp-test-generate-" + std::to_string(::getpid()) + "-" + name);
  fs::create_directories(dir);
  return dir;
}

template <class S>
void cached_steps_equal_the_whole_window(double tolerance) {
  auto model = load<S>(tiny);  // window 320: max_position_embeddings
  const std::vector<int> prompt = fixture_ints("", "prompt"), greedy = fixture_ints("tiny-llama", "greedy");
  std::vector<int> window(320, 0);  // zero-padded after the tokens: the causal mask keeps them out
  std::copy(prompt.begin(), prompt.end(), window.begin());
  std::copy(greedy.begin(), greedy.end(), window.begin() + std::ptrdiff_t(prompt.size()));
  const std::vector<double> whole = host_values(model.predict(device_ids(window)));
  const std::size_t vocab = model.out_features();

  kfsdp::kv_cache<S> cache(320);
  std::vector<double> cached = host_values(model.predict_cached(device_ids(prompt), cache));
  CHECK(cache.positions() == prompt.size());
  for (const int token : greedy) {
    const std::vector<double> row = host_values(model.predict_cached(device_ids({token}), cache));
    REQUIRE(row.size() == vocab);
    cached.insert(cached.end(), row.begin(), row.end());
  }
  CHECK(cache.positions() == prompt.size() + greedy.size());
  CHECK(cache.bytes() == 2 * 2 * 320 * 8 * sizeof(S));  // 2 layers, keys and values, [320, kv_heads · head_dim = 8]
  double worst = 0;
  for (std::size_t i = 0; i < cached.size(); ++i) worst = std::max(worst, std::abs(cached[i] - whole[i]));
  CHECK(worst <= tolerance);
}

}  // namespace

TEST_CASE("a prefill and one-token steps give the whole window's logits, row by row") {
  cached_steps_equal_the_whole_window<double>(1e-11);
  cached_steps_equal_the_whole_window<float>(2e-5);
}

TEST_CASE("a step runs every linear on one row; the prefill on the prompt's rows") {
  auto model = load<float>(tiny);
  kfsdp::kv_cache<float> cache(320);
  const std::vector<int> prompt = fixture_ints("", "prompt");
  constexpr std::size_t linears = 2 * 7 + 1;  // per layer q, k, v, o, gate, up, down; then lm_head
  namespace counted = kfsdp::nn::detail;
  std::size_t calls = counted::linear_forward_calls, rows = counted::linear_forward_rows;
  (void)model.predict_cached(device_ids(prompt), cache);
  CHECK(counted::linear_forward_calls - calls == linears);
  CHECK(counted::linear_forward_rows - rows == linears * prompt.size());
  for (int step = 0; step < 3; ++step) {
    calls = counted::linear_forward_calls;
    rows = counted::linear_forward_rows;
    (void)model.predict_cached(device_ids({40}), cache);
    CHECK(counted::linear_forward_calls - calls == linears);
    CHECK(counted::linear_forward_rows - rows == linears);  // one row each
  }
}

TEST_CASE("greedy generation gives transformers' tokens; the eos stops it and is returned") {
  const std::vector<int> prompt = fixture_ints("", "prompt");
  for (const std::string name : {"tiny-llama", "qwen2.5", "llama3.2"}) {
    const fs::path dir = name == "tiny-llama" ? tiny : fs::path(KFSDP_SOURCE_ROOT) / "test" / "model" / "families" / name;
    auto model = load<float>(dir);
    kfsdp::kv_cache<float> cache(kfsdp::io::read_llama_config(dir).seq);
    kfsdp::generation_options options;
    options.eos_token_ids = kfsdp::io::read_eos_token_ids(dir);
    CHECK(kfsdp::generate(model, cache, prompt, options) == fixture_ints(name, "greedy"));
    options.eos_token_ids = {fixture_ints(name, "greedy_eos").back()};
    CHECK(kfsdp::generate(model, cache, prompt, options) == fixture_ints(name, "greedy_eos"));
  }
}

TEST_CASE("sampling: the same seed gives the same tokens, top_k = 1 is greedy") {
  auto model = load<float>(tiny);
  kfsdp::kv_cache<float> cache(320);
  const std::vector<int> prompt = fixture_ints("", "prompt");
  kfsdp::generation_options options;
  options.sample = true;
  options.top_k = 20;
  options.temperature = 1.5;
  options.seed = 11;
  const std::vector<int> first = kfsdp::generate(model, cache, prompt, options);
  CHECK(first.size() == 32);
  CHECK(kfsdp::generate(model, cache, prompt, options) == first);
  options.seed = 12;
  CHECK(kfsdp::generate(model, cache, prompt, options) != first);
  options.top_k = 1;
  CHECK(kfsdp::generate(model, cache, prompt, options) == fixture_ints("tiny-llama", "greedy"));
  // A draw stays among the k likeliest: top_k = 2 never picks the third.
  const std::vector<double> logits{0.5, 3.0, 2.9, 2.8};
  std::mt19937_64 rng(5);
  options.top_k = 2;
  options.temperature = 100;  // nearly uniform over what is kept
  for (int draw = 0; draw < 200; ++draw) {
    const int token = kfsdp::detail::pick_token(logits, options, rng);
    CHECK((token == 1 || token == 2));
  }
}

TEST_CASE("bad requests are refused, naming the parameter, the value and what was expected") {
  auto model = load<float>(tiny);
  kfsdp::kv_cache<float> cache(320);
  const std::vector<int> prompt{1, 2, 3};
  kfsdp::generation_options options;
  const auto message = [&](std::vector<int> ids) { return error_message([&] { (void)kfsdp::generate(model, cache, ids, options); }); };
  CHECK(message({1, -1}) == "kfsdp::generate: prompt token 1 is -1, expected 0 <= id < vocab_size = 256");
  CHECK(message({256}) == "kfsdp::generate: prompt token 0 is 256, expected 0 <= id < vocab_size = 256");
  CHECK(message({}) == "kfsdp::generate: the prompt is empty, expected at least one token");
  options.max_new_tokens = 318;
  CHECK(message(prompt) == "kfsdp::generate: max_new_tokens = 318 after a prompt of 3 tokens needs 321 positions, "
                           "expected at most max_position_embeddings = 320 (the cache's max_positions)");
  options.max_new_tokens = 317;  // exactly max_position_embeddings
  CHECK(kfsdp::generate(model, cache, prompt, options).size() == 317);
  options.max_new_tokens = 4;
  options.top_k = 0;
  CHECK(message(prompt) == "kfsdp::generate: top_k is 0, expected at least 1 (or none: every token)");
  options.top_k.reset();
  options.sample = true;
  for (const double t : {0.0, -1.0, std::nan("")}) {
    options.temperature = t;
    CHECK(message(prompt) == fmt::format("kfsdp::generate: temperature is {}, expected a finite number > 0 for sampling "
                                         "(greedy: sample = false)", t));
  }

  CHECK(error_message([] { kfsdp::kv_cache<float> none(0); }) == "kfsdp::kv_cache: max_positions is 0, expected at least 1");
  // A step past the cache leaves it as it was; a model whose RoPE holds fewer positions than the cache refuses too.
  kfsdp::kv_cache<float> small(4);
  (void)model.predict_cached(device_ids({1, 2, 3}), small);
  CHECK(error_message([&] { (void)model.predict_cached(device_ids({1, 2}), small); }) ==
        "kfsdp::kv_cache: a step of 2 tokens at position 3 reaches position 5, expected at most max_positions = 4");
  CHECK(small.positions() == 3);
  auto short_window = load<float>(tiny, 8);
  kfsdp::kv_cache<float> larger(16);
  (void)short_window.predict_cached(device_ids({1, 2, 3, 4, 5, 6, 7}), larger);
  CHECK(error_message([&] { (void)short_window.predict_cached(device_ids({1, 2}), larger); }) ==
        "rotary_embedding::forward_at: positions 7 .. 9 (first + rows), expected at most seq_len = 8 (the positions the table holds)");
  CHECK(larger.positions() == 7);
}

TEST_CASE("eos_token_id from generation_config.json: an int, a list, null, no file") {
  using kfsdp::io::parse_eos_token_ids;
  CHECK(parse_eos_token_ids(R"({"eos_token_id": 2})") == std::vector<int>{2});
  CHECK(parse_eos_token_ids(R"({"eos_token_id": [128001, 128009], "bos_token_id": 1})") == std::vector<int>{128001, 128009});
  CHECK(parse_eos_token_ids(R"({"eos_token_id": null})").empty());
  CHECK(parse_eos_token_ids(R"({"transformers_version": "5.25.0"})").empty());
  CHECK(error_message<kfsdp::io::format_error>([] { (void)parse_eos_token_ids(R"({"eos_token_id": [1, -2]})", "g.json"); }) ==
        "kfsdp::io::read_eos_token_ids: 'g.json': key 'eos_token_id': a number '-2', expected an integer in 0 .. 2147483647 (or a list of them)");
  CHECK(error_message<kfsdp::io::format_error>([] { (void)parse_eos_token_ids(R"({"eos_token_id": "2"})", "g.json"); }).find(
            "a string '2', expected an integer") != std::string::npos);
  CHECK(error_message<kfsdp::io::format_error>([] { (void)parse_eos_token_ids("[2]", "g.json"); }) ==
        "kfsdp::io::read_eos_token_ids: 'g.json' holds an array, expected a JSON object");
  CHECK(kfsdp::io::read_eos_token_ids(tiny) == std::vector<int>{255, 254});
  const fs::path empty = scratch("no-generation-config");
  CHECK(kfsdp::io::read_eos_token_ids(empty).empty());
  fs::create_directory(empty / "generation_config.json");
  CHECK(error_message<std::runtime_error>([&] { (void)kfsdp::io::read_eos_token_ids(empty); }).find("is a directory, expected a regular file") !=
        std::string::npos);
  fs::remove_all(empty);
}
