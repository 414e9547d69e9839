#pragma once
// The fused Kokkos kernels of a row-wise expression (expr/expression.hpp): forward and backward
// derived from the one expression, for any execution space.
//
//   forward   one kernel over rows: each reduction and row value in a sweep of the row (inner
//             first; a reduction written twice, as mean(x) in a layer norm, computed once), then
//             the output columns; the reductions are kept ([rows, N] values, and where a max is)
//   backward  kernel 1 over blocks of 16 rows, per row: sweep 1 takes each output column's adjoint
//             down the expression to what reaches every reduction (and, for nested reductions,
//             what an inner one gives an outer one); sweep 2 takes the adjoints to the input row
//             (dx) and to the block's parameter column sums, one leaf a loop
//             kernel 2 over parameter elements: the blocks' sums added in order (no atomics: the
//             same bits on every backend and thread count)
// An expression with no reduction, no parameter and as wide as its input runs as one flat loop
// over every element. Every loop is written to vectorise: the tape of a column is one aggregate
// filled in place, row values are hoisted out of column loops, and sums run in interleaved lanes.
//
// bench_derived (f32, [512, 128] and [512, 512]) times these against the hand-written kernels
// they replace: docs/performance.md.

#include <kfsdp/detail/vector_for.hpp>
#include <kfsdp/expr/expression.hpp>
#include <kfsdp/nn/views.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace kfsdp::expr {

// The adjoint reaching output column j of row r: a matrix dy, or a constant (a loss's grad_scale/width).
template <class S>
struct matrix_adjoint {
  const S* data;
  std::size_t pitch;
  KOKKOS_FORCEINLINE_FUNCTION S operator()(std::size_t r, int j) const { return data[r * pitch + std::size_t(j)]; }
  KOKKOS_FORCEINLINE_FUNCTION S flat(std::int64_t i) const { return data[i]; }  // rows packed: pitch == width
  [[nodiscard]] bool packed(int width) const { return pitch == std::size_t(width); }
};
template <class S>
struct constant_adjoint {
  S value;
  KOKKOS_FORCEINLINE_FUNCTION S operator()(std::size_t, int) const { return value; }
  KOKKOS_FORCEINLINE_FUNCTION S flat(std::int64_t) const { return value; }
  [[nodiscard]] bool packed(int) const { return true; }
};

// Sweep 1: what reaches each reduction (adjoint[Slot · Stride]: Stride lanes interleaved).
template <class S, int Stride = 1>
struct reduction_sink {
  S* adjoint;
  template <int I> KOKKOS_FORCEINLINE_FUNCTION void input(int, S) const {}
  template <int K> KOKKOS_FORCEINLINE_FUNCTION void param(int, S) const {}
  template <int Slot> KOKKOS_FORCEINLINE_FUNCTION void reduced(S a) const { adjoint[Slot * Stride] += a; }
};

using kfsdp::detail::lane_sum;
using kfsdp::detail::lanes;

// out[slot] += Σ_{k < n} of what reverse(k, sink) hands each of Slots reductions.
template <class S, int Slots, class Reverse>
KOKKOS_FORCEINLINE_FUNCTION void lane_adjoints(int n, S* out, const Reverse& reverse) {
  S acc[Slots * lanes] = {};
  int k = 0;
  for (; k + lanes <= n; k += lanes)
    for (int l = 0; l < lanes; ++l) {
      const reduction_sink<S, lanes> sink{acc + l};
      reverse(k + l, sink);
    }
  const reduction_sink<S, lanes> tail{acc};
  for (; k < n; ++k) reverse(k, tail);
  for (int slot = 0; slot < Slots; ++slot) {
    S total = 0;
    for (int l = 0; l < lanes; ++l) total += acc[slot * lanes + l];
    out[slot] += total;
  }
}
// Sweep 2: the input row's gradient (WithInput) or one parameter's per-block column sums
// (Param >= 0: partial[column], a scalar parameter's at column 0). One leaf a loop: a loop that
// writes one stream vectorises (GCC versions a loop for a handful of possible aliases at most).
template <class S, bool WithInput, int Param = -1>
struct leaf_sink {
  S* out;
  int stride;
  template <int I> KOKKOS_FORCEINLINE_FUNCTION void input(int j, S a) const {
    if constexpr (WithInput && I == 0) out[j] += a;
  }
  template <int K> KOKKOS_FORCEINLINE_FUNCTION void param(int j, S a) const {
    if constexpr (K == Param) out[j * stride] += a;
  }
  template <int Slot> KOKKOS_FORCEINLINE_FUNCTION void reduced(S) const {}
};

