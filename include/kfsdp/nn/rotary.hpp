#pragma once
// kfsdp::nn::rotary_embedding — rotary position embedding (RoPE) on the queries and keys of a row
// [q (H·hd) | k (KV·hd) | v (KV·hd)], the values copied; as transformers' apply_rotary_pos_emb with
// rotate_half. Row r is position t = r % seq_len (rows are windows of seq_len tokens); in every
// q and k head, pair (i, i + hd/2) turns by the angle t · theta^(−2i/hd):
//   y_i = x_i cos − x_{i+hd/2} sin,   y_{i+hd/2} = x_{i+hd/2} cos + x_i sin.
// Worked example, hd = 4, theta = 10000, t = 1: pair (0, 2) turns by 1 rad, pair (1, 3) by 0.01 rad.
// The angles are computed in Scalar, as transformers does for float: inv_freq = 1 / theta^(2i/hd)
// (scaled as rope_scaling says: model/rope_scaling.hpp), angle = t · inv_freq, then cos and sin (a
// table [seq_len, hd/2] made once).
//
//   kfsdp::nn::rotary_embedding<float> rope(/*heads=*/4, /*kv_heads=*/2, /*head_dim=*/16, /*seq_len=*/32);
//   rope.forward(qkv, y);    // both [rows, 128]
//   rope.backward(dy, dx);   // the inverse rotation; no parameters, nothing cached
//   rope.forward_at(next, y1, 20);   // one row at position 20 (generation)
// Conventions: see views.hpp.

#include <kfsdp/model/rope_scaling.hpp>
#include <kfsdp/nn/views.hpp>

#include <cstddef>

namespace kfsdp::nn {

template <class Scalar>
class rotary_embedding {
 public:
  using scalar_type = Scalar;

  // Throws std::invalid_argument for a zero size, an odd head_dim or theta <= 0.
  rotary_embedding(std::size_t heads, std::size_t kv_heads, std::size_t head_dim, std::size_t seq_len,
                   double theta = 10000.0, rope_scaling scaling = {});

  [[nodiscard]] std::size_t in_features() const noexcept { return (heads_ + 2 * kv_heads_) * head_dim_; }
  [[nodiscard]] std::size_t seq_len() const noexcept { return seq_len_; }
  // cos and sin of position t, pair i: the table the kernels read ([seq_len, head_dim / 2] each).
  [[nodiscard]] const_matrix<Scalar> cos_table() const noexcept { return cos_; }
  [[nodiscard]] const_matrix<Scalar> sin_table() const noexcept { return sin_; }

  // y [rows, in] = the rotated x; rows must be a multiple of seq_len.
  void forward(const_matrix<Scalar> x, matrix<Scalar> y) const;
  // y [rows, in] = the rotated x with row r at position first + r (generation: the positions after
  // those cached); throws std::invalid_argument when first + rows > seq_len.
  void forward_at(const_matrix<Scalar> x, matrix<Scalar> y, std::size_t first) const;
  // dx [rows, in] = the inverse rotation of dy (the rotation is orthogonal).
  void backward(const_matrix<Scalar> dy, matrix<Scalar> dx) const;

 private:
  void apply(const char* where, const_matrix<Scalar> in, matrix<Scalar> out, bool inverse) const;
  std::size_t heads_, kv_heads_, head_dim_, seq_len_;
  matrix<Scalar> cos_, sin_;
};

extern template class rotary_embedding<float>;
extern template class rotary_embedding<double>;

}  // namespace kfsdp::nn
