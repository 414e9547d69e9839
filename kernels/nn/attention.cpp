// kfsdp::nn::causal_self_attention: the kernel bodies and their explicit instantiations for float and double
// (the declarations are in include/kfsdp/nn/attention.hpp).

#include <kfsdp/detail/vector_for.hpp>
#include <kfsdp/nn/attention.hpp>
#include <kfsdp/detail/erf.hpp>
#include <kfsdp/detail/kokkos_math.hpp>
#include <kfsdp/nn/detail/gemm.hpp>

#include <string>

namespace kfsdp::nn {

namespace detail {

// The shape of the attention kernels: windows B, query heads H, key/value heads KV (H/KV query heads
// share one), positions T, head_dim hd, dim D = H·hd. The input row is [q (H·hd) | k (KV·hd) | v (KV·hd)].
// A head-major buffer holds parts split per head: heads(part, b·n + h, t, c) is column
// first_col + h·hd + c of row b·T + t, n being the part's head count (H for q, y; KV for k, v), so that
// every (part, window, head) is one contiguous row-major [T, hd] matrix for BLAS. Worked example,
// H = 2, KV = 1, hd = 2, T = 3 (row [q0 q0 q1 q1 | k0 k0 | v0 v0]):
//   qkv row 4 = (b 1, t 1), column 5 = k part (first_col 4), head 0, c 1  ->  heads(1, 1·1 + 0, 1, 1).
struct attention_shape {
  int windows, heads, kv_heads, seq, head_dim;

