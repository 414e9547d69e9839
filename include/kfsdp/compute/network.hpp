#pragma once
// kfsdp::network<Model, Scalar> — the compute of a model descriptor: one node per descriptor
// node, each leaf running its layer's compute (compute/ops.hpp) on views of the parameters the
// descriptor declared. The nodes are built in the walk order of the model's graph
// (model/model_graph.hpp) and read from it their parameter rows and ties, and their units from the
// assignment (model/unit_assignment.hpp) the caller made of that graph: a trainer passes its
// engine's, so the graph is built and the units assigned once, and nothing here re-derives them.
//
//   sequential<"", linear<"fc1", 4, 64>, gelu<>, linear<"fc2", 64, 1>, mse<>>
//     -> sequence_node{ leaf(fc1: params 0..1), leaf(gelu), leaf(fc2: params 2..3), leaf(mse) }
//   forward:  x [rows, 4] -> fc1 -> y1 [rows, 64] -> gelu -> y2 -> fc2 -> y3 [rows, 1] -> mse -> loss
//   backward: loss -> dy3 -> dy2 -> dy1 -> (no gradient for the input: fc1 skips dx)
//
// Nodes that are units (blocks, copies of a repeat, or layers, as assign_units decides) tell the
// pass when they are entered (a trainer gathers them there); with checkpointing a unit keeps only
// its input in forward and recomputes its forward at the start of its backward. Nothing here knows
// FSDP: the pass is the seam.

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/model/unit_assignment.hpp>
#include <kfsdp/nn/detail/elementwise.hpp>
#include <kfsdp/compute/kv_cache.hpp>
#include <kfsdp/compute/ops.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfsdp {

// What flows forward (value) and backward (gradient) for each kind of activation.
struct no_gradient {};
template <class Tag, class S>
struct flow;
template <class S>
struct flow<features, S> {
  using value = nn::const_matrix<S>;
  using gradient = nn::const_matrix<S>;
};
template <class S>
struct flow<ids, S> {
  using value = nn::const_index_vector;
  using gradient = no_gradient;
};
template <class S>
struct flow<loss, S> {
  using value = S;
  using gradient = no_gradient;
};
template <class Tag, class S>
using value_t = typename flow<Tag, S>::value;
template <class Tag, class S>
using gradient_t = typename flow<Tag, S>::gradient;

namespace detail {
// Parameter views bound (pass_context::params), counted for the test that they are bound once per
// gathering and not on every layer call.
inline std::atomic<std::size_t> param_bindings_made{0};
}  // namespace detail

// A layer's parameter views as last bound, and the version of its rows they were bound at.
template <class S>
struct param_binding {
  layer_params<const S> views;
  const void* pass = nullptr;
  std::uint64_t version = 0;
};

// The caller's side of a pass: its parameter views, its unit boundaries, targets and the loss
// scale. A trainer and a predictor hold parameters differently, and only a trainer gathers units:
// these virtual calls (one a layer or a unit) are the seam between compute and FSDP.
template <class S>
class pass_context {
 public:
  virtual ~pass_context() = default;
  // The parameters of these rows of the parameter table, in order, bound once per gathering: a
  // layer's views are reused while params_version of its rows is unchanged. They do not own the
  // memory (layer_params), so a freed bucket's buffer goes back to the pool all the same.
  const layer_params<const S>& params(param_binding<S>& bound, std::span<const std::size_t> indices) {
    if (indices.empty()) return bound.views;  // a layer without parameters
    const std::uint64_t version = params_version(indices);
    if (bound.pass != this || bound.version != version) {
      bound.views = bind_params(indices);
      bound.pass = this;
      bound.version = version;
      detail::param_bindings_made.fetch_add(1, std::memory_order_relaxed);
    }
    return bound.views;
  }
  // The gradients of these rows, in order (bound on every call: the first one allocates the
  // buffer). skips_frozen: the compute skips a frozen parameter's gradient, so it gets no view.
  virtual layer_params<S> grads(std::span<const std::size_t> indices, bool skips_frozen) = 0;
  // A unit's layers run next (a trainer's schedule gathers it; a predictor holds every parameter).
  virtual void enter_forward(std::size_t /*unit*/) {}
  virtual void enter_backward(std::size_t /*unit*/) {}

