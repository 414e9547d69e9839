#pragma once
// Definitions of kfsdp::nn::transformer_block; included by kernels/nn/block.cpp.

#include <kfsdp/nn/block.hpp>
#include <kfsdp/nn/detail/elementwise.hpp>

namespace kfsdp::nn {

template <class Scalar>
transformer_block<Scalar>::transformer_block(std::size_t dim, std::size_t heads,
                                             std::size_t seq_len)
    : dim_(dim),
      ln_1_(dim),
      c_attn_(dim, 3 * dim),
      attn_(dim, heads, seq_len),
      c_proj_(dim, dim),
      ln_2_(dim),
      mlp_(dim) {}

template <class Scalar>
typename transformer_block<Scalar>::cache transformer_block<Scalar>::make_cache(
    std::size_t rows) const {
  cache c;
  c.ln_1 = ln_1_.make_cache(rows);
  c.ln_1_out = matrix<Scalar>(Kokkos::view_alloc("kfsdp::nn::block::ln_1_out"), rows, dim_);
  c.qkv = matrix<Scalar>(Kokkos::view_alloc("kfsdp::nn::block::qkv"), rows, 3 * dim_);
  c.attn = attn_.make_cache(rows);
  c.attn_out = matrix<Scalar>(Kokkos::view_alloc("kfsdp::nn::block::attn_out"), rows, dim_);
  c.residual = matrix<Scalar>(Kokkos::view_alloc("kfsdp::nn::block::residual"), rows, dim_);
  c.ln_2 = ln_2_.make_cache(rows);
  c.ln_2_out = matrix<Scalar>(Kokkos::view_alloc("kfsdp::nn::block::ln_2_out"), rows, dim_);
  c.mlp = mlp_.make_cache(rows);
  return c;
}

template <class Scalar>
void transformer_block<Scalar>::forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y,
                                        cache& c) const {
  const std::size_t rows = x.extent(0);
  detail::check_matrix("transformer_block::forward", "x", x, rows, dim_);
  detail::check_matrix("transformer_block::forward", "y", y, rows, dim_);
  if (c.ln_1_out.extent(0) != rows) c = make_cache(rows);
  ln_1_.forward(p.ln_1, x, c.ln_1_out, c.ln_1);
  c_attn_.forward(p.attn.c_attn, c.ln_1_out, c.qkv, c.c_attn);
  attn_.forward({}, c.qkv, c.attn_out, c.attn);
  c_proj_.forward(p.attn.c_proj, c.attn_out, c.residual, c.c_proj);
  detail::add_into<Scalar>(c.residual, x);
  ln_2_.forward(p.ln_2, c.residual, c.ln_2_out, c.ln_2);
  mlp_.forward(p.mlp, c.ln_2_out, y, c.mlp);
  detail::add_into<Scalar>(y, c.residual);
}

template <class Scalar>
void transformer_block<Scalar>::backward(const params& p, const grads& g, const cache& c,
                                         const_matrix<Scalar> dy, matrix<Scalar> dx) {
  const std::size_t rows = c.ln_1_out.extent(0);
  detail::check_matrix("transformer_block::backward", "dy", dy, rows, dim_);
  detail::check_matrix("transformer_block::backward", "dx", dx, rows, dim_);
  if (d_residual_.extent(0) != rows) {
    const auto uninitialised = Kokkos::WithoutInitializing;
    d_residual_ = matrix<Scalar>(Kokkos::view_alloc(uninitialised, "kfsdp::nn::block::d_residual"),
                                 rows, dim_);
    d_normed_ = matrix<Scalar>(Kokkos::view_alloc(uninitialised, "kfsdp::nn::block::d_normed"),
                               rows, dim_);
    d_attn_out_ = matrix<Scalar>(
        Kokkos::view_alloc(uninitialised, "kfsdp::nn::block::d_attn_out"), rows, dim_);
    d_qkv_ = matrix<Scalar>(Kokkos::view_alloc(uninitialised, "kfsdp::nn::block::d_qkv"), rows,
                            3 * dim_);
  }
  // MLP branch; dy is read for the last time by the residual add, so dx may alias it.
  mlp_.backward(p.mlp, g.mlp, c.mlp, dy, d_normed_);
  ln_2_.backward(p.ln_2, g.ln_2, c.ln_2, d_normed_, d_residual_);
  detail::add_into<Scalar>(d_residual_, dy);
  // Attention branch.
  c_proj_.backward(p.attn.c_proj, g.attn.c_proj, c.c_proj, d_residual_, d_attn_out_);
  attn_.backward({}, {}, c.attn, d_attn_out_, d_qkv_);
  c_attn_.backward(p.attn.c_attn, g.attn.c_attn, c.c_attn, d_qkv_, d_normed_);
  ln_1_.backward(p.ln_1, g.ln_1, c.ln_1, d_normed_, dx);
  detail::add_into<Scalar>(dx, d_residual_);
}

}  // namespace kfsdp::nn