  attention_shape(std::size_t windows_, std::size_t heads_, std::size_t kv_heads_, std::size_t seq_, std::size_t head_dim_)
      : windows(int(windows_)), heads(int(heads_)), kv_heads(int(kv_heads_)), seq(int(seq_)), head_dim(int(head_dim_)) {
    // The kernels index in int: 3 parts (q, k, v) × the (window, head, position) range must fit.
    const auto what = [] { return "causal_self_attention: (part, window, head, position) range"; };
    check_int_extent("causal_self_attention", "the (part, window, head, position) range", "threads",
                     checked_mul(checked_mul(checked_mul(3, windows_, what), heads_, what), seq_, what));
  }
  [[nodiscard]] int score_rows() const { return windows * heads * seq; }
  [[nodiscard]] int group() const { return heads / kv_heads; }  // query heads per key/value head
};

// One thread per (row, head) copies a run of head_dim contiguous elements either way between the
// columns first_col .. first_col + nheads·hd of rows [B·T, *] and the head-major heads(part, b·nheads + h, t, 0 .. hd).
template <class Scalar, bool to_heads, class Rows, class Heads>
void copy_heads(const char* label, const attention_shape& shape, const Rows& rows, const Heads& heads, int part,
                int first_col, int nheads) {
  const int seq = shape.seq, head_dim = shape.head_dim;
  kfsdp::detail::vector_for<execution_space>(
      label, std::int64_t(rows.extent(0)) * nheads, KOKKOS_LAMBDA(std::int64_t index) {
        const int row = int(index / nheads), h = int(index % nheads);
        const int b = row / seq, t = row % seq;
        Scalar* head_row = &heads(part, b * nheads + h, t, 0);
        auto* run = &rows(row, first_col + h * head_dim);  // (taken outside the if constexpr, which nvcc's device lambdas require)
        if constexpr (to_heads)
          for (int c = 0; c < head_dim; ++c) head_row[c] = run[c];
        else
          for (int c = 0; c < head_dim; ++c) run[c] = head_row[c];
      });
}

// heads(part, ...) = the per-head split of nheads heads of rows [B·T, *] from column first_col.
template <class Scalar>
void split_heads(const attention_shape& shape, const_matrix<Scalar> rows, tensor4<Scalar> heads, int part, int first_col,
                 int nheads) {
  copy_heads<Scalar, true>("kfsdp::nn::attention_split_heads", shape, rows, heads, part, first_col, nheads);
}

// The inverse of split_heads.
template <class Scalar>
void merge_heads(const attention_shape& shape, tensor4<Scalar> heads, int part, matrix<Scalar> rows, int first_col,
                 int nheads) {
  copy_heads<Scalar, false>("kfsdp::nn::attention_merge_heads", shape, rows, heads, part, first_col, nheads);
}

// One thread per score row (b, h, t): softmax over the keys s <= t in place, 0 above the diagonal.
template <class Scalar>
void causal_softmax_rows(const attention_shape& shape, tensor4<Scalar> scores) {
  const int seq = shape.seq, nheads = shape.heads;
  kfsdp::detail::vector_for<execution_space>(
      "kfsdp::nn::attention_causal_softmax", shape.score_rows(), KOKKOS_LAMBDA(std::int64_t index) {
        const int t = int(index % seq), h = int((index / seq) % nheads), b = int(index / (seq * nheads));
        Scalar* row = &scores(b, h, t, 0);
        Scalar max_score = row[0];
        for (int s = 1; s <= t; ++s) max_score = row[s] > max_score ? row[s] : max_score;
        // score − max ≤ 0 exactly; fast_exp_nonpositive vectorises where libm's exp does not.
        for (int s = 0; s <= t; ++s) row[s] = math::fast_exp_nonpositive(row[s] - max_score);
        const Scalar sum = kfsdp::detail::lane_sum<Scalar>(t + 1, [&](int s) { return row[s]; });
        const Scalar inv_sum = Scalar(1) / sum;
        for (int s = 0; s <= t; ++s) row[s] *= inv_sum;
        for (int s = t + 1; s < seq; ++s) row[s] = 0;
      });
}

// One thread per score row (b, h, t), dp = dy_t · v_s in, dscore out:
//   dscore_ts = p_ts (dp_ts − Σ_{s' <= t} p_ts' dp_ts') for s <= t, 0 above the diagonal.
template <class Scalar>
void softmax_backward_rows(const attention_shape& shape, tensor4<const Scalar> probs, tensor4<Scalar> dscores) {
  const int seq = shape.seq, nheads = shape.heads;
  kfsdp::detail::vector_for<execution_space>(
      "kfsdp::nn::attention_softmax_backward", shape.score_rows(), KOKKOS_LAMBDA(std::int64_t index) {
        const int t = int(index % seq), h = int((index / seq) % nheads), b = int(index / (seq * nheads));
        const Scalar* p = &probs(b, h, t, 0);
        Scalar* d = &dscores(b, h, t, 0);
        const Scalar weighted = kfsdp::detail::lane_sum<Scalar>(t + 1, [&](int s) { return p[s] * d[s]; });
        for (int s = 0; s <= t; ++s) d[s] = p[s] * (d[s] - weighted);
        for (int s = t + 1; s < seq; ++s) d[s] = 0;
      });
}

// The [T, hd] or [T, T] matrix of one (part or window, head) of a head-major buffer: contiguous, row-major.
template <class Scalar>
matrix<Scalar> block(const tensor4<Scalar>& t, int first, int second) {
  return Kokkos::subview(t, first, second, Kokkos::ALL, Kokkos::ALL);
}


// Blocked method. A run of `count` rows from `first` of one (part, window·head) of a head-major buffer:
// contiguous, row-major [count, hd] (pointer arithmetic, not operator(): valid in any memory space).
template <class Scalar>
matrix<Scalar> head_rows(const tensor4<Scalar>& t, int part, int window_head, int first, int count) {
  const std::size_t offset = ((std::size_t(part) * t.extent(1) + std::size_t(window_head)) * t.extent(2) + std::size_t(first)) *
                             t.extent(3);
  return matrix<Scalar>(t.data() + offset, std::size_t(count), t.extent(3));
}

// The blocks of one query or key range: [first, first + count) of T, 64 at a time, the last shorter.
struct attention_block_range {
  int first, count;
};
inline attention_block_range block_range(int index, int seq) {
  const int first = index * int(attention_block);
  return {first, seq - first < int(attention_block) ? seq - first : int(attention_block)};
}

// One thread per query row r of block (i, j) of one (window, head), scores [bq, bk] = scale · q kᵀ in:
// the online softmax's step. The row's running max m and sum l take in keys c <= last (last = r on
// the diagonal block, where key c is query c), scores becomes exp(score − m_new) (0 past last), and
// the output rows accumulated so far are rescaled by exp(m_old − m_new) (first: nothing yet).
template <class Scalar>
void online_softmax_block(matrix<Scalar> scores, vector<Scalar> running_max, vector<Scalar> running_sum,
                          matrix<Scalar> out, bool diagonal, bool first) {
  const int keys = int(scores.extent(1)), head_dim = int(out.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::attention_online_softmax", Kokkos::RangePolicy<execution_space>(0, int(scores.extent(0))),
      KOKKOS_LAMBDA(int r) {
        const int last = diagonal ? r : keys - 1;
        Scalar max_score = first ? scores(r, 0) : running_max(r);
        for (int c = 0; c <= last; ++c) max_score = scores(r, c) > max_score ? scores(r, c) : max_score;
        Scalar sum = 0;
        for (int c = 0; c <= last; ++c) {
          const Scalar e = math::exp(scores(r, c) - max_score);
          scores(r, c) = e;
          sum += e;
        }
        for (int c = last + 1; c < keys; ++c) scores(r, c) = 0;
        if (first) {
          running_sum(r) = sum;
        } else {
          const Scalar rescale = math::exp(running_max(r) - max_score);
          running_sum(r) = running_sum(r) * rescale + sum;
          for (int c = 0; c < head_dim; ++c) out(r, c) *= rescale;
        }
        running_max(r) = max_score;
      });
}

// One thread per query row of a finished query block: y /= l, logsumexp = m + log l.
template <class Scalar>
void finish_query_block(vector<Scalar> running_max, vector<Scalar> running_sum, matrix<Scalar> out,
                        Scalar* logsumexp) {
  const int head_dim = int(out.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::attention_finish_rows", Kokkos::RangePolicy<execution_space>(0, int(out.extent(0))), KOKKOS_LAMBDA(int r) {
        const Scalar inv_sum = Scalar(1) / running_sum(r);
        for (int c = 0; c < head_dim; ++c) out(r, c) *= inv_sum;
        logsumexp[r] = running_max(r) + math::log(running_sum(r));
      });
}

// One thread per query row r of block (i, j), scores = scale · q kᵀ and dp = dy vᵀ in: the
// probabilities recomputed from the row's logsumexp, P = exp(score − L) (0 past the diagonal) in
// scores, and dS = P ∘ (dP − D) in dp.
template <class Scalar>
void recompute_block_gradient(matrix<Scalar> scores, matrix<Scalar> dp, const Scalar* logsumexp, const Scalar* delta,
                              bool diagonal) {
  const int keys = int(scores.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::attention_block_gradient", Kokkos::RangePolicy<execution_space>(0, int(scores.extent(0))),
      KOKKOS_LAMBDA(int r) {
        const int last = diagonal ? r : keys - 1;
        const Scalar row_logsumexp = logsumexp[r], row_delta = delta[r];
        for (int c = 0; c <= last; ++c) {
          const Scalar p = math::exp(scores(r, c) - row_logsumexp);
          scores(r, c) = p;
          dp(r, c) = p * (dp(r, c) - row_delta);
        }
        for (int c = last + 1; c < keys; ++c) scores(r, c) = dp(r, c) = 0;
      });
}

// One thread per (row, head): delta(b·H + h, t) = Σ_c dy · y over the head's columns (= Σ_s P_ts dP_ts).
template <class Scalar>
void row_deltas(const attention_shape& shape, const_matrix<Scalar> dy, const_matrix<Scalar> y, matrix<Scalar> delta) {
  const int seq = shape.seq, nheads = shape.heads, head_dim = shape.head_dim;
  Kokkos::parallel_for(
      "kfsdp::nn::attention_row_deltas", Kokkos::RangePolicy<execution_space>(0, int(dy.extent(0)) * nheads),
      KOKKOS_LAMBDA(int index) {
        const int row = index / nheads, h = index % nheads;
        Scalar sum = 0;
        for (int c = h * head_dim; c < (h + 1) * head_dim; ++c) sum += dy(row, c) * y(row, c);
        delta((row / seq) * nheads + h, row % seq) = sum;
      });
}

}  // namespace detail

