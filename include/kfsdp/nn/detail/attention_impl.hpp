#pragma once
// Definitions of kfsdp::nn::causal_self_attention; included by kernels/nn/attention.cpp.

#include <kfsdp/nn/attention.hpp>
#include <kfsdp/detail/kokkos_math.hpp>

#include <string>

namespace kfsdp::nn {

namespace detail {

// The shape every attention kernel works on, and where thread `index` = (b·heads + h)·seq + t
// finds its window b, head h, position t, its row of qkv and its q / k / v columns
// (nanoGPT's split: q | k | v along the last dim, head h at columns h·head_dim of each part).
template <class Scalar>
struct attention_layout {
  int windows, heads, seq, dim, head_dim;
  Scalar scale;  // 1 / sqrt(head_dim)

  attention_layout(std::size_t windows_, std::size_t heads_, std::size_t seq_, std::size_t dim_)
      : windows(int(windows_)), heads(int(heads_)), seq(int(seq_)), dim(int(dim_)),
        head_dim(int(dim_ / heads_)), scale(Scalar(1) / math::sqrt(Scalar(dim_ / heads_))) {
    // threads() and at() multiply in int: the whole (window, head, position) range must fit.
    check_int_extent("causal_self_attention", "the (window, head, position) range", "threads",
                     checked_mul(checked_mul(windows_, heads_, [] { return "causal_self_attention: threads"; }), seq_,
                                 [] { return "causal_self_attention: threads"; }));
    check_int_extent("causal_self_attention", "qkv", "columns", checked_mul(3, dim_, [] { return "causal_self_attention: qkv columns"; }));
  }

  struct place {
    int b, h, t, row, q_col, k_col, v_col;
  };
  [[nodiscard]] int threads() const { return windows * heads * seq; }
  KOKKOS_INLINE_FUNCTION place at(int index) const {
    const int t = index % seq, h = (index / seq) % heads, b = index / (seq * heads);
    return {b, h, t, b * seq + t, h * head_dim, dim + h * head_dim, 2 * dim + h * head_dim};
  }
};

// One thread per (window b, head h, query t): scores, softmax, weighted sum of values.
template <class Scalar>
void attention_forward(const_matrix<Scalar> qkv, matrix<Scalar> y, tensor4<Scalar> probs) {
  const attention_layout<Scalar> shape(probs.extent(0), probs.extent(1), probs.extent(2), y.extent(1));
  const int seq = shape.seq, head_dim = shape.head_dim;
  const Scalar scale = shape.scale;
  Kokkos::parallel_for(
      "kfsdp::nn::attention_forward", Kokkos::RangePolicy<execution_space>(0, shape.threads()),
      KOKKOS_LAMBDA(int index) {
        const auto [b, h, t, q_row, q_col, k_col, v_col] = shape.at(index);
        Scalar max_score = 0;
        for (int s = 0; s <= t; ++s) {
          Scalar score = 0;
          for (int c = 0; c < head_dim; ++c) score += qkv(q_row, q_col + c) * qkv(b * seq + s, k_col + c);
          score *= scale;
          probs(b, h, t, s) = score;
          if (s == 0 || score > max_score) max_score = score;
        }
        Scalar sum = 0;
        for (int s = 0; s <= t; ++s) {
          const Scalar e = math::exp(probs(b, h, t, s) - max_score);
          probs(b, h, t, s) = e;
          sum += e;
        }
        const Scalar inv_sum = Scalar(1) / sum;
        for (int s = 0; s <= t; ++s) probs(b, h, t, s) *= inv_sum;
        for (int s = t + 1; s < seq; ++s) probs(b, h, t, s) = 0;
        for (int c = 0; c < head_dim; ++c) {
          Scalar acc = 0;
          for (int s = 0; s <= t; ++s) acc += probs(b, h, t, s) * qkv(b * seq + s, v_col + c);
          y(q_row, q_col + c) = acc;
        }
      });
}

// Pass 1, one thread per query row (b, h, t): dscores and dq.
//   dp_ts = dy_t · v_s,  dscore_ts = p_ts (dp_ts − Σ_s' p_ts' dp_ts'),  dq_t = scale Σ_s dscore_ts k_s
template <class Scalar>
void attention_backward_queries(const_matrix<Scalar> qkv, const_matrix<Scalar> dy,
                                tensor4<const Scalar> probs, tensor4<Scalar> dscores,
                                matrix<Scalar> dqkv) {
  const attention_layout<Scalar> shape(probs.extent(0), probs.extent(1), probs.extent(2), dy.extent(1));
  const int seq = shape.seq, head_dim = shape.head_dim;
  const Scalar scale = shape.scale;
  Kokkos::parallel_for(
      "kfsdp::nn::attention_backward_queries", Kokkos::RangePolicy<execution_space>(0, shape.threads()),
      KOKKOS_LAMBDA(int index) {
        const auto [b, h, t, q_row, q_col, k_col, v_col] = shape.at(index);
        Scalar weighted = 0;
        for (int s = 0; s <= t; ++s) {
          Scalar dp = 0;
          for (int c = 0; c < head_dim; ++c) dp += dy(q_row, q_col + c) * qkv(b * seq + s, v_col + c);
          dscores(b, h, t, s) = dp;
          weighted += probs(b, h, t, s) * dp;
        }
        for (int s = 0; s <= t; ++s)
          dscores(b, h, t, s) = probs(b, h, t, s) * (dscores(b, h, t, s) - weighted);
        for (int c = 0; c < head_dim; ++c) {
          Scalar acc = 0;
          for (int s = 0; s <= t; ++s) acc += dscores(b, h, t, s) * qkv(b * seq + s, k_col + c);
          dqkv(q_row, q_col + c) = scale * acc;
        }
      });
}

// Pass 2, one thread per key row (b, h, s): dk_s = scale Σ_{t ≥ s} dscore_ts q_t, dv_s = Σ_{t ≥ s} p_ts dy_t.
template <class Scalar>
void attention_backward_keys(const_matrix<Scalar> qkv, const_matrix<Scalar> dy,
                             tensor4<const Scalar> probs, tensor4<const Scalar> dscores,
                             matrix<Scalar> dqkv) {
  const attention_layout<Scalar> shape(probs.extent(0), probs.extent(1), probs.extent(2), dy.extent(1));
  const int seq = shape.seq, head_dim = shape.head_dim;
  const Scalar scale = shape.scale;
  Kokkos::parallel_for(
      "kfsdp::nn::attention_backward_keys", Kokkos::RangePolicy<execution_space>(0, shape.threads()),
      KOKKOS_LAMBDA(int index) {
        // Here the thread's position is a key s (the same index layout).
        const auto [b, h, s, k_row, q_col, k_col, v_col] = shape.at(index);
        for (int c = 0; c < head_dim; ++c) {
          Scalar dk = 0, dv = 0;
          for (int t = s; t < seq; ++t) {
            dk += dscores(b, h, t, s) * qkv(b * seq + t, q_col + c);
            dv += probs(b, h, t, s) * dy(b * seq + t, q_col + c);
          }
          dqkv(k_row, k_col + c) = scale * dk;
          dqkv(k_row, v_col + c) = dv;
        }
      });
}

}  // namespace detail

template <class Scalar>
causal_self_attention<Scalar>::causal_self_attention(std::size_t dim, std::size_t heads,
                                                     std::size_t seq_len)
    : dim_(dim), heads_(heads), seq_len_(seq_len) {
  if (heads == 0 || dim % heads != 0)
    throw std::invalid_argument("causal_self_attention: heads = " + std::to_string(heads) +
                                " must divide dim = " + std::to_string(dim));
  if (seq_len == 0) throw std::invalid_argument("causal_self_attention: seq_len must be > 0");
  (void)checked_mul(3, dim, [] { return "causal_self_attention: in_features (3 · dim)"; });
  (void)detail::checked_numel("causal_self_attention", "a window's probabilities", {heads, seq_len, seq_len}, sizeof(Scalar));
}

template <class Scalar>
std::size_t causal_self_attention<Scalar>::windows(const char* where, std::size_t rows) const {
  if (rows % seq_len_ != 0)
    throw std::invalid_argument(std::string(where) + ": rows = " + std::to_string(rows) +
                                " is not a multiple of seq_len = " + std::to_string(seq_len_));
  return rows / seq_len_;
}

// [batch, heads, seq, seq], its element and byte counts checked before Kokkos multiplies them.
template <class Scalar>
tensor4<Scalar> causal_self_attention<Scalar>::make_scores(const char* where, const char* label, std::size_t batch,
                                                           bool initialize) const {
  (void)detail::checked_numel(where, label, {batch, heads_, seq_len_, seq_len_}, sizeof(Scalar));
  if (initialize) return tensor4<Scalar>(Kokkos::view_alloc(std::string(label)), batch, heads_, seq_len_, seq_len_);
  return tensor4<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), batch, heads_, seq_len_, seq_len_);
}

