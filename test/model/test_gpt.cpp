#include <doctest/doctest.h>

#include <string>

#include <kfsdp/model/gpt.hpp>
#include <kfsdp/model/param_table.hpp>

using namespace kfsdp;

constexpr auto& t = param_table<gpt<2, 64, 32>>;
static_assert(t.size() == 4 + 12 * 2 + 1);
static_assert(t[0].name.view() == "transformer.wte.weight" && t[0].shape[0] == 256 && t[0].shape[1] == 64);
static_assert(t[1].name.view() == "transformer.wpe.weight" && t[1].shape[0] == 32);
static_assert(t[4].name.view() == "transformer.h.0.attn.c_attn.weight" && t[4].shape[0] == 192);
static_assert(t[12].name.view() == "transformer.h.0.mlp.c_proj.weight" && t[12].shape[1] == 256);
static_assert(t[27].name.view() == "transformer.ln_f.bias" && t[27].block == no_block);
static_assert(t[28].name.view() == "lm_head.weight" && t[28].rank == 2);
static_assert(t[14].name.view() == "transformer.h.1.ln_1.weight" && t[14].block == 1);

TEST_CASE("make_gpt builds the same table from run-time sizes") {
  const auto runtime = make_param_table(make_gpt({.layers = 2, .dim = 64, .heads = 4, .seq = 32}));
  REQUIRE(runtime.size() == t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    CAPTURE(std::string(t[i].name.view()));
    CHECK(runtime[i].name == t[i].name);
    CHECK(runtime[i].shape == t[i].shape);
    CHECK(runtime[i].block == t[i].block);
  }
  CHECK_THROWS_AS(make_gpt({.layers = 0}), std::invalid_argument);
}

TEST_CASE("tied weights: lm_head.weight is transformer.wte.weight, declared once") {
  const auto tied = make_param_table(make_gpt({.layers = 2, .dim = 64, .heads = 4, .seq = 32, .tie_weights = true}));
  CHECK(tied.size() == t.size() - 1);
  CHECK(tied.back().name.view() == "transformer.ln_f.bias");
  CHECK(tied.front().name.view() == "transformer.wte.weight");
}

TEST_CASE("the layers' default initialisation and layer indices") {
  static_assert(t[4].init.kind == init_rule::uniform && t[4].init.fan_in == 64);  // c_attn: nn.Linear's
  static_assert(t[2].init.kind == init_rule::ones && t[3].init.kind == init_rule::zeros);  // ln_1
  static_assert(t[0].init.kind == init_rule::normal && t[0].init.scale == 1.0);  // nn.Embedding's N(0, 1)
  // Layers without parameters (attention, GELU, the loss) take no layer index: the bucketing is unchanged.
  static_assert(t[4].layer == 3 && t[6].layer == 4 && t[28].layer == 2 + 6 * 2 + 1);
  CHECK(t[28].layer == 15);
}

// Each copy of a repeat of plain layers is a unit of its own, as a block is.
using stack = sequential<"", linear<"in", 2, 4>, repeat<"h", 3, sequential<"", linear<"fc", 4, 4>, gelu<>>>, linear<"out", 4, 1>, mse<>>;
static_assert(param_table<stack>[0].block == no_block);
static_assert(param_table<stack>[2].name.view() == "h.0.fc.weight" && param_table<stack>[2].block == 0);
static_assert(param_table<stack>[6].name.view() == "h.2.fc.weight" && param_table<stack>[6].block == 2);
static_assert(param_table<stack>[8].name.view() == "out.weight" && param_table<stack>[8].block == no_block);
