#include <doctest/doctest.h>

#include <stdexcept>

#include <kfsdp/fsdp/units.hpp>
#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/model/param_table.hpp>

using namespace kfsdp;

// model_graph.hpp's worked example, built at compile time.
using example = sequential<"", embedding<"wte", 256, 64>, block<"h", linear<"fc", 64, 64>>,
                           tied<"wte.weight", "weight", linear<"head", 64, 256, false>>, cross_entropy<"", 256>>;
static_assert([] {
  const model_graph g = make_model_graph(example{});
  const auto& n = g.nodes;
  return g.params.size() == 3 && n.size() == 6 &&  //
         n[0].first_param == 0 && n[0].end_param == 3 && n[0].parent == no_node &&
         n[1].name.view() == "wte" && n[1].layer == 0 && n[1].end_param == 1 &&
         n[2].name.view() == "h" && n[2].kind == layer_kind::block && n[2].block == 0 && n[2].first_param == 1 &&
         n[2].end_param == 3 && n[3].name.view() == "h.fc" && n[3].parent == 2 && n[3].layer == 1 &&
         n[3].block == no_block &&  // inside the block it does not open one
         n[4].name.view() == "head" && !n[4].owns_params() && n[4].layer == model_node::none &&
         n[4].tied_slot == 0 && n[4].tie_owner == 0 && n[4].bound_count() == 1 && n[4].bound_row(0) == 0 &&
         n[5].name.view() == "" && !n[5].owns_params() && !n[5].ties();
}());
// The table is the graph's parameters.
static_assert(param_table<example>.size() == 3 && param_table<example>[2].name.view() == "h.fc.bias" &&
              param_table<example>[2].block == 0);

// A tied slot between own rows: the owner's row there, the layer's own rows around it.
static_assert([] {
  model_node n;
  n.first_param = 5;
  n.end_param = 7;
  n.tied_slot = 1;
  n.tie_owner = 2;
  return n.bound_count() == 3 && n.bound_row(0) == 5 && n.bound_row(1) == 2 && n.bound_row(2) == 6;
}());

using copies = sequential<"net", linear<"in", 2, 3>, repeat<"h", 3, block<"", layer_norm<"ln", 3>, linear<"fc", 3, 3>>>,
                          linear<"out", 3, 1>>;

TEST_CASE("assign_units: each block or repeat copy a unit with the blocks policy, each layer with the layers policy") {
  const model_graph g = make_model_graph(copies{});
  // nodes: 0 net, 1 in, 2 h, 3 h.0, 4 h.0.ln, 5 h.0.fc, 6 h.1, ..., 9 h.2, ..., 12 out
  REQUIRE(g.nodes.size() == 13);
  CHECK(g.nodes[3].name.view() == "net.h.0");
  CHECK(g.nodes[6].block == 1);

  const unit_assignment blocks = assign_units(g, {});
  CHECK(blocks.policy == wrap_policy::blocks);
  CHECK(blocks.of_node == std::vector<std::size_t>{no_unit, no_unit, no_unit, 1, no_unit, no_unit, 2, no_unit, no_unit, 3,
                                                   no_unit, no_unit, no_unit});
  CHECK(blocks.runs_in == std::vector<std::size_t>{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 0});
  CHECK(blocks.of_param == std::vector<std::size_t>{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 0, 0});
  CHECK(blocks.count() == 4);

  const unit_assignment pairs = assign_units(g, {.blocks_per_unit = 2});
  CHECK(pairs.of_param == std::vector<std::size_t>{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0});

  const unit_assignment layers = assign_units(g, {.policy = wrap_policy::layers});
  CHECK(layers.of_node[1] == 1);
  CHECK(layers.of_node[3] == no_unit);
  CHECK(layers.of_node[4] == 2);
  CHECK(layers.of_node[12] == 8);
  CHECK(layers.of_param == std::vector<std::size_t>{1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8});

  CHECK_THROWS_WITH_AS(assign_units(g, {.blocks_per_unit = 0}), "kfsdp: blocks_per_unit is 0, expected at least 1",
                       std::invalid_argument);
}

TEST_CASE("a model without blocks: automatic is the layers policy") {
  using mlp = sequential<"", linear<"fc1", 4, 8>, relu<>, linear<"fc2", 8, 1>, mse<>>;
  const unit_assignment units = assign_units(make_model_graph(mlp{}), {});
  CHECK(units.policy == wrap_policy::layers);
  CHECK(units.of_node == std::vector<std::size_t>{no_unit, 1, no_unit, 2, no_unit});
}

TEST_CASE("a tie is resolved once, in the graph: a missing owner, another shape and another unit are recorded") {
  using missing = sequential<"", embedding<"wte", 8, 4>, tied<"wpe.weight", "weight", linear<"head", 4, 8, false>>>;
  const model_graph no_owner = make_model_graph(missing{});
  CHECK(no_owner.nodes[2].ties());
  CHECK(no_owner.nodes[2].tie_owner == model_node::none);
  using reshaped = sequential<"", embedding<"wte", 8, 4>, tied<"wte.weight", "weight", linear<"head", 4, 9, false>>>;
  const model_graph other_shape = make_model_graph(reshaped{});
  CHECK(other_shape.nodes[2].tie_owner == 0);
  CHECK(!other_shape.nodes[2].tie_shape_matches);
  // The owner in block 0's unit, the tied layer in the root: the network refuses it (the owner
  // would not be gathered when the layer runs); the units themselves do not read ties.
  using across = sequential<"", block<"b", embedding<"wte", 8, 4>>, tied<"b.wte.weight", "weight", linear<"head", 4, 8, false>>>;
  const model_graph g = make_model_graph(across{});
  CHECK(g.nodes[3].tie_shape_matches);
  CHECK(g.nodes[3].bound_row(0) == 0);
  const unit_assignment units = assign_units(g, {});
  CHECK(units.runs_in[3] == 0);
  CHECK(units.of_param[0] == 1);
}