template <class Scalar>
causal_self_attention<Scalar>::causal_self_attention(std::size_t dim, std::size_t heads, std::size_t seq_len)
    : causal_self_attention(dim, heads, seq_len, heads) {}

template <class Scalar>
causal_self_attention<Scalar>::causal_self_attention(std::size_t dim, std::size_t heads, std::size_t seq_len,
                                                     std::size_t kv_heads, attention_method method)
    : dim_(dim),
      heads_(heads),
      kv_heads_(kv_heads),
      seq_len_(seq_len),
      method_(method != attention_method::automatic ? method
              : seq_len >= blocked_from_seq_len     ? attention_method::blocked
                                                    : attention_method::whole) {
  if (heads == 0 || dim % heads != 0)
    throw std::invalid_argument("causal_self_attention: heads = " + std::to_string(heads) +
                                " must divide dim = " + std::to_string(dim));
  if (kv_heads == 0 || heads % kv_heads != 0)
    throw std::invalid_argument("causal_self_attention: kv_heads = " + std::to_string(kv_heads) +
                                " must divide heads = " + std::to_string(heads));
  if (seq_len == 0) throw std::invalid_argument("causal_self_attention: seq_len must be > 0");
  const auto what = [] { return "causal_self_attention: in_features ((heads + 2 · kv_heads) · head_dim)"; };
  in_features_ = checked_mul(checked_add(heads, checked_mul(2, kv_heads, what), what), dim / heads, what);
  detail::check_int_extent("causal_self_attention", "qkv", "columns", in_features_);
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
  const std::size_t batch = windows(where, rows);
  if (method_ == attention_method::whole) {
    c.probs = make_scores(where, "kfsdp::nn::attention::probs", batch, true);
  } else {
    const std::size_t window_heads = checked_mul(batch, heads_, [&] { return std::string(where) + ": logsumexp windows · heads"; });
    (void)detail::checked_numel(where, "logsumexp", {window_heads, seq_len_}, sizeof(Scalar));
    c.logsumexp = matrix<Scalar>(Kokkos::view_alloc(std::string("kfsdp::nn::attention::logsumexp")), window_heads, seq_len_);
  }
  return c;
}