  // Under checking_outputs, each layer's: whether its output is finite, in forward order, with the unit the
  // plan runs it in (unit_assignment::runs_in; not the last entered unit, which a layer after a
  // block, in the root, would take for its own).
  void output_checked(const std::string& layer, std::size_t unit, bool finite) { checked.push_back({layer, unit, finite}); }

  nn::const_index_vector target_ids;  // for a loss over class ids
  nn::const_matrix<S> target_values;  // for a loss over values
  nn::const_matrix<S> predictions;    // set by forward: the loss layer's input
  S grad_scale = S(1);                // d(loss)/d(the loss layer's output)
  bool checkpointing = false;         // units keep only their input; backward recomputes
  kv_cache<S>* cache = nullptr;       // set: a cached step (compute/kv_cache.hpp), forward only
  bool recomputing = false;
  // Set while the trainer looks for where a loss went non-finite: each layer then reports, in
  // forward order, whether its output is finite (with the unit it ran in).
  bool checking_outputs = false;
  struct checked_output {
    std::string layer;
    std::size_t unit;  // unit_assignment::runs_in
    bool finite;
  };
  std::vector<checked_output> checked;

 protected:
  // Views of these rows' parameters (a trainer's: of its gathered buckets; throws if one is not).
  virtual layer_params<const S> bind_params(std::span<const std::size_t> indices) = 0;
  // Changes whenever a view bind_params gave of these rows may no longer hold (a trainer's: one of
  // their buckets was gathered or freed since). Parameters that never move: always 0.
  [[nodiscard]] virtual std::uint64_t params_version(std::span<const std::size_t> /*indices*/) const { return 0; }
};

namespace detail {

// Construction state: the graph node being built (nodes are built in the graph's walk order, so a
// node's graph record is the next one) and the features flowing in.
struct network_builder {
  const model_graph* graph = nullptr;
  const unit_assignment* units = nullptr;  // the caller's, alive while the network is built
  std::size_t next_node = 0;
  std::size_t width = 0;  // features given by the layer before (0: the model's input, not yet known)
  std::size_t input_width = 0;  // features the model takes (0: not known yet, or ids in)
  std::string previous = "the model's input";

