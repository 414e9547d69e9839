#pragma once
// kfsdp::nn::transformer_block — nanoGPT's pre-norm Block:
//   x = x + c_proj(attn(c_attn(ln_1(x))));  x = x + mlp(ln_2(x))
//
//   kfsdp::nn::transformer_block<double> block(/*dim=*/64, /*heads=*/4, /*seq_len=*/32);
//   auto cache = block.make_cache(rows);          // owns every activation backward needs
//   block.forward(params, x, y, cache);           // y must not alias x (x is kept for backward)
//   block.backward(params, grads, cache, dy, dx); // dx may alias dy
//
// Parameters follow PyTorch's names and layouts: ln_1, attn.c_attn [3D, D], attn.c_proj [D, D],
// ln_2, mlp.c_fc [4D, D], mlp.c_proj [D, 4D]. Conventions: see views.hpp.

#include <kfsdp/nn/attention.hpp>
#include <kfsdp/nn/layer_norm.hpp>
#include <kfsdp/nn/linear.hpp>
#include <kfsdp/nn/mlp.hpp>

#include <cstddef>
#include <type_traits>

namespace kfsdp::nn {

// The two linears of nanoGPT's CausalSelfAttention module.
template <class Element>
struct attention_tensors {
  linear_tensors<Element> c_attn;  // weight [3D, D], bias [3D]
  linear_tensors<Element> c_proj;  // weight [D, D], bias [D]

  attention_tensors() = default;
  attention_tensors(linear_tensors<Element> c_attn_, linear_tensors<Element> c_proj_)
      : c_attn(c_attn_), c_proj(c_proj_) {}
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  attention_tensors(const attention_tensors<Other>& other)
      : c_attn(other.c_attn), c_proj(other.c_proj) {}
};

// block_tensors<const S> are a block's parameters, block_tensors<S> its gradients.
template <class Element>
struct block_tensors {
  layer_norm_tensors<Element> ln_1;
  attention_tensors<Element> attn;
  layer_norm_tensors<Element> ln_2;
  mlp_tensors<Element> mlp;

  block_tensors() = default;
  block_tensors(layer_norm_tensors<Element> ln_1_, attention_tensors<Element> attn_,
                layer_norm_tensors<Element> ln_2_, mlp_tensors<Element> mlp_)
      : ln_1(ln_1_), attn(attn_), ln_2(ln_2_), mlp(mlp_) {}
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  block_tensors(const block_tensors<Other>& other)
      : ln_1(other.ln_1), attn(other.attn), ln_2(other.ln_2), mlp(other.mlp) {}
};

template <class Scalar>
class transformer_block {
 public:
  using scalar_type = Scalar;
  using params = block_tensors<const Scalar>;
  using grads = block_tensors<Scalar>;
  // Every activation of one block for one batch (owned), and the sub-layers' caches.
  struct cache {
    typename layer_norm<Scalar>::cache ln_1;
    matrix<Scalar> ln_1_out;  // [rows, D]
    typename linear<Scalar>::cache c_attn;
    matrix<Scalar> qkv;  // [rows, 3D]
    typename causal_self_attention<Scalar>::cache attn;
    matrix<Scalar> attn_out;  // [rows, D], before c_proj
    typename linear<Scalar>::cache c_proj;
    matrix<Scalar> residual;  // [rows, D], x + attention branch
    typename layer_norm<Scalar>::cache ln_2;
    matrix<Scalar> ln_2_out;  // [rows, D]
    typename mlp<Scalar>::cache mlp;
  };

  transformer_block(std::size_t dim, std::size_t heads, std::size_t seq_len);

  [[nodiscard]] std::size_t in_features() const noexcept { return dim_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return dim_; }
  [[nodiscard]] cache make_cache(std::size_t rows) const;

  void forward(const params& p, const_matrix<Scalar> x, matrix<Scalar> y, cache& c) const;
  // Uses scratch owned by this object (so not const); one block object can serve every layer.
  void backward(const params& p, const grads& g, const cache& c, const_matrix<Scalar> dy,
                matrix<Scalar> dx);

 private:
  std::size_t dim_;
  layer_norm<Scalar> ln_1_;
  linear<Scalar> c_attn_;
  causal_self_attention<Scalar> attn_;
  linear<Scalar> c_proj_;
  layer_norm<Scalar> ln_2_;
  mlp<Scalar> mlp_;
  // backward scratch
  matrix<Scalar> d_residual_;  // [rows, D]
  matrix<Scalar> d_normed_;    // [rows, D], gradient at ln_2_out, then at ln_1_out
  matrix<Scalar> d_attn_out_;  // [rows, D]
  matrix<Scalar> d_qkv_;       // [rows, 3D]
};

extern template class transformer_block<float>;
extern template class transformer_block<double>;

}  // namespace kfsdp::nn
