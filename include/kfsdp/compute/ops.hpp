#pragma once
// The compute of each layer descriptor: kfsdp::compute_t<Layer, Scalar>. For the built-in layers
// it is one of the ops below (each wraps the kfsdp::nn kernel of the same name) or, for layer_norm,
// the activations and mse, the kernels derived from their expression form (derived_op); a user's
// layer names its own as a member template `compute<Scalar>`.
//
// The layer concept — a leaf descriptor L (model/descriptor.hpp: name, kind, params()) whose
// compute C = compute_t<L, S> is constructed as C(layer) and, by what L takes and gives
// (L::input, L::output; features when not declared), offers
//   features -> features  void forward(const layer_params<const S>& p, const_matrix<S> x, matrix<S> y);
//                         void backward(const layer_params<const S>& p, const layer_params<S>& g,
//                                       const_matrix<S> dy, matrix<S> dx);
//   ids -> features       void forward(p, const_index_vector ids, matrix<S> y);
//                         void backward(p, g, const_matrix<S> dy);
//   features -> loss      S forward(const_matrix<S> x, T targets);   T: const_index_vector (class_ids)
//                         void backward(S grad_scale, matrix<S> dx);    or const_matrix<S> (values)
// forward OVERWRITES y and keeps (as views) what backward needs; backward ACCUMULATES into the
// gradients g and OVERWRITES dx — an empty dx (no data) asks for no input gradient (the first
// layer). y's width is L::out_features_for(in) (the input's width when L does not say), and
// L::expected_in_features(), when L has it, is checked against the width it is given.
// p.matrix(i) / p.vector(i) are the i-th parameter of L::params() in its declared shape.
// A compute with `static constexpr bool skips_frozen_gradients = true` is given no view for a
// frozen parameter's gradient (g.has(i) is false, g.matrix(i) empty) and computes none; any other
// is given a buffer as for the rest, and what it adds there is dropped.
//
// A user's layer, y = x · scale (test/train/test_trainer_mpi.cpp trains it inside an MLP). Its compute is a
// class of its own, not nested in scale<Name>: nvcc cannot name a kernel inside a class whose template
// arguments hold a string.
//
//   template <class S>
//   struct scale_op {
//     template <class Layer> explicit scale_op(const Layer&) {}
//     kfsdp::nn::const_matrix<S> input;                       // kept for backward
//     void forward(const kfsdp::layer_params<const S>& p, kfsdp::nn::const_matrix<S> x, kfsdp::nn::matrix<S> y);
//     void backward(const kfsdp::layer_params<const S>& p, const kfsdp::layer_params<S>& g,
//                   kfsdp::nn::const_matrix<S> dy, kfsdp::nn::matrix<S> dx);
//   };
//   template <kfsdp::fixed_string Name>
//   struct scale {
//     static constexpr auto name = Name;
//     static constexpr kfsdp::layer_kind kind = kfsdp::layer_kind::layer;
//     constexpr auto params() const { return std::array{kfsdp::param_decl{"factor", {1}, {kfsdp::init_rule::ones}}}; }
//     template <class S> using compute = scale_op<S>;
//   };

#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/param_table.hpp>
#include <kfsdp/nn/attention.hpp>
#include <kfsdp/nn/cross_entropy.hpp>
#include <kfsdp/nn/embedding.hpp>
#include <kfsdp/nn/linear.hpp>
#include <kfsdp/nn/lora.hpp>
#include <kfsdp/nn/rotary.hpp>
#include <kfsdp/compute/layer_params.hpp>
#include <kfsdp/compute/rowwise.hpp>

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>