  // The graph record of the node now built.
  std::size_t take_node() {
    if (next_node >= graph->nodes.size())
      throw std::logic_error("kfsdp::network: the model has more nodes than its graph's " + std::to_string(graph->nodes.size()));
    return next_node++;
  }
  [[nodiscard]] const model_node& node(std::size_t n) const { return graph->nodes[n]; }
  [[nodiscard]] std::size_t unit_of(std::size_t n) const { return units->of_node[n]; }
  [[nodiscard]] std::size_t runs_in(std::size_t n) const { return units->runs_in[n]; }
};

// Whether every element of m is finite (x - x is 0 for a finite x, NaN for an infinity or a NaN).
template <class S>
bool all_finite(const nn::const_matrix<S>& m) {
  std::size_t bad = 0;
  const std::size_t cols = m.extent(1);
  Kokkos::parallel_reduce(
      "kfsdp::all_finite", Kokkos::RangePolicy<>(0, m.extent(0)),
      KOKKOS_LAMBDA(std::size_t r, std::size_t& count) {
        for (std::size_t c = 0; c < cols; ++c)
          if (!(m(r, c) - m(r, c) == S(0))) ++count;
      },
      bad);
  return bad == 0;
}

// Runs a node's forward (and backward) as a unit when it is one.
template <class Node, class X>
auto unit_forward(Node& n, pass_context<typename Node::scalar_type>& ctx, X x) {
  if (n.unit == no_unit) return n.compute_forward(ctx, x);
  if (!ctx.recomputing) ctx.enter_forward(n.unit);
  if (!ctx.checkpointing || ctx.recomputing) return n.compute_forward(ctx, x);
  n.saved_input = x;  // all that stays of this unit until its backward
  auto y = n.compute_forward(ctx, x);
  n.release();
  n.checkpointed = true;
  return y;
}

template <class Node, class DY>
auto unit_backward(Node& n, pass_context<typename Node::scalar_type>& ctx, DY dy) {
  if (n.unit != no_unit) ctx.enter_backward(n.unit);
  if (n.checkpointed) {  // recompute the forward from the kept input, then run backward
    ctx.recomputing = true;
    n.compute_forward(ctx, n.saved_input);
    ctx.recomputing = false;
  }
  auto dx = n.compute_backward(ctx, dy);
  if (n.checkpointed) {
    n.release();
    n.checkpointed = false;
    n.saved_input = {};
  }
  return dx;
}

// m as [rows, cols], reallocated when its shape differs; the sizes are checked first, naming the layer.
template <class S>
nn::matrix<S> ensure(nn::matrix<S>& m, const char* label, const std::string& layer, std::size_t rows, std::size_t cols) {
  if (m.extent(0) != rows || m.extent(1) != cols) {
    const std::string where = "kfsdp::network: layer '" + layer + "'";
    (void)nn::detail::checked_numel(where.c_str(), label, {rows, cols}, sizeof(S));
    nn::detail::check_int_extent(where.c_str(), label, "rows", rows);  // the kernels index with int: stop before allocating
    nn::detail::check_int_extent(where.c_str(), label, "columns", cols);
    m = nn::matrix<S>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
  }
  return m;
}

template <class D, class S>
struct node_of;

// Every tie the graph records must bind: an owner the model has, of the shape the layer declares,
// gathered whenever the layer runs (in the root or in the layer's own unit).
inline void check_ties(const model_graph& graph, const unit_assignment& units) {
  for (std::size_t n = 0; n < graph.nodes.size(); ++n) {
    const model_node& node = graph.nodes[n];
    if (!node.ties()) continue;
    const std::string ties = "kfsdp::network: '" + layer_label(node) + "' ties '" + std::string(node.tied_name.view()) +
                             "' to '" + std::string(node.tie_owner_name.view()) + "'";
    if (node.tie_owner == model_node::none) throw std::invalid_argument(ties + ", which the model does not have");
    if (!node.tie_shape_matches) throw std::invalid_argument(ties + " of another shape");
    const std::size_t runs_in = units.runs_in[n], owner_unit = units.of_param[node.tie_owner];
    if (owner_unit != 0 && owner_unit != runs_in)
      throw std::invalid_argument("kfsdp::network: '" + layer_label(node) + "' (unit " + std::to_string(runs_in) +
                                  ") ties to '" + std::string(node.tie_owner_name.view()) + "' of unit " +
                                  std::to_string(owner_unit) + "; tie only to a parameter of the root or of the same unit");
  }
}

}  // namespace detail

template <class D, class S>
using node_t = typename detail::node_of<D, S>::type;

// What every node has: its activation types, forward and backward run as a unit when it is one
// (Derived supplies compute_forward, compute_backward and release), and the unit's state.
template <class Derived, class S, class In, class Out>
struct node_base {
  using scalar_type = S;
  using in_tag = In;
  using out_tag = Out;

  value_t<Out, S> forward(pass_context<S>& ctx, value_t<In, S> x) {
    return detail::unit_forward(static_cast<Derived&>(*this), ctx, x);
  }
  gradient_t<In, S> backward(pass_context<S>& ctx, gradient_t<Out, S> dy) {
    return detail::unit_backward(static_cast<Derived&>(*this), ctx, dy);
  }

  std::size_t unit = no_unit;      // the FSDP unit this node is, or no_unit
  value_t<In, S> saved_input{};    // with checkpointing: the unit's input, kept for the recompute
  bool checkpointed = false;
};

// A leaf: one layer's compute on its parameters.
template <class D, class S>
class leaf_node : public node_base<leaf_node<D, S>, S, input_t<D>, output_t<D>> {
 public:
  using in_tag = input_t<D>;
  using out_tag = output_t<D>;
  using node_base<leaf_node, S, in_tag, out_tag>::unit;

  leaf_node(const D& d, detail::network_builder& b, bool input_grad, bool /*wrapped*/)
      : desc_(d), op_(d), input_grad_(input_grad) {
    const std::size_t self = b.take_node();
    const model_node& record = b.node(self);
    name_ = record.name.empty() ? std::string("(unnamed layer)") : std::string(record.name.view());
    unit = b.unit_of(self);
    runs_in_ = b.runs_in(self);
    bind_params(record);
    check_input_width(d, b);
    derive_output_width(b);
  }