template <class Scalar>
bool causal_self_attention<Scalar>::cache_fits(const cache& c, std::size_t batch) const {
  if (method_ == attention_method::whole)
    return c.probs.extent(0) == batch && c.probs.extent(1) == heads_ && c.probs.extent(2) == seq_len_;
  return c.logsumexp.extent(0) == batch * heads_ && c.logsumexp.extent(1) == seq_len_;
}

// Two blocks' scores and one block's running max and sum.
template <class Scalar>
void causal_self_attention<Scalar>::ensure_block_scratch() const {
  constexpr std::size_t size = 2 * attention_block * attention_block + 2 * attention_block;
  if (block_scratch_.extent(0) != size)
    block_scratch_ = vector<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfsdp::nn::attention::blocks")), size);
}

// [parts, B·H, T, hd]: `parts` head-major matrices per (window, head), allocated once per batch size.
template <class Scalar>
void causal_self_attention<Scalar>::ensure_heads(const char* where, const char* label, tensor4<Scalar>& heads,
                                                 std::size_t parts, std::size_t batch) const {
  const std::size_t window_heads = checked_mul(batch, heads_, [&] { return std::string(where) + ": " + label + " windows · heads"; });
  if (heads.extent(0) == parts && heads.extent(1) == window_heads) return;
  (void)detail::checked_numel(where, label, {parts, window_heads, seq_len_, head_dim()}, sizeof(Scalar));
  heads = tensor4<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), parts, window_heads,
                          seq_len_, head_dim());
}