namespace kfsdp {

// --- the built-in layers' compute ---

template <class S>
struct linear_op {
  static constexpr bool skips_frozen_gradients = true;  // no dW (nor db) for a frozen weight (bias)
  nn::linear<S> kernel;
  typename nn::linear<S>::cache cache;
  template <class D>
  explicit linear_op(const D& d) : kernel(d.in_features, d.out_features, has_bias(d)) {}
  template <class D>
  static constexpr bool has_bias(const D& d) {
    if constexpr (requires { d.bias; }) return d.bias;  // optional_bias: chosen at run time
    else return D::has_bias;
  }
  nn::linear_tensors<const S> tensors(const layer_params<const S>& p) const {
    return kernel.has_bias() ? nn::linear_tensors<const S>(p.matrix(0), p.vector(1)) : nn::linear_tensors<const S>(p.matrix(0));
  }
  void forward(const layer_params<const S>& p, nn::const_matrix<S> x, nn::matrix<S> y) {
    kernel.forward(tensors(p), x, y, cache);
  }
  void backward(const layer_params<const S>& p, const layer_params<S>& g, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    const nn::linear_tensors<S> grads = kernel.has_bias() ? nn::linear_tensors<S>(g.matrix(0), g.vector(1))
                                                          : nn::linear_tensors<S>(g.matrix(0));
    kernel.backward(tensors(p), grads, cache, dy, dx);
  }
};

template <class S>
struct lora_op {
  static constexpr bool skips_frozen_gradients = true;  // a frozen base: no dW, no db
  nn::lora<S> kernel;
  typename nn::lora<S>::cache cache;
  std::size_t first_adapter;  // A's index in params(): after the weight and the bias
  template <class D>
  explicit lora_op(const D& d)
      : kernel(d.in_features, d.out_features, d.rank, d.alpha, linear_op<S>::has_bias(d)), first_adapter(linear_op<S>::has_bias(d) ? 2 : 1) {}
  template <class E>
  nn::lora_tensors<E> tensors(const layer_params<E>& p) const {
    return {p.matrix(0), first_adapter == 2 ? p.vector(1) : nn::vector_of<E>(), p.matrix(first_adapter), p.matrix(first_adapter + 1)};
  }
  void forward(const layer_params<const S>& p, nn::const_matrix<S> x, nn::matrix<S> y) {
    kernel.forward(tensors(p), x, y, cache);
  }
  void backward(const layer_params<const S>& p, const layer_params<S>& g, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    kernel.backward(tensors(p), tensors(g), cache, dy, dx);
  }
};

// optional_lora: linear_op while its rank is 0 (the same kernel, so the same results bit for bit), lora_op otherwise.
template <class S>
struct optional_lora_op {
  static constexpr bool skips_frozen_gradients = true;
  std::variant<linear_op<S>, lora_op<S>> op;
  template <class D>
  explicit optional_lora_op(const D& d) : op(d.rank == 0 ? decltype(op)(linear_op<S>(d)) : decltype(op)(lora_op<S>(d))) {}
  void forward(const layer_params<const S>& p, nn::const_matrix<S> x, nn::matrix<S> y) {
    std::visit([&](auto& o) { o.forward(p, x, y); }, op);
  }
  void backward(const layer_params<const S>& p, const layer_params<S>& g, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    std::visit([&](auto& o) { o.backward(p, g, dy, dx); }, op);
  }
};

// An op without a way to skip its input gradient computes it into scratch when none is wanted.
template <class S>
nn::matrix<S> scratch_if_empty(const char* layer, nn::matrix<S> dx, std::size_t rows, std::size_t cols) {
  if (dx.data() != nullptr) return dx;
  (void)nn::detail::checked_numel(layer, "input gradient scratch", {rows, cols}, sizeof(S));
  return nn::matrix<S>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::scratch"), rows, cols);
}
template <class S>
nn::matrix<S> scratch_if_empty(nn::matrix<S> dx, std::size_t rows, std::size_t cols) {  // the signature users' layers know
  return scratch_if_empty<S>("scratch_if_empty", dx, rows, cols);
}

template <class S>
struct embedding_op {
  static constexpr bool skips_frozen_gradients = true;
  nn::embedding<S> kernel;
  typename nn::embedding<S>::cache cache;
  template <class D>
  explicit embedding_op(const D& d) : kernel(d.num_embeddings, d.dim) {}
  void forward(const layer_params<const S>& p, nn::const_index_vector ids, nn::matrix<S> y) {
    kernel.forward({p.matrix(0)}, ids, y, cache);
  }
  void backward(const layer_params<const S>&, const layer_params<S>& g, nn::const_matrix<S> dy) {
    if (g.has(0)) kernel.backward({g.matrix(0)}, cache, dy);  // a frozen table has nothing to do
  }
};

// y = x + weight[row % seq].
template <class S>
struct positional_embedding_op {
  nn::embedding<S> kernel;
  typename nn::embedding<S>::cache cache;
  nn::index_vector positions;
  std::size_t seq;
  template <class D>
  explicit positional_embedding_op(const D& d) : kernel(d.seq, d.dim), seq(d.seq) {}
  void forward(const layer_params<const S>& p, nn::const_matrix<S> x, nn::matrix<S> y) {
    const std::size_t rows = x.extent(0);
    if (positions.extent(0) != rows) {
      (void)nn::detail::checked_numel("positional_embedding", "positions", {rows}, sizeof(int));
      nn::detail::check_int_extent("positional_embedding", "x", "rows", rows);
      positions = nn::index_vector(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::positions"), rows);
      const nn::index_vector pos = positions;
      const int t = int(seq);
      Kokkos::parallel_for("kfsdp::nn::positions", Kokkos::RangePolicy<nn::execution_space>(0, int(rows)),
                           KOKKOS_LAMBDA(int r) { pos(r) = r % t; });
    }
    Kokkos::deep_copy(y, x);
    kernel.forward_add({p.matrix(0)}, positions, y, cache);
  }
  void backward(const layer_params<const S>&, const layer_params<S>& g, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    kernel.backward({g.matrix(0)}, cache, dy);
    if (dx.data() != nullptr) Kokkos::deep_copy(dx, dy);
  }
};

template <class S>
struct attention_op {
  nn::causal_self_attention<S> kernel;
  typename nn::causal_self_attention<S>::cache cache;
  template <class D>
  explicit attention_op(const D& d) : kernel(d.dim, d.heads, d.seq, d.kv_heads) {}
  void forward(const layer_params<const S>&, nn::const_matrix<S> x, nn::matrix<S> y) {
    if (cache.qkv.extent(0) != x.extent(0) || cache.empty()) cache = kernel.make_cache(x.extent(0));
    kernel.forward({}, x, y, cache);
  }
  void backward(const layer_params<const S>&, const layer_params<S>&, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    kernel.backward({}, {}, cache, dy, scratch_if_empty("causal_self_attention", dx, dy.extent(0), kernel.in_features()));
  }
};

template <class S>
struct rotary_op {
  nn::rotary_embedding<S> kernel;
  template <class D>
  explicit rotary_op(const D& d) : kernel(d.heads, d.kv_heads, d.head_dim, d.seq, d.theta, d.scaling) {}
  void forward(const layer_params<const S>&, nn::const_matrix<S> x, nn::matrix<S> y) { kernel.forward(x, y); }
  void backward(const layer_params<const S>&, const layer_params<S>&, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    if (dx.data() != nullptr) kernel.backward(dy, dx);
  }
};

template <class S>
struct cross_entropy_op {
  nn::cross_entropy<S> kernel;
  typename nn::cross_entropy<S>::cache cache;
  template <class D>
  explicit cross_entropy_op(const D& d) : kernel(d.classes) {}
  S forward(nn::const_matrix<S> logits, nn::const_index_vector targets) {
    if (cache.losses.extent(0) != logits.extent(0)) cache = kernel.make_cache(logits.extent(0));
    return kernel.forward(logits, targets, cache);
  }
  void backward(S grad_scale, nn::matrix<S> dlogits) { kernel.backward(cache, grad_scale, dlogits); }
};

// --- which op computes which descriptor ---

template <class Layer, class S>
struct compute_of {
  using type = typename Layer::template compute<S>;  // a user's layer names its own
};
// kfsdp's layers are told by their anonymous type (the same layer named ""): nvcc's front end deduces
// no fixed_string argument in a partial specialization, so none below names a layer's Name. A tied
// layer inherits its layer's anonymous type, and so its compute.
template <class Layer, class S>
  requires requires { typename Layer::anonymous; } && (!std::is_same_v<Layer, typename Layer::anonymous>)
struct compute_of<Layer, S> : compute_of<typename Layer::anonymous, S> {};

// A row-wise layer's compute is derived from its expression (compute/rowwise.hpp).
template <class Layer, class S>
  requires rowwise_descriptor<Layer>
struct compute_of<Layer, S> : detail::rowwise_compute<Layer, S> {};

// A built-in layer computed from its expression form (kfsdp::derived, model/rowwise.hpp): the derived
// kernels run at the hand-written ones' speed or faster (bench_derived, reference/), and check widths.
template <class Derived, class S>
struct derived_op : detail::rowwise_compute<Derived, S>::type {
  template <class Layer>
  explicit derived_op(const Layer& d) : detail::rowwise_compute<Derived, S>::type(as_derived(d)) {}