  value_t<out_tag, S> compute_forward(pass_context<S>& ctx, value_t<in_tag, S> x) {
    rows_ = x.extent(0);
    if constexpr (std::is_same_v<out_tag, loss>) {
      ctx.predictions = x;
      if constexpr (std::is_same_v<typename D::target, class_ids>) {
        if (ctx.target_ids.data() == nullptr) return S(0);  // a prediction: no targets, no loss
        return op_.forward(x, ctx.target_ids);
      } else {
        if (ctx.target_values.data() == nullptr) return S(0);
        return op_.forward(x, ctx.target_values);
      }
    } else {
      const nn::matrix<S> y = detail::ensure(y_, "kfsdp::nn::activation", name_, rows_, out_);
      if constexpr (requires { cached_forward<compute_t<D, S>>::forward; }) {
        if (ctx.cache != nullptr) cached_forward<compute_t<D, S>>::forward(op_, ctx.params(params_, indices()), x, y, *ctx.cache);
        else op_.forward(ctx.params(params_, indices()), x, y);
      } else {
        op_.forward(ctx.params(params_, indices()), x, y);
      }
      if (ctx.checking_outputs) ctx.output_checked(name_, runs_in_, detail::all_finite(nn::const_matrix<S>(y_)));
      return y_;
    }
  }

  gradient_t<in_tag, S> compute_backward(pass_context<S>& ctx, gradient_t<out_tag, S> dy) {
    if constexpr (std::is_same_v<out_tag, loss>) {
      op_.backward(ctx.grad_scale, detail::ensure(dx_, "kfsdp::nn::gradient", name_, rows_, in_));
      return dx_;
    } else if constexpr (std::is_same_v<in_tag, ids>) {
      op_.backward(ctx.params(params_, indices()), ctx.grads(indices(), skips_frozen), dy);
      return {};
    } else {
      nn::matrix<S> dx;
      if (input_grad_) dx = detail::ensure(dx_, "kfsdp::nn::gradient", name_, rows_, in_);
      op_.backward(ctx.params(params_, indices()), ctx.grads(indices(), skips_frozen), dy, dx);
      return dx;
    }
  }

  // Drops every activation this layer holds (checkpointing).
  void release() {
    op_ = compute_t<D, S>(desc_);
    y_ = {};
    dx_ = {};
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_; }

 private:
  // The table rows the compute reads, in its parameters' order (a tied slot reads the owner's row).
  void bind_params(const model_node& record) {
    if (record.bound_count() > index_.size())
      throw std::length_error("kfsdp::network: layer '" + name_ + "' has more than " + std::to_string(index_.size()) + " parameters");
    for (std::size_t slot = 0; slot < record.bound_count(); ++slot) index_[count_++] = record.bound_row(slot);
  }

  // The features this layer takes: what it says, checked against what the layer before gives.
  void check_input_width(const D& d, detail::network_builder& b) {
    if constexpr (std::is_same_v<in_tag, features>) {
      if constexpr (requires { d.expected_in_features(); }) {
        const std::size_t want = d.expected_in_features();
        if (b.width == 0) b.input_width = want;  // the first layer's width is the model's
        if (b.width != 0 && b.width != want)
          throw std::invalid_argument("kfsdp::network: layer '" + name_ + "' takes " + std::to_string(want) +
                                      " features, " + b.previous + " gives " + std::to_string(b.width));
        b.width = want;
      } else {
        if (b.width == 0)
          throw std::invalid_argument("kfsdp::network: layer '" + name_ +
                                      "' comes first but does not say how many features it takes");
        // A hand-written compute that reads per-feature parameters must say its width, or it could read past them.
        if constexpr (!requires { op_.bind_width(std::size_t{}); })
          for (const param_decl& decl : declared_params(d))
            if (decl.rank != 1 || decl.shape[0] != 1)
              throw std::invalid_argument("kfsdp::network: layer '" + name_ + "' has parameter '" + std::string(decl.name) +
                                          "' " + shape_string(std::span<const std::size_t>(decl.shape.data(), decl.rank)) +
                                          " but does not say how many features it takes: give it expected_in_features()"
                                          " (or write it as a kfsdp::rowwise expression, whose widths are derived)");
      }
    }
    in_ = b.width;
  }

