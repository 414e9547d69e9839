#pragma once
// Definitions of kfsdp::nn::mlp; included by kernels/nn/mlp.cpp.

#include <kfsdp/nn/mlp.hpp>

namespace kfsdp::nn {

template <class Scalar>
typename mlp<Scalar>::cache mlp<Scalar>::make_cache(std::size_t rows) const {
  cache c;
  c.hidden = matrix<Scalar>(Kokkos::view_alloc("kfsdp::nn::mlp::hidden"), rows, hidden_features());
  c.activated =
      matrix<Scalar>(Kokkos::view_alloc("kfsdp::nn::mlp::activated"), rows, hidden_features());
  return c;
}

template <class Scalar>
void mlp<Scalar>::forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y,
                          cache& c) const {
  if (c.hidden.extent(0) != x.extent(0)) c = make_cache(x.extent(0));
  c_fc_.forward(p.c_fc, x, c.hidden, c.c_fc);
  activation_.forward({}, c.hidden, c.activated, c.activation);
  c_proj_.forward(p.c_proj, c.activated, y, c.c_proj);
}

template <class Scalar>
void mlp<Scalar>::backward(const params& p, const grads& g, const cache& c,
                           const_matrix<Scalar> dy, matrix<Scalar> dx) {
  const std::size_t rows = c.hidden.extent(0);
  if (d_hidden_.extent(0) != rows)
    d_hidden_ = matrix<Scalar>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::mlp::d_hidden"), rows,
        hidden_features());
  c_proj_.backward(p.c_proj, g.c_proj, c.c_proj, dy, d_hidden_);
  activation_.backward({}, {}, c.activation, d_hidden_, d_hidden_);  // elementwise: in place
  c_fc_.backward(p.c_fc, g.c_fc, c.c_fc, d_hidden_, dx);
}

}  // namespace kfsdp::nn
