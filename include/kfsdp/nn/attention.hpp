#pragma once
// kfsdp::nn::causal_self_attention — the core of nanoGPT's CausalSelfAttention, between c_attn
// and c_proj: from qkv [B*T, 3D] (q | k | v along the last dimension) to y [B*T, D].
// Head h of q is columns h·hd .. (h+1)·hd of the q part (hd = D / H), likewise for k and v;
// y row (b, t), head h = Σ_{s ≤ t} softmax_s(q_t · k_s / √hd) v_s, heads side by side.
// Grouped-query attention (Llama's): with KV key/value heads (KV divides H) the input is
// [q (H·hd) | k (KV·hd) | v (KV·hd)] and query head h reads key/value head h / (H/KV), as
// transformers' repeat_kv lays them out; KV = H is the multi-head attention above.
//
//   kfsdp::nn::causal_self_attention<double> attn(/*dim=*/64, /*heads=*/4, /*seq_len=*/32);
//   kfsdp::nn::causal_self_attention<double> gqa(64, 4, 32, /*kv_heads=*/2);   // qkv [rows, 64 + 2·32]
//   auto cache = attn.make_cache(rows);          // rows = B * 32; probabilities [B, 4, 32, 32]
//   attn.forward({}, qkv, y, cache);
//   attn.backward({}, {}, cache, dy, dqkv);      // dqkv [rows, 3 * 64] overwritten
//
// Per (window, head) the products q·kᵀ, p·v and their gradients are GEMMs (BLAS) on head-major copies
// of q, k, v; the causal softmax and its gradient are kernels over the score rows. No atomics.
// The object owns its scratch (allocated once per batch size and reused): one object, one thread.
// Conventions: see views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>

namespace kfsdp::nn {

template <class Scalar>
class causal_self_attention {
 public:
  using scalar_type = Scalar;
  using params = no_params;
  using grads = no_params;
  struct cache {
    const_matrix<Scalar> qkv;     // the input, kept as a view
    tensor4<Scalar> probs;        // [B, H, T, T] softmax probabilities, 0 above the diagonal
  };

  // Throws std::invalid_argument unless heads divides dim and kv_heads divides heads,
  // std::overflow_error when the input's width or a window's probabilities [heads, seq_len, seq_len]
  // overflow 64 bits.
  causal_self_attention(std::size_t dim, std::size_t heads, std::size_t seq_len);
  causal_self_attention(std::size_t dim, std::size_t heads, std::size_t seq_len, std::size_t kv_heads);

  [[nodiscard]] std::size_t in_features() const noexcept { return in_features_; }  // (heads + 2 · kv_heads) · head_dim
  [[nodiscard]] std::size_t out_features() const noexcept { return dim_; }
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] std::size_t heads() const noexcept { return heads_; }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return dim_ / heads_; }
  [[nodiscard]] std::size_t seq_len() const noexcept { return seq_len_; }
  // rows must be a multiple of seq_len (whole windows).
  [[nodiscard]] cache make_cache(std::size_t rows) const;

  // Uses scratch [4, B·H, T, hd] owned by this object (mutable: nothing in it outlives the call).
  void forward(const params& p, const_matrix<Scalar> qkv, matrix<Scalar> y, cache& c) const;
  // Uses scratch owned by this object: the forward's [4, B·H, T, hd], [B, H, T, T] and [3, B·H, T, hd].
  void backward(const params& p, const grads& g, const cache& c, const_matrix<Scalar> dy,
                matrix<Scalar> dqkv);

 private:
  std::size_t windows(const char* where, std::size_t rows) const;
  tensor4<Scalar> make_scores(const char* where, const char* label, std::size_t batch, bool initialize) const;
  void ensure_heads(const char* where, const char* label, tensor4<Scalar>& heads, std::size_t parts,
                    std::size_t batch) const;
  std::size_t dim_;
  std::size_t heads_;
  std::size_t kv_heads_;
  std::size_t seq_len_;
  std::size_t in_features_ = 0;
  tensor4<Scalar> dscores_;  // backward scratch: d(loss)/d(scores)
  mutable tensor4<Scalar> heads_scratch_;  // [4, B·H, T, hd]: q, k, v and y (forward) or dy (backward) per head (k, v: the first B·KV)
  tensor4<Scalar> grad_heads_;             // [3, B·H, T, hd]: dq, dk, dv per head (dk, dv: the first B·KV)
};

extern template class causal_self_attention<float>;
extern template class causal_self_attention<double>;

}  // namespace kfsdp::nn