  // The features it gives, from its input's.
  void derive_output_width(detail::network_builder& b) {
    if constexpr (requires { op_.bind_width(in_); }) {  // a row-wise expression: its widths checked and derived
      try {
        out_ = op_.bind_width(in_);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("kfsdp::network: layer '" + name_ + "' cannot take the " + std::to_string(in_) +
                                    " features " + b.previous + " gives: " + e.what());
      }
    } else if constexpr (requires { desc_.out_features_for(in_); }) {
      out_ = desc_.out_features_for(in_);
    } else {
      out_ = in_;
    }
    b.width = out_;
    b.previous = "'" + name_ + "' before it";
  }

  static constexpr bool skips_frozen = requires { requires compute_t<D, S>::skips_frozen_gradients; };

  // Every parameter the compute reads, the tied one included.
  static auto declared_params(const D& d) {
    if constexpr (requires { d.all_params(); }) return d.all_params();
    else return d.params();
  }
  std::span<const std::size_t> indices() const { return {index_.data(), count_}; }

  D desc_;
  compute_t<D, S> op_;
  bool input_grad_;
  std::array<std::size_t, layer_params<S>::capacity> index_{};  // rows of the parameter table, in params() order
  std::size_t count_ = 0;
  param_binding<S> params_;  // the views of index_'s rows, kept while their buckets stay gathered
  std::string name_;
  std::size_t runs_in_ = 0;  // the unit the plan runs this layer in (0: the root)
  std::size_t in_ = 0, out_ = 0, rows_ = 0;
  nn::matrix<S> y_, dx_;
};

// The children of a sequential or block, in order.
template <class D, class S, class... C>
class sequence_node : public node_base<sequence_node<D, S, C...>, S, input_t<D>, output_t<D>> {
 public:
  using in_tag = input_t<D>;
  using out_tag = output_t<D>;
  using node_base<sequence_node, S, in_tag, out_tag>::unit;

  // wrapped: a residual around this node is the unit in its place.
  sequence_node(const D& d, detail::network_builder& b, bool input_grad, bool wrapped)
      : children_(make_children(d, b, input_grad, wrapped, std::index_sequence_for<C...>{})) {}

  value_t<out_tag, S> compute_forward(pass_context<S>& ctx, value_t<in_tag, S> x) { return forward_from<0>(ctx, x); }
  gradient_t<in_tag, S> compute_backward(pass_context<S>& ctx, gradient_t<out_tag, S> dy) {
    return backward_from<sizeof...(C)>(ctx, dy);
  }
  void release() {
    std::apply([](auto&... c) { (c.release(), ...); }, children_);
  }
  [[nodiscard]] std::size_t out_features() const { return std::get<sizeof...(C) - 1>(children_).out_features(); }

 private:
  template <std::size_t... I>
  std::tuple<node_t<C, S>...> make_children(const D& d, detail::network_builder& b, bool input_grad, bool wrapped,
                                            std::index_sequence<I...>) {
    const std::size_t self = b.take_node();
    if (!wrapped) unit = b.unit_of(self);
    auto child = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      return node_t<std::tuple_element_t<J, std::tuple<C...>>, S>(std::get<J>(d.children), b, J == 0 ? input_grad : true, false);
    };
    return std::tuple<node_t<C, S>...>{child(std::integral_constant<std::size_t, I>{})...};  // braces: in order
  }
  template <std::size_t I, class X>
  auto forward_from(pass_context<S>& ctx, X x) {
    if constexpr (I == sizeof...(C)) return x;
    else return forward_from<I + 1>(ctx, std::get<I>(children_).forward(ctx, x));
  }
  template <std::size_t I, class DY>
  auto backward_from(pass_context<S>& ctx, DY dy) {
    if constexpr (I == 0) return dy;
    else return backward_from<I - 1>(ctx, std::get<I - 1>(children_).backward(ctx, dy));
  }

  std::tuple<node_t<C, S>...> children_;
};

// x + f(x).
template <class D, class S>
class residual_node : public node_base<residual_node<D, S>, S, features, features> {
 public:
  using node_base<residual_node, S, features, features>::unit;

  residual_node(const D& d, detail::network_builder& b, bool input_grad, bool /*wrapped*/)
      : input_grad_(input_grad), inner_(init(d, b, input_grad)) {}