// The flat loop's: the input's adjoint at one element, in a register.
template <class S>
struct element_sink {
  S dx = 0;
  template <int I> KOKKOS_FORCEINLINE_FUNCTION void input(int, S a) {
    if constexpr (I == 0) dx += a;
  }
  template <int K> KOKKOS_FORCEINLINE_FUNCTION void param(int, S) const {}
  template <int Slot> KOKKOS_FORCEINLINE_FUNCTION void reduced(S) const {}
};

template <class R>
inline constexpr bool is_max_v = std::is_same_v<typename R::kind, max_kind>;
template <class R>
inline constexpr bool is_mean_v = std::is_same_v<typename R::kind, mean_kind>;
template <class R>
inline constexpr bool is_row_value_v = std::is_same_v<typename R::kind, row_value_kind>;
// A sum or a mean: its adjoint reaches every column of its body.
template <class R>
inline constexpr bool summed_v = !is_max_v<R> && !is_row_value_v<R>;

// Two reductions that compute the same value (mean(x) written three times in a layer norm).
template <class R1, class R2>
bool same_reduction(const R1& r1, const R2& r2) {
  if constexpr (std::is_same_v<typename R1::kind, typename R2::kind> &&
                std::is_same_v<typename R1::body_type, typename R2::body_type>)
    return r1.width == r2.width && r1.a == r2.a;
  else
    return false;
}

// E: a numbered expression. The widths and parameters a kernel launch needs, by value (device lambdas copy it).
template <class E, class S>
struct rowwise_kernels {
  static constexpr int N = E::reductions;
  static constexpr int slots = N > 0 ? N : 1;
  using row_type = row<S, N>;

  E expr;
  int in_width = 0, out_width = 0;
  int widest = 0;                  // the widest column domain (output or a reduction's body)
  bool elementwise = false;        // no reduction, no parameter, as wide as the input: one flat loop
  int stride[max_params] = {};
  int params = 0;
  int canonical[slots] = {};  // the first slot with the same value: computed there, read here
  int param_width[max_params] = {};  // a scalar parameter's is 1

  // The row's pointers into x, t and the parameters.
  KOKKOS_FORCEINLINE_FUNCTION row_type row_at(const S* x, std::size_t x_pitch, const S* t, std::size_t t_pitch,
                                              const S* const* param, std::size_t r) const {
    row_type rw;
    rw.input[0] = x + r * x_pitch;
    rw.input[1] = t != nullptr ? t + r * t_pitch : nullptr;
    for (int k = 0; k < max_params; ++k) {
      rw.param[k] = param[k];
      rw.stride[k] = stride[k];
    }
    return rw;
  }

  // Forward of one row: the reductions (kept in reduced/argmax), then, with y, the output row.
  KOKKOS_FORCEINLINE_FUNCTION void forward_row(row_type& rw, S* reduced, int* argmax, S* y) const {
    expr.for_each_reduction([&](const auto& red) {
      using R = std::remove_cvref_t<decltype(red)>;
      const int n = red.width;
      if constexpr (R::slot > 0) {  // slot 0 is always the first of its kind
        if (const int first = canonical[R::slot]; first != R::slot) {
          rw.reduced[R::slot] = reduced[R::slot] = reduced[first];
          if constexpr (is_max_v<R>) argmax[R::slot] = argmax[first];
          return;
        }
      }
      if constexpr (is_max_v<R>) {
        S m = red.a.value(rw, 0);
        int at = 0;
        for (int k = 1; k < n; ++k) {
          const S v = red.a.value(rw, k);
          if (v > m || (v != v && m == m)) {  // NaN wins, as in PyTorch
            m = v;
            at = k;
          }
        }
        rw.reduced[R::slot] = m;
        argmax[R::slot] = at;
      } else {
        const S acc = lane_sum<S>(n, [&](int k) { return red.a.value(rw, k); });
        rw.reduced[R::slot] = is_mean_v<R> ? acc / S(n) : acc;
      }
      reduced[R::slot] = rw.reduced[R::slot];
    });
    if (y != nullptr)
      for (int j = 0; j < out_width; ++j) y[j] = expr.value(rw, j);
  }

