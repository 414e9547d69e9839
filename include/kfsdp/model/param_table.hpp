#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// param_table: every parameter of a model, in order, with its dotted name, shape, numel, and the
// indices of the layer and the transformer block that own it.
//
//   using mlp = sequential<"", linear<"fc", 4, 13>, linear<"out", 13, 1>>;
//   param_table<mlp>  ->  { fc.weight [13,4] layer 0, fc.bias [13] layer 0,
//                           out.weight [1,13] layer 1, out.bias [1] layer 1 }   (block: none)
//
// `param_table<M>` is a constexpr std::array for a fully static M; `make_param_table(model)` is
// the same walk for any model value (run-time sizes) and returns a std::vector.

#include <array>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
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

// Calls sink(const param_info&) for every parameter of `d`, in model order.
template <descriptor D, class Sink>
constexpr void walk_params(const D& d, const inline_string<max_param_name>& prefix,
                           walk_state& state, Sink& sink) {
  if constexpr (D::kind == layer_kind::layer) {
    const std::size_t layer = state.layers;
    if (std::size(d.params()) > 0) ++state.layers;  // activations and losses own no bucket
    for (const param_decl& decl : d.params()) {
      param_info p;
      p.name = join_name(prefix, decl.name);
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
      p.layer = layer;
      p.block = state.current_block;
      p.init = decl.init;
      sink(p);
    }
  } else {
    const std::size_t enclosing = state.current_block;
    // A block nested in a block stays part of the outer one.
    if (D::kind == layer_kind::block && enclosing == no_block) state.current_block = state.blocks++;
    d.for_each_child([&](const auto& child, std::string_view child_name) {
      // Each copy of a repeat is a unit of its own, as a block is.
      if constexpr (requires { D::copies_are_units; })
        if (enclosing == no_block) state.current_block = state.blocks++;
      walk_params(child, join_name(prefix, child_name), state, sink);
    });
    state.current_block = enclosing;
  }
}

template <descriptor D>
constexpr std::size_t count_params(const D& d) {
  if constexpr (D::kind == layer_kind::layer) {
    return std::size(d.params());
  } else {
    std::size_t n = 0;
    d.for_each_child([&](const auto& child, std::string_view) { n += count_params(child); });
    return n;
  }
}

template <descriptor Model>
constexpr auto make_static_param_table() {
  constexpr std::size_t count = count_params(Model{});
  std::array<param_info, count> table{};
  std::size_t next = 0;
  walk_state state;
  auto sink = [&](const param_info& p) { table[next++] = p; };
  walk_params(Model{}, inline_string<max_param_name>(Model::name.view()), state, sink);
  return table;
}

}  // namespace detail

// Every parameter of `model`, in order (run-time sizes allowed; usable in constant evaluation).
KFSDP_EXPORT template <descriptor Model>
constexpr std::vector<param_info> make_param_table(const Model& model) {
  std::vector<param_info> table;
  table.reserve(detail::count_params(model));
  detail::walk_state state;
  auto sink = [&](const param_info& p) { table.push_back(p); };
  detail::walk_params(model, inline_string<max_param_name>(Model::name.view()), state, sink);
  return table;
}

// The table of a fully static model, as a constexpr array.
KFSDP_EXPORT template <descriptor Model>
  requires std::is_default_constructible_v<Model>
inline constexpr auto param_table = detail::make_static_param_table<Model>();

// Number of parameters, layers and blocks of a model value.
template <descriptor Model>
constexpr std::size_t param_count(const Model& model) {
  return detail::count_params(model);
}

}  // namespace kfsdp