  value_t<features, S> compute_forward(pass_context<S>& ctx, value_t<features, S> x) {
    const nn::const_matrix<S> fx = inner_.compute_forward(ctx, x);
    nn::detail::add<S>(detail::ensure(out_, "kfsdp::nn::activation", name_, x.extent(0), x.extent(1)), fx, x);
    return out_;
  }
  gradient_t<features, S> compute_backward(pass_context<S>& ctx, gradient_t<features, S> dy) {
    const nn::const_matrix<S> dfx = inner_.compute_backward(ctx, dy);
    if (!input_grad_) return {};
    nn::detail::add<S>(detail::ensure(dx_, "kfsdp::nn::gradient", name_, dy.extent(0), dy.extent(1)), dfx, dy);
    return dx_;
  }
  void release() {
    inner_.release();
    out_ = {};
    dx_ = {};
  }
  [[nodiscard]] std::size_t out_features() const { return inner_.out_features(); }

 private:
  using inner_type = node_t<typename D::base, S>;
  inner_type init(const D& d, detail::network_builder& b, bool input_grad) {
    // The residual and its branch are one graph node: the branch takes it, the residual is its unit.
    const std::size_t self = b.next_node;
    const auto& prefix = b.node(self).name;
    unit = b.unit_of(self);
    name_ = prefix.empty() ? std::string("(residual)") : "residual " + std::string(prefix.view());
    const std::size_t width = b.width;
    inner_type inner(static_cast<const typename D::base&>(d), b, input_grad, true);
    if (width != 0 && b.width != width)
      throw std::invalid_argument("kfsdp::network: residual '" + std::string(prefix.view()) + "' takes " +
                                  std::to_string(width) + " features but its branch gives " + std::to_string(b.width));
    return inner;
  }
  std::string name_;  // for the size checks' messages
  bool input_grad_;
  inner_type inner_;
  nn::matrix<S> out_, dx_;
};

// [f_1(x) | f_2(x) | ...]: the children over one input, their outputs side by side; backward gives
// each child its columns of dy and sums the input gradients the children return.
template <class D, class S, class... C>
class concat_node : public node_base<concat_node<D, S, C...>, S, features, features> {
 public:
  using node_base<concat_node, S, features, features>::unit;

  concat_node(const D& d, detail::network_builder& b, bool input_grad, bool /*wrapped*/)
      : input_grad_(input_grad), children_(make_children(d, b, input_grad, std::index_sequence_for<C...>{})) {}

  value_t<features, S> compute_forward(pass_context<S>& ctx, value_t<features, S> x) {
    const nn::matrix<S> out = detail::ensure(out_, "kfsdp::nn::activation", name_, x.extent(0), out_features());
    for_each_child([&](auto& child, std::size_t first, std::size_t width) {
      const nn::const_matrix<S> part = child.forward(ctx, x);
      Kokkos::deep_copy(Kokkos::subview(out, Kokkos::ALL, std::pair(first, first + width)), part);
    });
    return out_;
  }
  gradient_t<features, S> compute_backward(pass_context<S>& ctx, gradient_t<features, S> dy) {
    bool first_gradient = true;
    for_each_child_reversed([&](auto& child, std::size_t first, std::size_t width, nn::matrix<S>& part) {
      detail::ensure(part, "kfsdp::nn::gradient", name_, dy.extent(0), width);
      Kokkos::deep_copy(part, Kokkos::subview(dy, Kokkos::ALL, std::pair(first, first + width)));
      const nn::const_matrix<S> dx = child.backward(ctx, part);
      if (!input_grad_) return;
      if (first_gradient) Kokkos::deep_copy(detail::ensure(dx_, "kfsdp::nn::gradient", name_, dx.extent(0), dx.extent(1)), dx);
      else nn::detail::add_into<S>(dx_, dx);
      first_gradient = false;
    });
    if (!input_grad_) return {};
    return dx_;
  }
  void release() {
    std::apply([](auto&... c) { (c.release(), ...); }, children_);
    out_ = {};
    dx_ = {};
    for (auto& part : dy_parts_) part = {};
  }
  [[nodiscard]] std::size_t out_features() const { return first_column_.back(); }

