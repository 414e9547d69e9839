#pragma once
// kfsdp::nn::cached_attention — causal attention for generation: the keys and values of the positions
// seen so far are kept (a key/value cache), so a new token's row attends to them without recomputing
// them. The input row is causal_self_attention's [q (H·hd) | k (KV·hd) | v (KV·hd)], after RoPE; rows
// are consecutive positions first, first + 1, ...: their k and v are stored at those positions, and
// row r's query (query head h reading key/value head h / (H/KV), as repeat_kv) attends to positions
// 0 .. first + r: y_h = Σ_{s ≤ first + r} softmax_s(q_h · k_s / √hd) v_s, heads side by side.
// Worked example, first = 5, one row: its k, v go to position 5; its query reads positions 0..5.
//
//   kfsdp::nn::cached_attention<float> attn(/*heads=*/4, /*kv_heads=*/2, /*head_dim=*/16, /*max_positions=*/320);
//   attn.forward(prompt_qkv, y, 0);     // the prompt's P rows: positions 0 .. P-1 (prefill)
//   attn.forward(next_qkv, y1, P);      // one row: position P, over the P + 1 cached positions
//
// The same sums as causal_self_attention's, per row instead of per window: equal up to rounding.
// Conventions: see views.hpp.

#include <kfsdp/nn/views.hpp>

#include <cstddef>

namespace kfsdp::nn {

template <class Scalar>
class cached_attention {
 public:
  using scalar_type = Scalar;

  // Throws std::invalid_argument for a zero size or kv_heads that does not divide heads,
  // std::overflow_error when the cache [max_positions, kv_heads · head_dim] (twice) overflows.
  cached_attention(std::size_t heads, std::size_t kv_heads, std::size_t head_dim, std::size_t max_positions);

  [[nodiscard]] std::size_t in_features() const noexcept { return (heads_ + 2 * kv_heads_) * head_dim_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return heads_ * head_dim_; }
  [[nodiscard]] std::size_t max_positions() const noexcept { return keys_.extent(0); }
  // Bytes the cache holds: keys and values of max_positions positions.
  [[nodiscard]] std::size_t bytes() const noexcept { return (keys_.span() + values_.span()) * sizeof(Scalar); }

  // Stores the rows' k and v at positions first .. first + rows - 1 and writes y [rows, H·hd]. Throws
  // std::invalid_argument when qkv or y has another shape, or first + rows > max_positions.
  void forward(const_matrix<Scalar> qkv, matrix<Scalar> y, std::size_t first);

 private:
  std::size_t heads_, kv_heads_, head_dim_;
  matrix<Scalar> keys_, values_;  // [max_positions, KV·hd]: k after RoPE, v
  vector<Scalar> scores_;         // [rows · H · max_positions]: each (row, head)'s scores, then probabilities
};

extern template class cached_attention<float>;
extern template class cached_attention<double>;

}  // namespace kfsdp::nn
