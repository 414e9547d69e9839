#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::kv_cache — the keys and values of every attention layer for the positions generated so far,
// so that a generation step runs each layer on the new token's row alone. A network's forward given a
// cache (pass_context::cache; predictor::predict_cached) is a cached step: its rows are the tokens at
// positions cache.positions() onward, each layer with a cached form (cached_forward below) computes
// at those positions over the cache, and every other layer (linears, norms, the MLP) is row-wise and
// runs as in training, on those rows only.
//
//   prefill:  ids [P]  -> rows 0 .. P-1: RoPE at 0 .. P-1, k, v stored at 0 .. P-1, P query rows
//   step:     ids [1]  -> row  P:        RoPE at P, k, v stored at P, one query over 0 .. P
//
//   kfsdp::kv_cache<float> cache(config.seq);                 // max_position_embeddings
//   auto logits = model.predict_cached(prompt_ids, cache);    // [P, vocab]; cache.positions() == P
//   auto next = model.predict_cached(one_id, cache);          // [1, vocab]; cache.positions() == P + 1

#include <kfsdp/compute/ops.hpp>
#include <kfsdp/nn/cached_attention.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace kfsdp {

KFSDP_EXPORT template <class Scalar>
class kv_cache {
 public:
  // Throws std::invalid_argument for max_positions 0. Each attention layer's buffers
  // [max_positions, kv_heads · head_dim] (twice) are made at its first step.
  explicit kv_cache(std::size_t max_positions) : max_positions_(max_positions) {
    if (max_positions == 0) throw std::invalid_argument("kfsdp::kv_cache: max_positions is 0, expected at least 1");
  }

  /// Positions whose keys and values are held: the next step's rows start there.
  [[nodiscard]] std::size_t positions() const noexcept { return positions_; }
  [[nodiscard]] std::size_t max_positions() const noexcept { return max_positions_; }
  /// Forgets the positions (a new sequence); the buffers stay.
  void clear() noexcept { positions_ = 0; }
  /// Bytes of keys and values allocated.
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& layer : layers_) total += layer.bytes();
    return total;
  }

  // --- a cached step (the network's side) ---
  // Starts a step of `rows` tokens at positions(); throws when they pass max_positions.
  void begin_step(std::size_t rows) {
    if (rows > max_positions_ - positions_)
      throw std::invalid_argument("kfsdp::kv_cache: a step of " + std::to_string(rows) + " tokens at position " +
                                  std::to_string(positions_) + " reaches position " + std::to_string(positions_ + rows) +
                                  ", expected at most max_positions = " + std::to_string(max_positions_));
    step_rows_ = rows;
    next_layer_ = 0;
  }
  // The step's rows are cached: the next step starts after them.
  void end_step() noexcept { positions_ += step_rows_; }
  // The cache of the step's next attention layer (layers come in forward order), made at the first step.
  nn::cached_attention<Scalar>& next_attention(std::size_t heads, std::size_t kv_heads, std::size_t head_dim) {
    if (next_layer_ == layers_.size()) layers_.emplace_back(heads, kv_heads, head_dim, max_positions_);
    nn::cached_attention<Scalar>& layer = layers_[next_layer_];
    if (layer.in_features() != (heads + 2 * kv_heads) * head_dim || layer.out_features() != heads * head_dim)
      throw std::invalid_argument("kfsdp::kv_cache: attention layer " + std::to_string(next_layer_) + " takes " +
                                  std::to_string((heads + 2 * kv_heads) * head_dim) + " features, its cache " +
                                  std::to_string(layer.in_features()) + " (a cache of another model: clear() keeps the shapes)");
    ++next_layer_;
    return layer;
  }

 private:
  std::size_t max_positions_;
  std::size_t positions_ = 0;
  std::size_t step_rows_ = 0;
  std::size_t next_layer_ = 0;
  std::vector<nn::cached_attention<Scalar>> layers_;
};

// How a layer's compute runs in a cached step, for the layers whose output depends on a row's
// position: a specialization with
//   static void forward(Op&, const layer_params<const S>&, nn::const_matrix<S> x, nn::matrix<S> y, kv_cache<S>&);
// Every other compute runs its own forward (a row-wise layer needs no position).
template <class Op>
struct cached_forward {};

template <class S>
struct cached_forward<rotary_op<S>> {
  static void forward(rotary_op<S>& op, const layer_params<const S>&, nn::const_matrix<S> x, nn::matrix<S> y, kv_cache<S>& cache) {
    op.kernel.forward_at(x, y, cache.positions());
  }
};

template <class S>
struct cached_forward<attention_op<S>> {
  static void forward(attention_op<S>& op, const layer_params<const S>&, nn::const_matrix<S> x, nn::matrix<S> y,
                      kv_cache<S>& cache) {
    cache.next_attention(op.kernel.heads(), op.kernel.kv_heads(), op.kernel.head_dim()).forward(x, y, cache.positions());
  }
};

// Learned positions (the GPT's) would need the row's position too: refused rather than computed wrong.
template <class S>
struct cached_forward<positional_embedding_op<S>> {
  static void forward(positional_embedding_op<S>&, const layer_params<const S>&, nn::const_matrix<S>, nn::matrix<S>, kv_cache<S>&) {
    throw std::invalid_argument("kfsdp::kv_cache: positional_embedding has no cached step (generation with a cache needs RoPE)");
  }
};

}  // namespace kfsdp