 private:
  template <std::size_t... I>
  std::tuple<node_t<C, S>...> make_children(const D& d, detail::network_builder& b, bool input_grad,
                                            std::index_sequence<I...>) {
    const std::size_t self = b.take_node();
    unit = b.unit_of(self);
    const auto prefix = b.node(self).name;
    name_ = prefix.empty() ? std::string("(concat)") : "concat " + std::string(prefix.view());
    const std::size_t in = b.width;
    const std::string previous = b.previous;
    auto child = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      b.width = in != 0 ? in : b.input_width;  // every child reads the concat's input
      b.previous = previous;
      node_t<std::tuple_element_t<J, std::tuple<C...>>, S> made(std::get<J>(d.children), b, input_grad, false);
      first_column_[J + 1] = first_column_[J] + b.width;
      return made;
    };
    std::tuple<node_t<C, S>...> made{child(std::integral_constant<std::size_t, I>{})...};  // braces: in order
    b.width = first_column_.back();
    b.previous = "'" + std::string(prefix.view()) + "' before it";
    return made;
  }
  template <class F>
  void for_each_child(F&& visit) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (visit(std::get<I>(children_), first_column_[I], first_column_[I + 1] - first_column_[I]), ...);
    }(std::index_sequence_for<C...>{});
  }
  template <class F>
  void for_each_child_reversed(F&& visit) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      constexpr std::size_t last = sizeof...(C) - 1;
      (visit(std::get<last - I>(children_), first_column_[last - I], first_column_[last - I + 1] - first_column_[last - I],
             dy_parts_[last - I]),
       ...);
    }(std::index_sequence_for<C...>{});
  }

  bool input_grad_;
  std::string name_;
  std::array<std::size_t, sizeof...(C) + 1> first_column_{};  // child J's columns: first_column_[J] .. first_column_[J + 1]
  std::tuple<node_t<C, S>...> children_;
  std::array<nn::matrix<S>, sizeof...(C)> dy_parts_;  // each child's columns of dy, contiguous
  nn::matrix<S> out_, dx_;
};

// N copies (with wrap_policy::blocks each its own unit, as assign_units decides).
template <class D, class S>
class repeat_node : public node_base<repeat_node<D, S>, S, input_t<D>, output_t<D>> {
 public:
  using element = typename D::element_type;
  using in_tag = input_t<D>;
  using out_tag = output_t<D>;
  using node_base<repeat_node, S, in_tag, out_tag>::unit;

  repeat_node(const D& d, detail::network_builder& b, bool input_grad, bool /*wrapped*/) {
    unit = b.unit_of(b.take_node());
    copies_.reserve(d.count);
    for (std::size_t i = 0; i < d.count; ++i) copies_.emplace_back(d.element, b, i == 0 ? input_grad : true, false);
  }

  value_t<out_tag, S> compute_forward(pass_context<S>& ctx, value_t<in_tag, S> x) {
    for (auto& c : copies_) x = c.forward(ctx, x);
    return x;
  }
  gradient_t<in_tag, S> compute_backward(pass_context<S>& ctx, gradient_t<out_tag, S> dy) {
    for (std::size_t i = copies_.size(); i-- > 0;) dy = copies_[i].backward(ctx, dy);
    return dy;
  }
  void release() {
    for (auto& c : copies_) c.release();
  }
  [[nodiscard]] std::size_t out_features() const { return copies_.back().out_features(); }

 private:
  std::vector<node_t<element, S>> copies_;
};

namespace detail {
// Which node computes D, told by D's members (nvcc deduces no fixed_string in a partial specialization,
// so none matches container<K, N, C...>): a residual adds its input, a concat lays its children's
// outputs side by side, a repeat has one element type,
// any other container its children's tuple, and everything else is a layer.
template <class D, class S>
struct node_of {
  using type = leaf_node<D, S>;
};
template <class D, class S, class Children>
struct sequence_of;
template <class D, class S, class... C>
struct sequence_of<D, S, std::tuple<C...>> {
  using type = sequence_node<D, S, C...>;
};
template <class D, class S>
  requires requires { typename D::children_type; } && (!requires { D::adds_input; }) && (!requires { D::concatenates; })
struct node_of<D, S> : sequence_of<D, S, typename D::children_type> {};
template <class D, class S, class Children>
struct concat_of;
template <class D, class S, class... C>
struct concat_of<D, S, std::tuple<C...>> {
  using type = concat_node<D, S, C...>;
};
template <class D, class S>
  requires requires { typename D::children_type; } && requires { D::concatenates; }
struct node_of<D, S> : concat_of<D, S, typename D::children_type> {};
template <class D, class S>
  requires requires { typename D::children_type; } && requires { D::adds_input; }
struct node_of<D, S> {
  using type = residual_node<D, S>;
};
template <class D, class S>
  requires requires { typename D::element_type; }
struct node_of<D, S> {
  using type = repeat_node<D, S>;
};
}  // namespace detail