// Per (window b, head h), with the head-major parts q, k, v, y of heads_:
//   probs(b, h) = causal_softmax(scale · q kᵀ)   [T, T], a GEMM then a kernel over the rows
//   y           = probs(b, h) · v                 [T, hd], a GEMM (the zeros above the diagonal add nothing)
template <class Scalar>
void causal_self_attention<Scalar>::forward(const params&, const_matrix<Scalar> qkv,
                                            matrix<Scalar> y, cache& c) const {
  const char* where = "causal_self_attention::forward";
  const std::size_t rows = qkv.extent(0);
  const std::size_t batch = windows(where, rows);
  detail::check_matrix(where, "qkv", qkv, rows, in_features());
  detail::check_matrix(where, "y", y, rows, dim_);
  if (!cache_fits(c, batch)) c = make_cache(rows);
  c.qkv = qkv;
  c.y = y;
  if (rows == 0) return;
  if (method_ == attention_method::blocked) return forward_blocked(qkv, y, c, batch);
  const detail::attention_shape shape(batch, heads_, kv_heads_, seq_len_, head_dim());
  constexpr int q = 0, k = 1, v = 2, out = 3;
  const int H = shape.heads, KV = shape.kv_heads, hd = shape.head_dim;
  ensure_heads(where, "kfsdp::nn::attention::heads", heads_scratch_, 4, batch);
  detail::split_heads<Scalar>(shape, qkv, heads_scratch_, q, 0, H);
  detail::split_heads<Scalar>(shape, qkv, heads_scratch_, k, H * hd, KV);
  detail::split_heads<Scalar>(shape, qkv, heads_scratch_, v, (H + KV) * hd, KV);
  const Scalar scale = Scalar(1) / math::sqrt(Scalar(hd));
  // Query head h reads key/value head h / group (transformers' repeat_kv).
  for (int b = 0; b < shape.windows; ++b)
    for (int h = 0; h < H; ++h) {
      const int bh = b * H + h, bg = b * KV + h / shape.group();
      detail::gemm<Scalar>("N", "T", scale, detail::block(heads_scratch_, q, bh), detail::block(heads_scratch_, k, bg),
                           Scalar(0), detail::block(c.probs, b, h));
    }
  detail::causal_softmax_rows<Scalar>(shape, c.probs);
  for (int b = 0; b < shape.windows; ++b)
    for (int h = 0; h < H; ++h) {
      const int bh = b * H + h, bg = b * KV + h / shape.group();
      detail::gemm<Scalar>("N", "N", Scalar(1), detail::block(c.probs, b, h), detail::block(heads_scratch_, v, bg),
                           Scalar(0), detail::block(heads_scratch_, out, bh));
    }
  detail::merge_heads<Scalar>(shape, heads_scratch_, out, y, 0, H);
}