  // Sweep 1 of one row: adjoint[i], what reaches reduction i from the output and from the reductions around it.
  template <class Adjoint>
  KOKKOS_FORCEINLINE_FUNCTION void reduction_adjoints(const row_type& rw, const int* argmax, const Adjoint& dy,
                                                      std::size_t r, S* adjoint) const {
    for (int i = 0; i < slots; ++i) adjoint[i] = S(0);
    if constexpr (N > 0) {
      // through[i][m]: d(reduction i)/d(reduction m) for m inside i's body (m < i: inner first).
      S through[slots][slots] = {};
      {
        const reduction_sink<S> sink{adjoint};
        for (int j = 0; j < out_width; ++j) expr.reverse(rw, j, record(expr, rw, j), dy(r, j), sink);
      }
      expr.for_each_reduction([&](const auto& red) {  // a sum's or mean's body, its share at every column
        using R = std::remove_cvref_t<decltype(red)>;
        if constexpr (R::body_type::reductions > 0 && summed_v<R>)
          if (canonical[R::slot] == R::slot) {
            const S scale = is_mean_v<R> ? S(1) / S(red.width) : S(1);
            lane_adjoints<S, slots>(red.width, through[R::slot], [&](int k, const auto& sink) {
              red.a.reverse(rw, k, record(red.a, rw, k), scale, sink);
            });
          }
      });
      expr.for_each_reduction([&](const auto& red) {  // a max's at its argmax, a row value's at its one column
        using R = std::remove_cvref_t<decltype(red)>;
        if constexpr (R::body_type::reductions > 0 && !summed_v<R>) {
          const int k = is_max_v<R> ? argmax[R::slot] : 0;
          const reduction_sink<S> sink{through[R::slot]};
          red.a.reverse(rw, k, record(red.a, rw, k), S(1), sink);
        }
      });
      for (int i = N - 1; i > 0; --i) {  // outer first: adjoint[i] is whole once every reduction around it is done
        if (canonical[i] != i) {  // a copy hands its adjoint to the slot that computes it
          adjoint[canonical[i]] += adjoint[i];
          adjoint[i] = S(0);
          continue;
        }
        for (int m = 0; m < i; ++m) adjoint[m] += adjoint[i] * through[i][m];
      }
    }
  }

  // Sweep 2 of one row: the output's adjoints to dx and to the block's parameter sums (partial:
  // parameter K's at K · pitch), then each reduction's to its body's leaves (a mean's divided by its
  // width, a max's at its argmax only). Every test is outside a loop, and each loop writes one leaf:
  // each vectorises.
  template <bool WithInput, class Adjoint>
  KOKKOS_FORCEINLINE_FUNCTION void to_leaves(const row_type& rw, const int* argmax, const Adjoint& dy, std::size_t r,
                                             const S* adjoint, S* dx, S* partial, int pitch) const {
    // Node's reverse at columns [0, n) (reverse(k, sink)), a loop per leaf it reaches.
    auto each_leaf = [&]<class Node>(const Node&, int n, const auto& reverse) {
      if constexpr (WithInput && (Node::inputs & 1u) != 0) {
        const leaf_sink<S, true> sink{dx, 1};
        for (int k = 0; k < n; ++k) reverse(k, sink);
      }
      if (partial == nullptr) return;
      [&]<int... K>(std::integer_sequence<int, K...>) {
        (
            [&] {
              if constexpr ((Node::params & (1u << K)) != 0) {
                const leaf_sink<S, false, K> sink{partial + K * pitch, stride[K]};
                for (int k = 0; k < n; ++k) reverse(k, sink);
              }
            }(),
            ...);
      }(std::make_integer_sequence<int, max_params>{});
    };
    each_leaf(expr, out_width, [&](int j, const auto& sink) { expr.reverse(rw, j, record(expr, rw, j), dy(r, j), sink); });
    expr.for_each_reduction([&](const auto& red) {
      using R = std::remove_cvref_t<decltype(red)>;
      if constexpr (summed_v<R>) {  // a row value's body reaches reductions and constants only
        if (canonical[R::slot] != R::slot) return;  // a copy's adjoint went to the slot that computes it
        const S a = is_mean_v<R> ? adjoint[R::slot] / S(red.width) : adjoint[R::slot];
        each_leaf(red.a, red.width, [&](int k, const auto& sink) { red.a.reverse(rw, k, record(red.a, rw, k), a, sink); });
      } else if constexpr (is_max_v<R>) {  // a max's adjoint goes to its argmax alone
        if (canonical[R::slot] != R::slot) return;
        const int at = argmax[R::slot];
        each_leaf(red.a, 1, [&](int, const auto& sink) { red.a.reverse(rw, at, record(red.a, rw, at), adjoint[R::slot], sink); });
      }
    });
  }
};