// The whole model's compute.
template <descriptor Model, class S>
class network {
 public:
  using in_tag = input_t<Model>;
  using out_tag = output_t<Model>;

  // The compute of `model` over its graph (make_model_graph(model)) and that graph's units. Defined
  // below the class, not inline: a model's network can be compiled once, in a library
  // (kernels/compute/gpt.cpp does it for the example GPT; train/gpt.hpp declares it extern).
  network(const Model& model, const model_graph& graph, const unit_assignment& units);
  // The same, building the graph and assigning its units by `wrap` (a predictor's network).
  explicit network(const Model& model, const wrap_options& wrap = {});
  value_t<out_tag, S> forward(pass_context<S>& ctx, value_t<in_tag, S> x);
  void backward(pass_context<S>& ctx);
  void release();
  // Features a row of the input has (0 for a model that takes token ids) and a row of the output
  // (of a model ending in a loss layer: the predictions the loss takes).
  [[nodiscard]] std::size_t in_features() const noexcept { return in_features_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_features_; }

 private:
  network(const Model& model, const model_graph& graph, const wrap_options& wrap);
  static node_t<Model, S> build(const Model& model, const model_graph& graph, const unit_assignment& units,
                                std::size_t& in_features, std::size_t& out_features);
  std::size_t in_features_ = 0, out_features_ = 0;  // declared before root_: its build sets them
  node_t<Model, S> root_;
};

template <descriptor Model, class S>
network<Model, S>::network(const Model& model, const model_graph& graph, const unit_assignment& units)
    : root_(build(model, graph, units, in_features_, out_features_)) {}

template <descriptor Model, class S>
network<Model, S>::network(const Model& model, const wrap_options& wrap) : network(model, make_model_graph(model), wrap) {}

template <descriptor Model, class S>
network<Model, S>::network(const Model& model, const model_graph& graph, const wrap_options& wrap)
    : network(model, graph, assign_units(graph, wrap)) {}

template <descriptor Model, class S>
auto network<Model, S>::forward(pass_context<S>& ctx, value_t<in_tag, S> x) -> value_t<out_tag, S> {
  return root_.forward(ctx, x);
}

template <descriptor Model, class S>
void network<Model, S>::backward(pass_context<S>& ctx) {
  if constexpr (std::is_same_v<out_tag, loss>) root_.backward(ctx, no_gradient{});
  else throw std::logic_error("kfsdp::network: backward needs a model that ends in a loss layer");
}

template <descriptor Model, class S>
void network<Model, S>::release() {
  root_.release();
}

template <descriptor Model, class S>
node_t<Model, S> network<Model, S>::build(const Model& model, const model_graph& graph, const unit_assignment& units,
                                           std::size_t& in_features, std::size_t& out_features) {
  if (units.of_node.size() != graph.nodes.size() || units.of_param.size() != graph.params.size())
    throw std::logic_error("kfsdp::network: the unit assignment is of another graph (" + std::to_string(units.of_node.size()) +
                           " nodes, the graph has " + std::to_string(graph.nodes.size()) + ")");
  detail::network_builder b;
  b.graph = &graph;
  b.units = &units;
  detail::check_ties(graph, units);
  node_t<Model, S> root(model, b, false, false);
  if (b.next_node != graph.nodes.size())
    throw std::logic_error("kfsdp::network: the model built " + std::to_string(b.next_node) + " nodes, its graph has " +
                           std::to_string(graph.nodes.size()));
  in_features = b.input_width;
  out_features = b.width;
  return root;
}

}  // namespace kfsdp