// Per (window b, head h), P = probs(b, h), with q, k, v, dy split per head:
//   dP = dy vᵀ,  dS = P ∘ (dP − rowsum(P ∘ dP)) (a kernel over the rows),
//   dq = scale · dS k,  dk = scale · dSᵀ q,  dv = Pᵀ dy   (GEMMs; no atomics, no shared writes)
// A key/value head's dk and dv sum over the query heads of its group, in order (beta 1 after the first).
template <class Scalar>
void causal_self_attention<Scalar>::backward(const params&, const grads&, const cache& c,
                                             const_matrix<Scalar> dy, matrix<Scalar> dqkv) {
  const char* where = "causal_self_attention::backward";
  const std::size_t rows = c.qkv.extent(0);
  const std::size_t batch = windows(where, rows);
  detail::check_matrix(where, "cache.qkv", c.qkv, rows, in_features());
  if (method_ == attention_method::blocked) {
    detail::check_matrix(where, "cache.y", c.y, rows, dim_);
    if (!cache_fits(c, batch))
      detail::throw_shape(where, "cache.logsumexp", detail::shape_string(c.logsumexp.extent(0), c.logsumexp.extent(1)),
                          detail::shape_string(batch * heads_, seq_len_));
  } else if (!cache_fits(c, batch)) {
    detail::throw_shape(where, "cache.probs",
                        detail::shape_string({c.probs.extent(0), c.probs.extent(1),
                                              c.probs.extent(2), c.probs.extent(3)}),
                        detail::shape_string({batch, heads_, seq_len_, seq_len_}));
  }
  detail::check_matrix(where, "dy", dy, rows, dim_);
  detail::check_matrix(where, "dqkv", dqkv, rows, in_features());
  if (rows == 0) return;
  if (method_ == attention_method::blocked) return backward_blocked(c, dy, dqkv, batch);
  const detail::attention_shape shape(batch, heads_, kv_heads_, seq_len_, head_dim());
  const int H = shape.heads, KV = shape.kv_heads, hd = shape.head_dim;
  if (dscores_.extent(0) != batch) dscores_ = make_scores(where, "kfsdp::nn::attention::dscores", batch, false);
  // Inputs q, k, v, dy in heads_scratch_ (split again: another forward may have run since), outputs in grad_heads_.
  constexpr int q = 0, k = 1, v = 2, dy_part = 3, dq = 0, dk = 1, dv = 2;
  ensure_heads(where, "kfsdp::nn::attention::heads", heads_scratch_, 4, batch);
  ensure_heads(where, "kfsdp::nn::attention::grad_heads", grad_heads_, 3, batch);
  detail::split_heads<Scalar>(shape, c.qkv, heads_scratch_, q, 0, H);
  detail::split_heads<Scalar>(shape, c.qkv, heads_scratch_, k, H * hd, KV);
  detail::split_heads<Scalar>(shape, c.qkv, heads_scratch_, v, (H + KV) * hd, KV);
  detail::split_heads<Scalar>(shape, dy, heads_scratch_, dy_part, 0, H);
  const Scalar scale = Scalar(1) / math::sqrt(Scalar(hd));
  for (int b = 0; b < shape.windows; ++b)
    for (int h = 0; h < H; ++h) {
      const int bh = b * H + h, bg = b * KV + h / shape.group();
      detail::gemm<Scalar>("N", "T", Scalar(1), detail::block(heads_scratch_, dy_part, bh),
                           detail::block(heads_scratch_, v, bg), Scalar(0), detail::block(dscores_, b, h));
    }
  detail::softmax_backward_rows<Scalar>(shape, c.probs, dscores_);
  for (int b = 0; b < shape.windows; ++b)
    for (int h = 0; h < H; ++h) {
      const int bh = b * H + h, bg = b * KV + h / shape.group();
      const Scalar first_of_group = h % shape.group() == 0 ? Scalar(0) : Scalar(1);  // beta: overwrite, then add
      const const_matrix<Scalar> probs = detail::block(c.probs, b, h), dscores = detail::block(dscores_, b, h);
      detail::gemm<Scalar>("N", "N", scale, dscores, detail::block(heads_scratch_, k, bg), Scalar(0),
                           detail::block(grad_heads_, dq, bh));
      detail::gemm<Scalar>("T", "N", scale, dscores, detail::block(heads_scratch_, q, bh), first_of_group,
                           detail::block(grad_heads_, dk, bg));
      detail::gemm<Scalar>("T", "N", Scalar(1), probs, detail::block(heads_scratch_, dy_part, bh), first_of_group,
                           detail::block(grad_heads_, dv, bg));
    }
  detail::merge_heads<Scalar>(shape, grad_heads_, dq, dqkv, 0, H);
  detail::merge_heads<Scalar>(shape, grad_heads_, dk, dqkv, H * hd, KV);
  detail::merge_heads<Scalar>(shape, grad_heads_, dv, dqkv, (H + KV) * hd, KV);
}