// Binds and launches the kernels: what rowwise_op and rowwise_loss_op (compute/rowwise.hpp) run.
template <class E, class S>
class rowwise_runner {
 public:
  using kernels_type = rowwise_kernels<E, S>;
  static constexpr int N = E::reductions;

  explicit rowwise_runner(E e) { k_.expr = e; }

  // Checks the widths (throws std::invalid_argument naming the terms that disagree); returns the output's.
  std::size_t bind(const shape& s) {
    E e = k_.expr;
    const std::size_t out = e.bind(s);
    k_.expr = e;
    k_.in_width = int(s.input_width[0]);
    k_.out_width = out == broadcast ? 1 : int(out);
    k_.params = s.params;
    for (int p = 0; p < s.params; ++p) {
      k_.stride[p] = s.param_width[p] == broadcast ? 0 : 1;
      k_.param_width[p] = s.param_width[p] == broadcast ? 1 : int(s.param_width[p]);
    }
    k_.widest = k_.out_width;
    e.for_each_reduction([&](const auto& red) {
      using R = std::remove_cvref_t<decltype(red)>;
      k_.canonical[R::slot] = R::slot;
      e.for_each_reduction([&](const auto& earlier) {
        using M = std::remove_cvref_t<decltype(earlier)>;
        if (M::slot < R::slot && k_.canonical[R::slot] == R::slot && same_reduction(earlier, red))
          k_.canonical[R::slot] = M::slot;
      });
      if (!is_row_value_v<R> && k_.canonical[R::slot] == R::slot) k_.widest = std::max(k_.widest, red.width);
    });
    k_.elementwise = N == 0 && s.params == 0 && k_.out_width == k_.in_width;
    bound_ = true;
    return std::size_t(k_.out_width);
  }
  [[nodiscard]] bool bound() const noexcept { return bound_; }
  [[nodiscard]] std::size_t in_width() const noexcept { return std::size_t(k_.in_width); }
  [[nodiscard]] std::size_t out_width() const noexcept { return std::size_t(k_.out_width); }
  [[nodiscard]] const kernels_type& kernels() const noexcept { return k_; }

  // y = expression(x, t, params) row by row; keeps each row's reductions for backward.
  void forward(const nn::const_matrix<S>& x, const nn::const_matrix<S>& t, const std::array<const S*, max_params>& param,
               S* y, std::size_t y_pitch) {
    const rows_in in = rows_of(x, t);
    keep(in.rows);
    const kernels_type k = k_;
    if (k.elementwise && contiguous(x, t) && y_pitch == std::size_t(k.out_width)) {
      kfsdp::detail::vector_for<nn::execution_space>(
          "kfsdp::expr::forward_elements", std::int64_t(x.size()), KOKKOS_LAMBDA(std::int64_t i) {
            typename kernels_type::row_type rw = k.row_at(in.x + i, 0, in.t != nullptr ? in.t + i : nullptr, 0, param.data(), 0);
            y[i] = k.expr.value(rw, 0);
          });
      return;
    }
    const Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> reduced = reduced_;
    const Kokkos::View<int**, Kokkos::LayoutRight, nn::memory_space> argmax = argmax_;
    kfsdp::detail::vector_for<nn::execution_space>(
        "kfsdp::expr::forward", std::int64_t(in.rows), KOKKOS_LAMBDA(std::int64_t r) {
          auto rw = k.row_at(in.x, in.x_pitch, in.t, in.t_pitch, param.data(), std::size_t(r));
          k.forward_row(rw, &reduced(r, 0), &argmax(r, 0), y != nullptr ? y + std::size_t(r) * y_pitch : nullptr);
        });
  }