 private:
  template <class Layer>
  static Derived as_derived(const Layer& d) {
    if constexpr (requires { d.dim; }) return Derived(d.dim);
    else return Derived{};
  }
};

template <activation_fn F>
using derived_activation = std::conditional_t<
    F == activation_fn::gelu, derived::gelu<>,
    std::conditional_t<F == activation_fn::gelu_tanh, derived::gelu_tanh<>,
                       std::conditional_t<F == activation_fn::relu, derived::relu<>,
                                          std::conditional_t<F == activation_fn::silu, derived::silu<>, derived::tanh_layer<>>>>>;

// Static extents whose buffers cannot exist do not compile (dyn ones throw from the kernels).
template <std::size_t I, std::size_t O, bool B, class S>
struct compute_of<linear<"", I, O, B>, S> {
  static_assert(I == dyn || O == dyn || product_fits({O, I, sizeof(S)}),
                "kfsdp::linear: the weight's bytes, Out · In · sizeof(Scalar), overflow 64 bits");
  using type = linear_op<S>;
};
template <std::size_t I, std::size_t O, bool B, class S>
struct compute_of<lora_linear<"", I, O, B>, S> {
  using type = lora_op<S>;
};
template <class L, class S>
  requires std::is_same_v<typename L::anonymous, L>
struct compute_of<optional_lora<L>, S> {
  using type = optional_lora_op<S>;
};
template <std::size_t D, class S>
struct compute_of<layer_norm<"", D>, S> {
  static_assert(D == dyn || product_fits({D, sizeof(S)}), "kfsdp::layer_norm: the weight's bytes, Dim · sizeof(Scalar), overflow 64 bits");
  using type = derived_op<derived::layer_norm<"", D>, S>;
};
template <std::size_t V, std::size_t D, class S>
struct compute_of<embedding<"", V, D>, S> {
  static_assert(V == dyn || D == dyn || product_fits({V, D, sizeof(S)}),
                "kfsdp::embedding: the weight's bytes, Num · Dim · sizeof(Scalar), overflow 64 bits");
  using type = embedding_op<S>;
};
template <std::size_t T, std::size_t D, class S>
struct compute_of<positional_embedding<"", T, D>, S> {
  static_assert(T == dyn || D == dyn || product_fits({T, D, sizeof(S)}),
                "kfsdp::positional_embedding: the weight's bytes, Seq · Dim · sizeof(Scalar), overflow 64 bits");
  using type = positional_embedding_op<S>;
};
template <activation_fn F, class S>
struct compute_of<activation<"", F>, S> { using type = derived_op<derived_activation<F>, S>; };
template <std::size_t D, std::size_t H, std::size_t T, std::size_t KV, class S>
struct compute_of<causal_self_attention<"", D, H, T, KV>, S> {
  static_assert(D == dyn || product_fits({3, D}), "kfsdp::causal_self_attention: its input features, 3 · Dim, overflow 64 bits");
  static_assert(H == dyn || T == dyn || product_fits({H, T, T, sizeof(S)}),
                "kfsdp::causal_self_attention: a window's probabilities, Heads · Seq · Seq · sizeof(Scalar) bytes, overflow 64 bits");
  using type = attention_op<S>;
};
template <std::size_t H, std::size_t KV, std::size_t HD, std::size_t T, class S>
struct compute_of<rotary_embedding<"", H, KV, HD, T>, S> { using type = rotary_op<S>; };
template <std::size_t C, class S>
struct compute_of<cross_entropy<"", C>, S> { using type = cross_entropy_op<S>; };
template <class S>
struct compute_of<mse<"">, S> { using type = derived_op<derived::mse<>, S>; };

template <class Layer, class S>
using compute_t = typename compute_of<Layer, S>::type;

}  // namespace kfsdp
