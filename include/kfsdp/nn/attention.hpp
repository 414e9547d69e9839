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
//   kfsdp::nn::causal_self_attention<float> long_windows(512, 8, 512);  // automatic: blocked (seq_len >= 128)
//
// Two methods, equal up to rounding (f64: 1e-12 in the tests):
// - whole: per (window, head) the products q·kᵀ, p·v and their gradients are GEMMs over the whole
//   [T, T] scores; the causal softmax and its gradient are kernels over the score rows; the cache
//   keeps the probabilities [B, H, T, T].
// - blocked (FlashAttention-2's order): blocks of 64 queries × 64 keys, blocks above the diagonal
//   skipped; the forward keeps a running max and sum per row (online softmax) and the cache keeps
//   only each row's logsumexp [B, H, T]; backward recomputes each block's probabilities from it,
//   with D = rowsum(dy ∘ y) and dS = P ∘ (dP − D). Every product is still a GEMM (BLAS).
// No atomics. The object owns its scratch (allocated once per batch size and reused): one object,
// one thread. Conventions: see views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>

namespace kfsdp::nn {

enum class attention_method {
  automatic,  // blocked from seq_len >= blocked_from_seq_len, whole below
  whole,      // the [T, T] scores and probabilities per (window, head)
  blocked,    // 64 × 64 blocks, online softmax, the logsumexp kept (flash-style)
};

// Where automatic switches to blocked. bench_kernels' blocked/whole time (forward + backward, f32,
// 8 windows × 8 heads of 64, one thread): 1.03–1.08 at T = 64 (one block: nothing skipped, one GEMM
// more in backward), 0.80–0.82 at 128, 0.68–0.74 at 512 (docs/performance.md).
inline constexpr std::size_t blocked_from_seq_len = 128;
// Queries and keys per block of the blocked method.
inline constexpr std::size_t attention_block = 64;

template <class Scalar>
class causal_self_attention {
 public:
  using scalar_type = Scalar;
  using params = no_params;
  using grads = no_params;
  struct cache {
    const_matrix<Scalar> qkv;     // the input, kept as a view
    const_matrix<Scalar> y;       // the output, kept as a view (blocked: backward's D = rowsum(dy ∘ y))
    tensor4<Scalar> probs;        // whole: [B, H, T, T] softmax probabilities, 0 above the diagonal
    matrix<Scalar> logsumexp;     // blocked: [B·H, T] log Σ_{s ≤ t} exp(score_ts) per query row
    [[nodiscard]] bool empty() const noexcept { return probs.data() == nullptr && logsumexp.data() == nullptr; }
    [[nodiscard]] std::size_t kept_bytes() const noexcept { return (probs.span() + logsumexp.span()) * sizeof(Scalar); }
  };

  // Throws std::invalid_argument unless heads divides dim and kv_heads divides heads,
  // std::overflow_error when the input's width or a window's probabilities [heads, seq_len, seq_len]
  // overflow 64 bits.
  causal_self_attention(std::size_t dim, std::size_t heads, std::size_t seq_len);
  causal_self_attention(std::size_t dim, std::size_t heads, std::size_t seq_len, std::size_t kv_heads,
                        attention_method method = attention_method::automatic);

  [[nodiscard]] std::size_t in_features() const noexcept { return in_features_; }  // (heads + 2 · kv_heads) · head_dim
  [[nodiscard]] std::size_t out_features() const noexcept { return dim_; }
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] std::size_t heads() const noexcept { return heads_; }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return dim_ / heads_; }
  [[nodiscard]] std::size_t seq_len() const noexcept { return seq_len_; }
  [[nodiscard]] attention_method method() const noexcept { return method_; }  // whole or blocked (automatic resolved)
  // rows must be a multiple of seq_len (whole windows).
  [[nodiscard]] cache make_cache(std::size_t rows) const;

  // Uses scratch [4, B·H, T, hd] owned by this object (mutable: nothing in it outlives the call), and
  // blocked, one block's scores and row statistics.
  void forward(const params& p, const_matrix<Scalar> qkv, matrix<Scalar> y, cache& c) const;
  // Uses scratch owned by this object: the forward's [4, B·H, T, hd], [3, B·H, T, hd], and whole
  // [B, H, T, T], blocked two blocks and D [B·H, T].
  void backward(const params& p, const grads& g, const cache& c, const_matrix<Scalar> dy,
                matrix<Scalar> dqkv);

 private:
  std::size_t windows(const char* where, std::size_t rows) const;
  void forward_blocked(const_matrix<Scalar> qkv, matrix<Scalar> y, cache& c, std::size_t batch) const;
  void backward_blocked(const cache& c, const_matrix<Scalar> dy, matrix<Scalar> dqkv, std::size_t batch);
  [[nodiscard]] bool cache_fits(const cache& c, std::size_t batch) const;
  void ensure_block_scratch() const;
  tensor4<Scalar> make_scores(const char* where, const char* label, std::size_t batch, bool initialize) const;
  void ensure_heads(const char* where, const char* label, tensor4<Scalar>& heads, std::size_t parts,
                    std::size_t batch) const;
  std::size_t dim_;
  std::size_t heads_;
  std::size_t kv_heads_;
  std::size_t seq_len_;
  attention_method method_;
  std::size_t in_features_ = 0;
  tensor4<Scalar> dscores_;  // backward scratch: d(loss)/d(scores)
  mutable tensor4<Scalar> heads_scratch_;  // [4, B·H, T, hd]: q, k, v and y (forward) or dy (backward) per head (k, v: the first B·KV)
  tensor4<Scalar> grad_heads_;             // [3, B·H, T, hd]: dq, dk, dv per head (dk, dv: the first B·KV)
  mutable vector<Scalar> block_scratch_;   // blocked: two blocks' scores (S and P, dP and dS) and a block's running max and sum
  matrix<Scalar> row_delta_;               // blocked backward: D = rowsum(dy ∘ y) [B·H, T]
};

extern template class causal_self_attention<float>;
extern template class causal_self_attention<double>;

}  // namespace kfsdp::nn
