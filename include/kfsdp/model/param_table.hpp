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
// the same table for any model value (run-time sizes) and returns a std::vector. Both are the
// parameters of the model's graph (model/model_graph.hpp), the one walk of the descriptor.

#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <vector>

#include <kfsdp/model/model_graph.hpp>

namespace kfsdp {

namespace detail {
// Evaluated once on its own, so that the table's evaluation below does not count the walk twice
// against the compiler's constexpr step limit (a 96-block GPT needs it).
template <descriptor Model>
inline constexpr std::size_t static_param_count = make_model_graph(Model{}).params.size();

template <descriptor Model>
constexpr auto make_static_param_table() {
  std::array<param_info, static_param_count<Model>> table{};
  const model_graph graph = make_model_graph(Model{});
  std::copy(graph.params.begin(), graph.params.end(), table.begin());
  return table;
}
}  // namespace detail

// Every parameter of `model`, in order (run-time sizes allowed; usable in constant evaluation).
KFSDP_EXPORT template <descriptor Model>
constexpr std::vector<param_info> make_param_table(const Model& model) {
  return make_model_graph(model).params;
}

// The table of a fully static model, as a constexpr array.
KFSDP_EXPORT template <descriptor Model>
  requires std::is_default_constructible_v<Model>
inline constexpr auto param_table = detail::make_static_param_table<Model>();

// Number of parameters of a model value.
template <descriptor Model>
constexpr std::size_t param_count(const Model& model) {
  return make_model_graph(model).params.size();
}

}  // namespace kfsdp
