#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Layer descriptors: empty types (or, with run-time sizes, small value types) that declare the
// parameters of a model and how they group into layers and transformer blocks. They hold no data
// and compute nothing: the shard plan is derived from them.
//
// The descriptor concept — a type D is a `descriptor` when
//   1. `D::name` is a kfsdp::fixed_string (the name part it adds to a dotted parameter name; "" adds none),
//   2. `D::kind` is a `layer_kind`, and
//   3a. for kind == layer: `d.params()` returns a range of `param_decl` (name, shape), or
//   3b. for kind == block or container: `d.for_each_child(f)` calls `f(child, child_name)` in order.
//
// A user's own layer (a descriptor of kind `layer`); a parameter starts at zero unless its
// param_decl names an init_rule:
//
//   template <kfsdp::fixed_string Name, std::size_t Dim>
//   struct rms_norm {
//     static constexpr auto name = Name;
//     static constexpr kfsdp::layer_kind kind = kfsdp::layer_kind::layer;
//     constexpr auto params() const { return std::array{kfsdp::param_decl{"weight", {Dim}, {kfsdp::init_rule::ones}}}; }
//   };
//
// Its compute is derived from an expression (model/rowwise.hpp) or written by hand (compute/ops.hpp).
//
// Sizes are static (template arguments) or `kfsdp::dyn` (given to the constructor at run time):
// a zero static size is a compile error, a zero run-time size an exception — from the same check.

#include <array>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include <kfsdp/meta/checked.hpp>
#include <kfsdp/meta/fixed_string.hpp>

namespace kfsdp {

// A size given at run time instead of as a template argument (as in std::extents).
KFSDP_EXPORT inline constexpr std::size_t dyn = std::dynamic_extent;

// Parameters have up to this many dimensions (weights 2, biases 1; conv kernels would need 4).
inline constexpr std::size_t max_param_rank = 4;

KFSDP_EXPORT enum class layer_kind { layer, block, container };

// What flows between layers, declared by each layer as `using input = ...; using output = ...;`
// (both default to features): a sequential whose neighbours disagree does not compile.
struct features {};  // a matrix [rows, features] of the scalar type
struct ids {};       // one integer per row (token ids)
struct loss {};      // a scalar: the mean loss of the batch (a loss layer's output, against targets)
// A loss layer's targets, `using target = ...`: class ids (one integer per row) or values (a
// matrix shaped like the loss layer's input).
struct class_ids {};
struct values {};

// How a parameter starts when the user gives no rule: PyTorch's defaults for each built-in layer.
//   normal: N(0, scale²); uniform: U(−b, b) with b = scale, or b = 1/√fan_in when fan_in > 0
//   (nn.Linear's kaiming-uniform weight and its bias: b = 1/√in_features for both).
KFSDP_EXPORT struct init_rule {
  enum kind_t : unsigned char { zeros, ones, normal, uniform } kind = zeros;
  double scale = 0.0;
  std::size_t fan_in = 0;
};

// A parameter as a layer declares it: local name and shape, PyTorch's layout (dim 0 first).
KFSDP_EXPORT struct param_decl {
  std::string_view name;
  std::array<std::size_t, max_param_rank> shape{};
  std::size_t rank = 0;
  init_rule init{};

  constexpr param_decl() = default;
  constexpr param_decl(std::string_view param_name, std::initializer_list<std::size_t> extents,
                       init_rule default_init = {})
      : name(param_name), rank(extents.size()), init(default_init) {
    if (extents.size() == 0 || extents.size() > max_param_rank)
      throw std::invalid_argument("kfsdp::param_decl '" + std::string(param_name) + "': rank " +
                                  std::to_string(extents.size()) + ", expected 1.." +
                                  std::to_string(max_param_rank));
    std::size_t d = 0;
    for (std::size_t e : extents) shape[d++] = e;
  }
};

// Up to N parameter declarations, as many as a run-time choice keeps (a layer whose tied
// parameter belongs to another layer declares one fewer).
template <std::size_t N>
struct param_list {
  std::array<param_decl, N> items{};
  std::size_t count = 0;
  constexpr void push_back(const param_decl& d) { items[count++] = d; }
  [[nodiscard]] constexpr const param_decl* begin() const { return items.data(); }
  [[nodiscard]] constexpr const param_decl* end() const { return items.data() + count; }
  [[nodiscard]] constexpr std::size_t size() const { return count; }
};

namespace detail {
// How many parameters a params() result can hold: a std::array's size, a param_list's capacity.
template <class List>
struct param_capacity;
template <std::size_t N>
struct param_capacity<std::array<param_decl, N>> : std::integral_constant<std::size_t, N> {};
template <std::size_t N>
struct param_capacity<param_list<N>> : std::integral_constant<std::size_t, N> {};
}  // namespace detail

template <class D>
concept named_descriptor = requires {
  { D::name.view() } -> std::convertible_to<std::string_view>;
  { D::kind } -> std::convertible_to<layer_kind>;
};

template <class D>
concept layer_descriptor = named_descriptor<D> && (D::kind == layer_kind::layer) &&
                           requires(const D& d) {
                             { *std::begin(d.params()) } -> std::convertible_to<param_decl>;
                           };

namespace detail {
struct any_child_visitor {
  template <class C>
  constexpr void operator()(const C&, std::string_view) const {}
};
}  // namespace detail

template <class D>
concept container_descriptor = named_descriptor<D> && (D::kind != layer_kind::layer) &&
                               requires(const D& d) { d.for_each_child(detail::any_child_visitor{}); };

template <class D>
concept descriptor = layer_descriptor<D> || container_descriptor<D>;

namespace detail {
template <class D> struct input_of { using type = features; };
template <class D> requires requires { typename D::input; } struct input_of<D> { using type = typename D::input; };
template <class D> struct output_of { using type = features; };
template <class D> requires requires { typename D::output; } struct output_of<D> { using type = typename D::output; };
}  // namespace detail

// The activation a descriptor takes and gives (containers: their first child's input, their last's output).
template <class D> using input_t = typename detail::input_of<D>::type;
template <class D> using output_t = typename detail::output_of<D>::type;

// A size `value` for a dimension declared `Static` (a number or dyn), checked once for both
// cases: static zero is rejected by the static_assert at the declaration, a run-time zero or a
// value that contradicts the static one throws, naming the layer and the size.
//   checked_extent<dyn>("linear", "c_fc", "in_features", 0)
//     -> throws "kfsdp: linear 'c_fc': in_features is 0, expected at least 1"
template <std::size_t Static>
constexpr std::size_t checked_extent(std::string_view layer, std::string_view layer_name,
                                     std::string_view size_name, std::size_t value) {
  auto fail = [&](const std::string& expected) {
    throw std::invalid_argument("kfsdp: " + std::string(layer) + " '" + std::string(layer_name) +
                                "': " + std::string(size_name) + " is " +
                                (value == dyn ? std::string("dyn") : std::to_string(value)) +
                                ", expected " + expected);
  };
  if (value == 0 || value == dyn) fail("at least 1");
  if (Static != dyn && value != Static) fail("the static size " + std::to_string(Static));
  return value;
}

// `Factor * extent`, staying dyn when the extent is dyn (for shapes like c_attn's [3·D, D]).
template <std::size_t Factor, std::size_t Extent>
inline constexpr std::size_t scaled_extent = [] {
  if constexpr (Extent == dyn) return dyn;
  else return static_mul<Factor, Extent>();  // a static 3·D past 2^64 does not compile
}();

}  // namespace kfsdp
