#pragma once
// The hand-written kernels that the derived ones replaced: the reference test/expr compares them with
// and bench_derived times them against. Each op wraps its kernel (activation.hpp, layer_norm.hpp,
// mse.hpp beside this) as kfsdp::compute_t's ops do; hand_written_t<Layer, S> names the op of a
// built-in layer whose compute is derived_op (kfsdp/compute/ops.hpp).

#include "activation.hpp"
#include "layer_norm.hpp"
#include "mse.hpp"

#include <kfsdp/compute/ops.hpp>

namespace kfsdp::reference {

template <class S>
struct layer_norm_op {
  layer_norm<S> kernel;
  typename layer_norm<S>::cache cache;
  template <class D>
  explicit layer_norm_op(const D& d) : kernel(d.dim) {}
  void forward(const layer_params<const S>& p, nn::const_matrix<S> x, nn::matrix<S> y) {
    if (cache.mean.extent(0) != x.extent(0)) cache = kernel.make_cache(x.extent(0));
    kernel.forward({p.vector(0), p.vector(1)}, x, y, cache);
  }
  void backward(const layer_params<const S>& p, const layer_params<S>& g, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    kernel.backward({p.vector(0), p.vector(1)}, {g.vector(0), g.vector(1)}, cache, dy,
                    scratch_if_empty("layer_norm", dx, dy.extent(0), dy.extent(1)));
  }
};

template <class S>
struct activation_op {
  activation<S> kernel;
  nn::const_matrix<S> input;
  template <class D>
  explicit activation_op(const D&) : kernel(kind_of(D::function), 0) {}
  static activation_kind kind_of(activation_fn f) {
    switch (f) {
      case activation_fn::gelu: return activation_kind::gelu;
      case activation_fn::gelu_tanh: return activation_kind::gelu_tanh;
      case activation_fn::relu: return activation_kind::relu;
      case activation_fn::silu: return activation_kind::silu;
      case activation_fn::tanh: break;
    }
    return activation_kind::tanh;
  }
  void forward(const layer_params<const S>&, nn::const_matrix<S> x, nn::matrix<S> y) {
    if (kernel.features() != x.extent(1)) kernel = activation<S>(kernel.kind(), x.extent(1));
    kernel.forward(x, y);
    input = x;
  }
  void backward(const layer_params<const S>&, const layer_params<S>&, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    if (dx.data() != nullptr) kernel.backward(input, dy, dx);
  }
};

template <class S>
struct mse_op {
  mse_loss<S> kernel{1};
  nn::const_matrix<S> prediction, target;
  template <class D>
  explicit mse_op(const D&) {}
  S forward(nn::const_matrix<S> x, nn::const_matrix<S> t) {
    if (kernel.features() != x.extent(1)) kernel = mse_loss<S>(x.extent(1));
    prediction = x;
    target = t;
    return kernel.forward(x, t);
  }
  void backward(S grad_scale, nn::matrix<S> dx) { kernel.backward(prediction, target, grad_scale, dx); }
};

// kfsdp::layer_norm and kfsdp::activation name the layers here, not this namespace's kernels.
template <class Layer, class S>
struct hand_written_of : hand_written_of<typename Layer::anonymous, S> {};
template <std::size_t D, class S>
struct hand_written_of<kfsdp::layer_norm<"", D>, S> { using type = layer_norm_op<S>; };
template <activation_fn F, class S>
struct hand_written_of<kfsdp::activation<"", F>, S> { using type = activation_op<S>; };
template <class S>
struct hand_written_of<mse<"">, S> { using type = mse_op<S>; };
template <class Layer, class S>
using hand_written_t = typename hand_written_of<Layer, S>::type;

}  // namespace kfsdp::reference