  // sums[r] = Σ_j expression(x, t, params)[r, j] (a loss's rows: no output matrix); keeps each
  // row's reductions for backward.
  void forward_sums(const nn::const_matrix<S>& x, const nn::const_matrix<S>& t, const std::array<const S*, max_params>& param,
                    S* sums) {
    const rows_in in = rows_of(x, t);
    keep(in.rows);
    const kernels_type k = k_;
    const Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> reduced = reduced_;
    const Kokkos::View<int**, Kokkos::LayoutRight, nn::memory_space> argmax = argmax_;
    kfsdp::detail::vector_for<nn::execution_space>(
        "kfsdp::expr::forward_sums", std::int64_t(in.rows), KOKKOS_LAMBDA(std::int64_t r) {
          auto rw = k.row_at(in.x, in.x_pitch, in.t, in.t_pitch, param.data(), std::size_t(r));
          k.forward_row(rw, &reduced(r, 0), &argmax(r, 0), nullptr);
          sums[r] = lane_sum<S>(k.out_width, [&](int j) { return k.expr.value(rw, j); });
        });
  }

  struct rows_in {  // the rows a kernel reads: x and (a loss's) t
    const S* x;
    std::size_t x_pitch;
    const S* t;
    std::size_t t_pitch;
    std::size_t rows;
  };
  static rows_in rows_of(const nn::const_matrix<S>& x, const nn::const_matrix<S>& t) {
    return {x.data(), pitch(x), t.data(), t.data() != nullptr ? pitch(t) : 0, x.extent(0)};
  }

  // Backward's kernel 1: a public member, not a lambda (nvcc defines no device lambda inside a generic
  // lambda or a private member function).
  // params_pitch 0: no parameter sums.
  template <bool WithInput, class Adjoint>
  void backward_rows(const kernels_type k, const rows_in in, const std::array<const S*, max_params> param, const Adjoint dy,
                     S* dx, std::size_t dx_pitch, int blocks, int params_pitch) {
    const Kokkos::View<const S**, Kokkos::LayoutRight, nn::memory_space> reduced = reduced_;
    const Kokkos::View<const int**, Kokkos::LayoutRight, nn::memory_space> argmax = argmax_;
    const Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> partial = partial_;
    kfsdp::detail::vector_for<nn::execution_space>(
        "kfsdp::expr::backward_rows", std::int64_t(blocks), KOKKOS_LAMBDA(std::int64_t b) {
          const std::size_t first = std::size_t(b) * rows_per_block;
          const std::size_t last = first + rows_per_block < in.rows ? first + rows_per_block : in.rows;
          S* block_partial = params_pitch > 0 ? &partial(b, 0) : nullptr;
          for (std::size_t r = first; r < last; ++r) {
            auto rw = k.row_at(in.x, in.x_pitch, in.t, in.t_pitch, param.data(), r);
            for (int s = 0; s < N; ++s) rw.reduced[s] = reduced(r, s);
            S adjoint[kernels_type::slots];
            k.reduction_adjoints(rw, &argmax(r, 0), dy, r, adjoint);
            S* dx_row = WithInput ? dx + r * dx_pitch : nullptr;
            if constexpr (WithInput)
              for (int j = 0; j < k.in_width; ++j) dx_row[j] = S(0);
            k.template to_leaves<WithInput>(rw, &argmax(r, 0), dy, r, adjoint, dx_row, block_partial, params_pitch);
          }
        });
  }