// Per (window b, head h) and query block i, over the key blocks j <= i (those above the diagonal are
// all masked): S = scale · q_i k_jᵀ (GEMM), the online softmax's step on S's rows (a kernel), then
// y_i += P v_j (GEMM, beta 1 after the first block). Finally y_i /= l and logsumexp_i = m + log l.
template <class Scalar>
void causal_self_attention<Scalar>::forward_blocked(const_matrix<Scalar> qkv, matrix<Scalar> y, cache& c,
                                                    std::size_t batch) const {
  const char* where = "causal_self_attention::forward";
  const detail::attention_shape shape(batch, heads_, kv_heads_, seq_len_, head_dim());
  constexpr int q = 0, k = 1, v = 2, out = 3;
  const int H = shape.heads, KV = shape.kv_heads, hd = shape.head_dim, T = shape.seq;
  const int blocks = int((seq_len_ + attention_block - 1) / attention_block);
  ensure_heads(where, "kfsdp::nn::attention::heads", heads_scratch_, 4, batch);
  ensure_block_scratch();
  detail::split_heads<Scalar>(shape, qkv, heads_scratch_, q, 0, H);
  detail::split_heads<Scalar>(shape, qkv, heads_scratch_, k, H * hd, KV);
  detail::split_heads<Scalar>(shape, qkv, heads_scratch_, v, (H + KV) * hd, KV);
  const Scalar scale = Scalar(1) / math::sqrt(Scalar(hd));
  Scalar* const scratch = block_scratch_.data();
  const vector<Scalar> running_max(scratch + 2 * attention_block * attention_block, attention_block);
  const vector<Scalar> running_sum(scratch + 2 * attention_block * attention_block + attention_block, attention_block);
  for (int b = 0; b < shape.windows; ++b)
    for (int h = 0; h < H; ++h) {
      const int bh = b * H + h, bg = b * KV + h / shape.group();
      for (int i = 0; i < blocks; ++i) {
        const auto [q0, bq] = detail::block_range(i, T);
        const matrix<Scalar> q_block = detail::head_rows(heads_scratch_, q, bh, q0, bq);
        const matrix<Scalar> out_block = detail::head_rows(heads_scratch_, out, bh, q0, bq);
        for (int j = 0; j <= i; ++j) {
          const auto [k0, bk] = detail::block_range(j, T);
          const matrix<Scalar> scores(scratch, std::size_t(bq), std::size_t(bk));
          detail::gemm<Scalar>("N", "T", scale, q_block, detail::head_rows(heads_scratch_, k, bg, k0, bk), Scalar(0), scores);
          detail::online_softmax_block<Scalar>(scores, running_max, running_sum, out_block, i == j, j == 0);
          detail::gemm<Scalar>("N", "N", Scalar(1), scores, detail::head_rows(heads_scratch_, v, bg, k0, bk),
                               j == 0 ? Scalar(0) : Scalar(1), out_block);
        }
        detail::finish_query_block<Scalar>(running_max, running_sum, out_block,
                                           c.logsumexp.data() + std::size_t(bh) * seq_len_ + std::size_t(q0));
      }
    }
  detail::merge_heads<Scalar>(shape, heads_scratch_, out, y, 0, H);
}

