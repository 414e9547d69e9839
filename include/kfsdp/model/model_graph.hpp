#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// model_graph: the one walk of a model descriptor. Every descriptor node, in walk order (a node,
// then its children's subtrees), with the rows of the parameter table its subtree owns, the block
// it opens, its layer index and the parameter it borrows from another layer; and every parameter,
// in the same order. The parameter table, the shard plan, the FSDP units and the network read
// it; nothing walks the descriptor again.
//
//   sequential<"", embedding<"wte", 256, 64>, block<"h", linear<"fc", 64, 64>>,
//              tied<"wte.weight", "weight", linear<"head", 64, 256, false>>, cross_entropy<"", 256>>
//   params: 0 wte.weight (layer 0), 1 h.fc.weight (layer 1, block 0), 2 h.fc.bias (layer 1, block 0)
//   nodes:  0 ""        container  rows 0..3
//           1 "wte"     layer 0    rows 0..1
//           2 "h"       block 0    rows 1..3   (opens block 0)
//           3 "h.fc"    layer 1    rows 1..3
//           4 "head"    layer      rows 3..3   its compute's "weight" (slot 0) is row 0, wte.weight
//           5 ""        layer      rows 3..3   (the loss: no parameters)
//
// make_model_graph(model) is constexpr: for a fully static model it runs at compile time
// (param_table<M> is built from it there).

#include <array>
#include <atomic>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <kfsdp/meta/inline_string.hpp>
#include <kfsdp/model/descriptor.hpp>

namespace kfsdp {

// Dotted names up to this length (transformer.h.95.attn.c_attn.weight is 35).
inline constexpr std::size_t max_param_name = 96;

// The index of the block owning a parameter outside every block.
inline constexpr std::size_t no_block = std::numeric_limits<std::size_t>::max();

struct param_info {
  inline_string<max_param_name> name;
  std::array<std::size_t, max_param_rank> shape{};
  std::size_t rank = 0;
  std::size_t numel = 0;
  std::size_t layer = 0;       // index of the owning leaf layer (among those with parameters)
  std::size_t block = no_block;  // index of the owning block (or copy of a repeat), or no_block
  init_rule init{};            // the layer's default initialisation

  [[nodiscard]] constexpr std::size_t dim0() const noexcept { return shape[0]; }
  // Elements in one dim-0 row (1 for a 1-D parameter).
  [[nodiscard]] constexpr std::size_t row_numel() const noexcept { return numel / shape[0]; }
  [[nodiscard]] constexpr bool in_block() const noexcept { return block != no_block; }
};

inline constexpr std::size_t no_node = std::numeric_limits<std::size_t>::max();

// One descriptor node: a layer, a block, a container, or one copy of a repeat's element.
struct model_node {
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  inline_string<max_param_name> name;  // the dotted prefix of its parameters ("" for an unnamed root)
  layer_kind kind = layer_kind::layer;
  std::size_t parent = no_node;
  std::size_t first_param = 0, end_param = 0;  // the table rows its subtree owns: [first_param, end_param)
  std::size_t block = no_block;  // the block it opens (a block or repeat copy outside every block), or no_block
  std::size_t layer = none;      // a layer owning parameters: its index among those layers
  // A layer whose parameter is another's (kfsdp::tied): the slot of that parameter in the layer's
  // compute (its all_params() order), the owner's dotted name and row, and the shape the layer declares.
  std::size_t tied_slot = none;
  inline_string<max_param_name> tied_name;  // the parameter's name in the layer ("weight")
  inline_string<max_param_name> tie_owner_name;
  std::size_t tie_owner = none;  // none: the model has no parameter of that name
  std::array<std::size_t, max_param_rank> tied_shape{};
  std::size_t tied_rank = 0;
  bool tie_shape_matches = false;  // the owner's shape is the one the layer declares

