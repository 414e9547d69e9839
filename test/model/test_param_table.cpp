#include <doctest/doctest.h>

#include <stdexcept>

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/param_table.hpp>

using namespace kfsdp;

using two_linears = sequential<"", linear<"0", 4, 13>, linear<"1", 13, 1>>;
constexpr auto& table = param_table<two_linears>;
static_assert(table.size() == 4);
static_assert(table[0].name.view() == "0.weight" && table[0].numel == 52 && table[0].layer == 0);
static_assert(table[3].name.view() == "1.bias" && table[3].dim0() == 1 && table[3].layer == 1);
static_assert(table[0].row_numel() == 4 && table[1].row_numel() == 1);
static_assert(table[2].block == no_block);

using blocks = sequential<"net", linear<"in", 2, 3>, repeat<"h", 2, block<"", layer_norm<"ln", 3>, linear<"fc", 3, 3>>>>;
static_assert(param_table<blocks>[2].name.view() == "net.h.0.ln.weight");
static_assert(param_table<blocks>[2].block == 0 && param_table<blocks>[6].block == 1);
static_assert(param_table<blocks>[9].name.view() == "net.h.1.fc.bias" && param_table<blocks>[9].layer == 4);

TEST_CASE("make_param_table gives the static table for run-time sizes") {
  using dyn_linears = sequential<"", linear<"0">, linear<"1">>;
  const auto runtime = make_param_table(dyn_linears(linear<"0">(4, 13), linear<"1">(13, 1)));
  REQUIRE(runtime.size() == table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    CHECK(runtime[i].name == table[i].name);
    CHECK(runtime[i].shape == table[i].shape);
    CHECK(runtime[i].layer == table[i].layer);
  }
}

struct bad_layer {  // a user layer declaring a zero extent
  static constexpr fixed_string name = "bad";
  static constexpr layer_kind kind = layer_kind::layer;
  constexpr auto params() const { return std::array{param_decl{"weight", {3, 0}}}; }
};

TEST_CASE("a zero extent in a user layer is an error naming the parameter") {
  CHECK_THROWS_WITH_AS(make_param_table(sequential<"m", bad_layer>{}),
                       "kfsdp: parameter 'm.bad.weight' has extent 0 in dimension 1, expected at least 1",
                       std::invalid_argument);
}

TEST_CASE("sizes near 2^64 stop with a message naming the parameter and the operands, not a wrapped count") {
  const std::size_t huge = std::size_t(1) << 40;
  CHECK_THROWS_WITH_AS(make_param_table(linear<"fc">(huge, huge)),
                       "kfsdp: parameter 'fc.weight' elements: 1099511627776 · 1099511627776 overflows 64 bits",
                       std::overflow_error);
  CHECK_THROWS_WITH_AS(make_gpt({.layers = 2, .dim = 9223372036854775809ull, .heads = 3, .seq = 32}),
                       "kfsdp: gpt_config: dim (the MLP is 4·dim wide): 4 · 9223372036854775809 overflows 64 bits",
                       std::overflow_error);
}