// FlashAttention-2's backward per (window b, head h), key block j, query block i >= j, the
// probabilities recomputed from the logsumexp L and D = rowsum(dy ∘ y) computed once per row:
//   S = scale · q_i k_jᵀ,  dP = dy_i v_jᵀ  (GEMMs);  P = exp(S − L),  dS = P ∘ (dP − D)  (a kernel)
//   dv_j += Pᵀ dy_i,  dq_i += scale · dS k_j,  dk_j += scale · dSᵀ q_i  (GEMMs; beta 0 on the first)
// A key/value head's dk and dv sum over the query heads of its group, in order.
template <class Scalar>
void causal_self_attention<Scalar>::backward_blocked(const cache& c, const_matrix<Scalar> dy, matrix<Scalar> dqkv,
                                                     std::size_t batch) {
  const char* where = "causal_self_attention::backward";
  const detail::attention_shape shape(batch, heads_, kv_heads_, seq_len_, head_dim());
  const int H = shape.heads, KV = shape.kv_heads, hd = shape.head_dim, T = shape.seq;
  const int blocks = int((seq_len_ + attention_block - 1) / attention_block);
  constexpr int q = 0, k = 1, v = 2, dy_part = 3, dq = 0, dk = 1, dv = 2;
  ensure_heads(where, "kfsdp::nn::attention::heads", heads_scratch_, 4, batch);
  ensure_heads(where, "kfsdp::nn::attention::grad_heads", grad_heads_, 3, batch);
  ensure_block_scratch();
  if (row_delta_.extent(0) != batch * heads_ || row_delta_.extent(1) != seq_len_)
    row_delta_ = matrix<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfsdp::nn::attention::row_delta")),
                                batch * heads_, seq_len_);
  detail::split_heads<Scalar>(shape, c.qkv, heads_scratch_, q, 0, H);
  detail::split_heads<Scalar>(shape, c.qkv, heads_scratch_, k, H * hd, KV);
  detail::split_heads<Scalar>(shape, c.qkv, heads_scratch_, v, (H + KV) * hd, KV);
  detail::split_heads<Scalar>(shape, dy, heads_scratch_, dy_part, 0, H);
  detail::row_deltas<Scalar>(shape, dy, c.y, row_delta_);
  const Scalar scale = Scalar(1) / math::sqrt(Scalar(hd));
  Scalar* const scratch = block_scratch_.data();
  for (int b = 0; b < shape.windows; ++b)
    for (int h = 0; h < H; ++h) {
      const int bh = b * H + h, bg = b * KV + h / shape.group();
      const bool first_of_group = h % shape.group() == 0;
      for (int j = 0; j < blocks; ++j) {
        const auto [k0, bk] = detail::block_range(j, T);
        const matrix<Scalar> k_block = detail::head_rows(heads_scratch_, k, bg, k0, bk);
        const matrix<Scalar> v_block = detail::head_rows(heads_scratch_, v, bg, k0, bk);
        const matrix<Scalar> dk_block = detail::head_rows(grad_heads_, dk, bg, k0, bk);
        const matrix<Scalar> dv_block = detail::head_rows(grad_heads_, dv, bg, k0, bk);
        for (int i = j; i < blocks; ++i) {
          const auto [q0, bq] = detail::block_range(i, T);
          const matrix<Scalar> q_block = detail::head_rows(heads_scratch_, q, bh, q0, bq);
          const matrix<Scalar> dy_block = detail::head_rows(heads_scratch_, dy_part, bh, q0, bq);
          const matrix<Scalar> probs(scratch, std::size_t(bq), std::size_t(bk));
          const matrix<Scalar> dscores(scratch + attention_block * attention_block, std::size_t(bq), std::size_t(bk));
          detail::gemm<Scalar>("N", "T", scale, q_block, k_block, Scalar(0), probs);
          detail::gemm<Scalar>("N", "T", Scalar(1), dy_block, v_block, Scalar(0), dscores);
          const std::size_t row = std::size_t(bh) * seq_len_ + std::size_t(q0);
          detail::recompute_block_gradient<Scalar>(probs, dscores, c.logsumexp.data() + row, row_delta_.data() + row, i == j);
          const Scalar key_beta = i == j && first_of_group ? Scalar(0) : Scalar(1);  // overwrite, then add
          detail::gemm<Scalar>("T", "N", Scalar(1), probs, dy_block, key_beta, dv_block);
          detail::gemm<Scalar>("N", "N", scale, dscores, k_block, j == 0 ? Scalar(0) : Scalar(1),
                               detail::head_rows(grad_heads_, dq, bh, q0, bq));
          detail::gemm<Scalar>("T", "N", scale, dscores, q_block, key_beta, dk_block);
        }
      }
    }
  detail::merge_heads<Scalar>(shape, grad_heads_, dq, dqkv, 0, H);
  detail::merge_heads<Scalar>(shape, grad_heads_, dk, dqkv, H * hd, KV);
  detail::merge_heads<Scalar>(shape, grad_heads_, dv, dqkv, (H + KV) * hd, KV);
}

template class causal_self_attention<float>;
template class causal_self_attention<double>;
}  // namespace kfsdp::nn