template <class Scalar>
typename causal_self_attention<Scalar>::cache causal_self_attention<Scalar>::make_cache(
    std::size_t rows) const {
  const char* where = "causal_self_attention::make_cache";
  cache c;
  c.probs = make_scores(where, "kfsdp::nn::attention::probs", windows(where, rows), true);
  return c;
}

template <class Scalar>
void causal_self_attention<Scalar>::forward(const params&, const_matrix<Scalar> qkv,
                                            matrix<Scalar> y, cache& c) const {
  const char* where = "causal_self_attention::forward";
  const std::size_t rows = qkv.extent(0);
  const std::size_t batch = windows(where, rows);
  detail::check_matrix(where, "qkv", qkv, rows, in_features());
  detail::check_matrix(where, "y", y, rows, dim_);
  if (c.probs.extent(0) != batch) c = make_cache(rows);
  detail::attention_forward<Scalar>(qkv, y, c.probs);
  c.qkv = qkv;
}

template <class Scalar>
void causal_self_attention<Scalar>::backward(const params&, const grads&, const cache& c,
                                             const_matrix<Scalar> dy, matrix<Scalar> dqkv) {
  const char* where = "causal_self_attention::backward";
  const std::size_t rows = c.qkv.extent(0);
  const std::size_t batch = windows(where, rows);
  detail::check_matrix(where, "cache.qkv", c.qkv, rows, in_features());
  if (c.probs.extent(0) != batch || c.probs.extent(1) != heads_ || c.probs.extent(2) != seq_len_)
    detail::throw_shape(where, "cache.probs",
                        detail::shape_string({c.probs.extent(0), c.probs.extent(1),
                                              c.probs.extent(2), c.probs.extent(3)}),
                        detail::shape_string({batch, heads_, seq_len_, seq_len_}));
  detail::check_matrix(where, "dy", dy, rows, dim_);
  detail::check_matrix(where, "dqkv", dqkv, rows, in_features());
  if (dscores_.extent(0) != batch) dscores_ = make_scores(where, "kfsdp::nn::attention::dscores", batch, false);
  detail::attention_backward_queries<Scalar>(c.qkv, dy, c.probs, dscores_, dqkv);
  detail::attention_backward_keys<Scalar>(c.qkv, dy, c.probs, dscores_, dqkv);
}

}  // namespace kfsdp::nn