  [[nodiscard]] constexpr bool owns_params() const noexcept { return end_param > first_param; }
  [[nodiscard]] constexpr bool ties() const noexcept { return tied_slot != none; }
  // Parameters the layer's compute reads: its own and the one it borrows.
  [[nodiscard]] constexpr std::size_t bound_count() const noexcept { return end_param - first_param + (ties() ? 1 : 0); }
  // The table row of slot `slot` of the layer's compute: the owner's at the tied slot, its own rows around it.
  //   head above: bound_row(0) = 0 (wte.weight); an untied linear with rows 5..7: bound_row(1) = 6
  [[nodiscard]] constexpr std::size_t bound_row(std::size_t slot) const noexcept {
    if (!ties() || slot < tied_slot) return first_param + slot;
    return slot == tied_slot ? tie_owner : first_param + slot - 1;
  }
};

struct model_graph {
  std::vector<param_info> params;  // the parameter table
  std::vector<model_node> nodes;   // walk order: a node, then its children's subtrees in order
};

namespace detail {

struct walk_state {
  std::size_t layers = 0;
  std::size_t blocks = 0;
  std::size_t current_block = no_block;
};

constexpr inline_string<max_param_name> join_name(const inline_string<max_param_name>& prefix,
                                                  std::string_view part) {
  inline_string<max_param_name> out = prefix;
  if (!out.empty() && !part.empty()) out.append(".");
  out.append(part);
  return out;
}

// How messages name a layer.
constexpr std::string layer_label(const model_node& n) {
  return n.name.empty() ? std::string("(unnamed layer)") : std::string(n.name.view());
}

// Appends the rows of a layer's own parameters to the table.
template <descriptor D>
constexpr void walk_layer_params(const D& d, model_node& node, const walk_state& state, model_graph& graph) {
  for (const param_decl& decl : d.params()) {
    param_info p;
    p.name = join_name(node.name, decl.name);
    p.rank = decl.rank;
    p.numel = 1;
    for (std::size_t i = 0; i < decl.rank; ++i) {
      if (decl.shape[i] == 0)
        throw std::invalid_argument("kfsdp: parameter '" + std::string(p.name.view()) +
                                    "' has extent 0 in dimension " + std::to_string(i) +
                                    ", expected at least 1");
      p.shape[i] = decl.shape[i];
      p.numel = checked_mul(p.numel, decl.shape[i], [&] { return "parameter '" + std::string(p.name.view()) + "' elements"; });
    }
    p.layer = node.layer;
    p.block = state.current_block;
    p.init = decl.init;
    graph.params.push_back(p);
  }
}

// Records which slot of a tied layer's compute is borrowed (its owner's row is found after the walk:
// the owner may come later in the model).
template <descriptor D>
constexpr void record_tie(const D& d, model_node& node) {
  if constexpr (requires { D::tied_param; }) {
    if (!d.enabled) return;
    std::size_t slot = 0;
    for (const param_decl& decl : d.all_params()) {
      if (decl.name == D::tied_param.view()) {
        node.tied_slot = slot;
        node.tied_name = inline_string<max_param_name>(decl.name);
        node.tie_owner_name = inline_string<max_param_name>(D::owner.view());
        node.tied_shape = decl.shape;
        node.tied_rank = decl.rank;
        return;
      }
      ++slot;
    }
  }
}

// The walk: appends `d`'s node, then its parameters (a layer) or its children's subtrees.
// `is_copy`: d is one copy of a repeat's element, a unit of its own as a block is.
template <descriptor D>
constexpr void walk_model(const D& d, const inline_string<max_param_name>& name, std::size_t parent, bool is_copy,
                          walk_state& state, model_graph& graph) {
  const std::size_t self = graph.nodes.size();
  graph.nodes.push_back({});
  model_node node;
  node.name = name;
  node.kind = D::kind;
  node.parent = parent;
  node.first_param = graph.params.size();
  const std::size_t enclosing = state.current_block;
  // A block nested in a block stays part of the outer one.
  if (enclosing == no_block && (D::kind == layer_kind::block || is_copy)) node.block = state.current_block = state.blocks++;
  if constexpr (D::kind == layer_kind::layer) {
    if (std::size(d.params()) > 0) node.layer = state.layers++;  // activations and losses own no bucket
    walk_layer_params(d, node, state, graph);
    record_tie(d, node);
  } else {
    constexpr bool copies_are_units = requires { D::copies_are_units; };
    d.for_each_child([&](const auto& child, std::string_view child_name) {
      walk_model(child, join_name(name, child_name), self, copies_are_units, state, graph);
    });
  }
  node.end_param = graph.params.size();
  state.current_block = enclosing;
  graph.nodes[self] = node;
}

// Each tied layer's owner, found by name, and whether its shape is the one the layer declares. A
// broken tie is recorded, not thrown: the table and the units do not read ties, the network
// (which binds the owner's row) refuses one.
constexpr void resolve_ties(model_graph& graph) {
  for (model_node& n : graph.nodes) {
    if (!n.ties()) continue;
    for (std::size_t p = 0; p < graph.params.size() && n.tie_owner == model_node::none; ++p)
      if (graph.params[p].name.view() == n.tie_owner_name.view()) n.tie_owner = p;
    if (n.tie_owner == model_node::none) continue;
    const param_info& o = graph.params[n.tie_owner];
    n.tie_shape_matches = o.rank == n.tied_rank;
    for (std::size_t i = 0; n.tie_shape_matches && i < o.rank; ++i) n.tie_shape_matches = o.shape[i] == n.tied_shape[i];
  }
}


// Graphs built at run time in this process: kfsdp's tests check that a trainer builds its model's once.
inline std::atomic<std::size_t> model_graphs_built{0};
}  // namespace detail

// The graph of `model` (run-time sizes allowed; usable in constant evaluation).
KFSDP_EXPORT template <descriptor Model>
constexpr model_graph make_model_graph(const Model& model) {
  if (!std::is_constant_evaluated()) detail::model_graphs_built.fetch_add(1, std::memory_order_relaxed);
  model_graph graph;
  detail::walk_state state;
  detail::walk_model(model, inline_string<max_param_name>(Model::name.view()), no_node, false, state, graph);
  detail::resolve_ties(graph);
  return graph;
}

}  // namespace kfsdp