  // Accumulates the parameters' gradients into grad and overwrites dx (when it has data) with the
  // input's, for the adjoint dy of every output column.
  template <class Adjoint>
  void backward(const nn::const_matrix<S>& x, const nn::const_matrix<S>& t, const std::array<const S*, max_params>& param,
                const std::array<S*, max_params>& grad, const Adjoint& dy, S* dx, std::size_t dx_pitch) {
    const rows_in in = rows_of(x, t);
    const std::size_t rows = in.rows;
    const kernels_type k = k_;
    if (k.elementwise && contiguous(x, t) && dx_pitch == std::size_t(k.in_width) && dy.packed(k.in_width)) {
      if (dx == nullptr) return;
      kfsdp::detail::vector_for<nn::execution_space>(
          "kfsdp::expr::backward_elements", std::int64_t(x.size()), KOKKOS_LAMBDA(std::int64_t i) {
            typename kernels_type::row_type rw;
            rw.input[0] = in.x + i;
            rw.input[1] = in.t != nullptr ? in.t + i : nullptr;
            element_sink<S> sink;
            k.expr.reverse(rw, 0, record(k.expr, rw, 0), dy.flat(i), sink);
            dx[i] = sink.dx;
          });
      return;
    }
    // Blocks of rows_per_block rows: each block's parameter gradients are column sums of its own
    // (partial), added over the blocks in order afterwards; no atomics, and the same bits on every
    // backend and thread count.
    const int blocks = int((rows + rows_per_block - 1) / rows_per_block);
    const bool with_params = k.params > 0;
    const int pitch = k.widest;
    if (with_params) {
      if (partial_.extent(0) != std::size_t(blocks) || partial_.extent(1) != std::size_t(k.params * pitch))
        partial_ = Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space>("kfsdp::expr::partial_grads", std::size_t(blocks),
                                                                            std::size_t(k.params * pitch));
      else
        Kokkos::deep_copy(partial_, S(0));
    }
    const Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> partial = partial_;
    // Kernel 1: blocks of rows. Per row: sweep 1 (the reductions' adjoints), sweep 2 (dx, the block's
    // parameter sums).
    if (dx != nullptr) backward_rows<true>(k, in, param, dy, dx, dx_pitch, blocks, with_params ? pitch : 0);
    else if (with_params) backward_rows<false>(k, in, param, dy, dx, dx_pitch, blocks, pitch);
    // Kernel 2: each parameter element's gradient, the blocks' partial sums added in order.
    if (with_params && blocks > 0) {
      kfsdp::detail::vector_for<nn::execution_space>(
          "kfsdp::expr::backward_params", std::int64_t(k.params) * pitch, KOKKOS_LAMBDA(std::int64_t i) {
            const int p = int(i / pitch), j = int(i % pitch);
            if (j >= k.param_width[p] || grad[p] == nullptr) return;
            S sum = 0;
            for (int b = 0; b < blocks; ++b) sum += partial(b, i);
            grad[p][j] += sum;
          });
    }
  }

  private:
  template <class M>
  static std::size_t pitch(const M& m) {
    return m.extent(0) > 1 ? std::size_t(m.stride(0)) : m.extent(1);
  }
  static bool contiguous(const nn::const_matrix<S>& x, const nn::const_matrix<S>& t) {
    return x.span_is_contiguous() && (t.data() == nullptr || t.span_is_contiguous());
  }
  void keep(std::size_t rows) {
    if (reduced_.extent(0) == rows && (rows > 0 || reduced_.data() != nullptr)) return;
    (void)nn::detail::checked_numel("kfsdp::expr::forward", "reductions", {rows, std::size_t(kernels_type::slots)}, sizeof(S));
    reduced_ = Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::expr::reductions"), rows, std::size_t(kernels_type::slots));
    argmax_ = Kokkos::View<int**, Kokkos::LayoutRight, nn::memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::expr::argmax"), rows, std::size_t(kernels_type::slots));
  }

  kernels_type k_;
  bool bound_ = false;
  static constexpr std::size_t rows_per_block = 16;
  Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> reduced_, partial_;
  Kokkos::View<int**, Kokkos::LayoutRight, nn::memory_space> argmax_;
};

}  // namespace kfsdp::expr
