#pragma once
// The fused Kokkos kernels of a row-wise expression (expr/expression.hpp): forward and backward
// derived from the one expression, for any execution space.
//
//   forward   one kernel over rows: each reduction in a sweep of the row (inner first), then the
//             output columns; the reductions are kept ([rows, N] values, and where a max is)
//   backward  kernel 1 over rows: sweep 1 takes each output column's adjoint down the expression to
//             what reaches every reduction (and, for nested reductions, what an inner one gives an
//             outer one); sweep 2 takes the adjoints to the input row (dx) and to scalar parameters
//             kernel 2 over column chunks, when there are per-feature parameters: their gradients
//             as column sums, rows in order (no atomics: the same bits on every backend)
// An expression with no reduction, no parameter and as wide as its input runs as one flat loop
// over every element (it vectorises, as the hand-written activations did).

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

// Sweep 1: what reaches each reduction.
template <class S>
struct reduction_sink {
  S* adjoint;
  template <int I> KOKKOS_FORCEINLINE_FUNCTION void input(int, S) const {}
  template <int K> KOKKOS_FORCEINLINE_FUNCTION void param(int, S) const {}
  template <int Slot> KOKKOS_FORCEINLINE_FUNCTION void reduced(S a) const { adjoint[Slot] += a; }
};
// Sweep 2: the input row's gradient and the scalar parameters' sums over the row.
template <class S, bool WithInput, bool WithScalars>
struct leaf_sink {
  S* dx;
  S* scalar_sum;
  const int* stride;
  template <int I> KOKKOS_FORCEINLINE_FUNCTION void input(int j, S a) const {
    if constexpr (WithInput && I == 0) dx[j] += a;
  }
  template <int K> KOKKOS_FORCEINLINE_FUNCTION void param(int, S a) const {
    if constexpr (WithScalars) if (stride[K] == 0) scalar_sum[K] += a;
  }
  template <int Slot> KOKKOS_FORCEINLINE_FUNCTION void reduced(S) const {}
};
// Kernel 2: per-feature parameter gradients, column j of each.
template <class S>
struct param_sink {
  S* const* grad;
  const int* stride;
  template <int I> KOKKOS_FORCEINLINE_FUNCTION void input(int, S) const {}
  template <int K> KOKKOS_FORCEINLINE_FUNCTION void param(int j, S a) const {
    if (stride[K] == 1) grad[K][j] += a;
  }
  template <int Slot> KOKKOS_FORCEINLINE_FUNCTION void reduced(S) const {}
};

template <class R>
inline constexpr bool is_max_v = std::is_same_v<typename R::kind, max_kind>;
template <class R>
inline constexpr bool is_mean_v = std::is_same_v<typename R::kind, mean_kind>;

// E: a numbered expression. The widths and parameters a kernel launch needs, by value (device lambdas copy it).
template <class E, class S>
struct rowwise_kernels {
  static constexpr int N = E::reductions;
  static constexpr int slots = N > 0 ? N : 1;
  using row_type = row<S, N>;

  E expr;
  int in_width = 0, out_width = 0;
  int widest = 0;                  // the widest column domain (output or a reduction's body)
  bool domains_equal = true;       // every reduction's body as wide as the output: sweep 2 is one loop
  bool elementwise = false;        // no reduction, no parameter, as wide as the input: one flat loop
  bool per_feature_params = false, scalar_params = false;
  int stride[max_params] = {};
  int params = 0;

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
      if constexpr (is_max_v<R>) {
        S m = red.a.eval(rw, 0).v;
        int at = 0;
        for (int k = 1; k < n; ++k) {
          const S v = red.a.eval(rw, k).v;
          if (v > m || (v != v && m == m)) {  // NaN wins, as in PyTorch
            m = v;
            at = k;
          }
        }
        rw.reduced[R::slot] = m;
        argmax[R::slot] = at;
      } else {
        S acc = 0;
        for (int k = 0; k < n; ++k) acc += red.a.eval(rw, k).v;
        rw.reduced[R::slot] = is_mean_v<R> ? acc / S(n) : acc;
      }
      reduced[R::slot] = rw.reduced[R::slot];
    });
    if (y != nullptr)
      for (int j = 0; j < out_width; ++j) y[j] = expr.eval(rw, j).v;
  }

  // Sweep 1 of one row: adjoint[i], what reaches reduction i from the output and from the reductions around it.
  template <class Adjoint>
  KOKKOS_FORCEINLINE_FUNCTION void reduction_adjoints(const row_type& rw, const int* argmax, const Adjoint& dy,
                                                      std::size_t r, S* adjoint) const {
    for (int i = 0; i < slots; ++i) adjoint[i] = S(0);
    if constexpr (N > 0) {
      const reduction_sink<S> to_reductions{adjoint};
      for (int j = 0; j < out_width; ++j) {
        const auto t = expr.eval(rw, j);
        expr.reverse(rw, j, t, dy(r, j), to_reductions);
      }
      // through[i][m]: d(reduction i)/d(reduction m) for m inside i's body (m < i: inner first).
      S through[slots][slots] = {};
      expr.for_each_reduction([&](const auto& red) {
        using R = std::remove_cvref_t<decltype(red)>;
        if constexpr (R::body_type::reductions > 0) {
          const reduction_sink<S> sink{through[R::slot]};
          if constexpr (is_max_v<R>) {
            const int k = argmax[R::slot];
            red.a.reverse(rw, k, red.a.eval(rw, k), S(1), sink);
          } else {
            const S scale = is_mean_v<R> ? S(1) / S(red.width) : S(1);
            for (int k = 0; k < red.width; ++k) red.a.reverse(rw, k, red.a.eval(rw, k), scale, sink);
          }
        }
      });
      for (int i = N - 1; i > 0; --i)  // outer first: adjoint[i] is whole once every reduction around it is done
        for (int m = 0; m < i; ++m) adjoint[m] += adjoint[i] * through[i][m];
    }
  }

  // Reduction R's adjoint handed to its body's leaves at column k (a max's only at its argmax).
  template <class R, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void reduction_to_leaves(const R& red, const row_type& rw, const S* adjoint,
                                                       const int* argmax, int k, const Sink& sink) const {
    if constexpr (is_max_v<R>) {
      if (k != argmax[R::slot]) return;
    }
    const S a = is_mean_v<R> ? adjoint[R::slot] / S(red.width) : adjoint[R::slot];
    red.a.reverse(rw, k, red.a.eval(rw, k), a, sink);
  }

  // Sweep 2 of one row: every adjoint to the sink's leaves, column by column.
  template <class Adjoint, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void to_leaves(const row_type& rw, const int* argmax, const Adjoint& dy, std::size_t r,
                                             const S* adjoint, int from, int to, const Sink& sink) const {
    const int out_to = to < out_width ? to : out_width;
    if (domains_equal) {  // one loop: the output's and every reduction's adjoints at column j together
      for (int j = from; j < out_to; ++j) {
        const auto t = expr.eval(rw, j);
        expr.reverse(rw, j, t, dy(r, j), sink);
        expr.for_each_reduction([&](const auto& red) { reduction_to_leaves(red, rw, adjoint, argmax, j, sink); });
      }
      return;
    }
    for (int j = from; j < out_to; ++j) {
      const auto t = expr.eval(rw, j);
      expr.reverse(rw, j, t, dy(r, j), sink);
    }
    expr.for_each_reduction([&](const auto& red) {
      const int red_to = to < red.width ? to : red.width;
      for (int k = from; k < red_to; ++k) reduction_to_leaves(red, rw, adjoint, argmax, k, sink);
    });
  }
};

// Binds and launches the kernels: what rowwise_op and rowwise_loss_op (train/rowwise.hpp) run.
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
    k_.per_feature_params = k_.scalar_params = false;
    for (int p = 0; p < s.params; ++p) {
      k_.stride[p] = s.param_width[p] == broadcast ? 0 : 1;
      (k_.stride[p] == 1 ? k_.per_feature_params : k_.scalar_params) = true;
    }
    k_.widest = k_.out_width;
    k_.domains_equal = true;
    e.for_each_reduction([&](const auto& red) {
      k_.widest = std::max(k_.widest, red.width);
      if (red.width != k_.out_width) k_.domains_equal = false;
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
    const std::size_t rows = x.extent(0);
    keep(rows);
    const kernels_type k = k_;
    const S* xp = x.data();
    const S* tp = t.data();
    const std::size_t x_pitch = pitch(x), t_pitch = t.data() != nullptr ? pitch(t) : 0;
    if (k.elementwise && contiguous(x, t) && y_pitch == std::size_t(k.out_width)) {
      Kokkos::parallel_for(
          "kfsdp::expr::forward_elements",
          Kokkos::RangePolicy<nn::execution_space, Kokkos::IndexType<std::int64_t>>(0, std::int64_t(x.size())),
          KOKKOS_LAMBDA(std::int64_t i) {
            typename kernels_type::row_type rw = k.row_at(xp, 0, tp, 0, param.data(), 0);
            rw.input[0] = xp + i;
            rw.input[1] = tp != nullptr ? tp + i : nullptr;
            y[i] = k.expr.eval(rw, 0).v;
          });
      return;
    }
    const Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> reduced = reduced_;
    const Kokkos::View<int**, Kokkos::LayoutRight, nn::memory_space> argmax = argmax_;
    Kokkos::parallel_for(
        "kfsdp::expr::forward", Kokkos::RangePolicy<nn::execution_space>(0, int(rows)), KOKKOS_LAMBDA(int r) {
          auto rw = k.row_at(xp, x_pitch, tp, t_pitch, param.data(), std::size_t(r));
          k.forward_row(rw, &reduced(r, 0), &argmax(r, 0), y != nullptr ? y + std::size_t(r) * y_pitch : nullptr);
        });
  }

  // Accumulates the parameters' gradients into grad and overwrites dx (when it has data) with the
  // input's, for the adjoint dy of every output column.
  template <class Adjoint>
  void backward(const nn::const_matrix<S>& x, const nn::const_matrix<S>& t, const std::array<const S*, max_params>& param,
                const std::array<S*, max_params>& grad, const Adjoint& dy, S* dx, std::size_t dx_pitch) {
    const std::size_t rows = x.extent(0);
    const kernels_type k = k_;
    const S* xp = x.data();
    const S* tp = t.data();
    const std::size_t x_pitch = pitch(x), t_pitch = t.data() != nullptr ? pitch(t) : 0;
    if (k.elementwise && contiguous(x, t) && dx_pitch == std::size_t(k.in_width) && dy.packed(k.in_width)) {
      if (dx == nullptr) return;
      Kokkos::parallel_for(
          "kfsdp::expr::backward_elements",
          Kokkos::RangePolicy<nn::execution_space, Kokkos::IndexType<std::int64_t>>(0, std::int64_t(x.size())),
          KOKKOS_LAMBDA(std::int64_t i) {
            typename kernels_type::row_type rw = k.row_at(xp, 0, tp, 0, param.data(), 0);
            rw.input[0] = xp + i;
            rw.input[1] = tp != nullptr ? tp + i : nullptr;
            S a = 0;
            const leaf_sink<S, true, false> sink{&a, nullptr, nullptr};
            const auto tape = k.expr.eval(rw, 0);
            k.expr.reverse(rw, 0, tape, dy.flat(i), sink);
            dx[i] = a;
          });
      return;
    }
    const Kokkos::View<const S**, Kokkos::LayoutRight, nn::memory_space> reduced = reduced_;
    const Kokkos::View<const int**, Kokkos::LayoutRight, nn::memory_space> argmax = argmax_;
    const bool per_feature = k.per_feature_params, scalars = k.scalar_params;
    if ((per_feature || scalars) && (adjoints_.extent(0) != rows))
      adjoints_ = Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::expr::adjoints"), rows, std::size_t(kernels_type::slots + max_params));
    const Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> adjoints = adjoints_;
    // Kernel 1: rows. Sweep 1 (reductions' adjoints), sweep 2 (dx, scalar parameters' row sums).
    auto launch_rows = [&]<bool WithInput, bool WithScalars>() {
      Kokkos::parallel_for(
          "kfsdp::expr::backward_rows", Kokkos::RangePolicy<nn::execution_space>(0, int(rows)), KOKKOS_LAMBDA(int r) {
            auto rw = k.row_at(xp, x_pitch, tp, t_pitch, param.data(), std::size_t(r));
            for (int s = 0; s < N; ++s) rw.reduced[s] = reduced(r, s);
            S adjoint[kernels_type::slots];
            k.reduction_adjoints(rw, &argmax(r, 0), dy, std::size_t(r), adjoint);
            S scalar_sum[max_params] = {};
            if constexpr (WithInput || WithScalars) {
              S* dx_row = WithInput ? dx + std::size_t(r) * dx_pitch : nullptr;
              if constexpr (WithInput)
                for (int j = 0; j < k.in_width; ++j) dx_row[j] = S(0);
              const leaf_sink<S, WithInput, WithScalars> sink{dx_row, scalar_sum, rw.stride};
              k.to_leaves(rw, &argmax(r, 0), dy, std::size_t(r), adjoint, 0, k.widest, sink);
            }
            if (per_feature)
              for (int s = 0; s < kernels_type::slots; ++s) adjoints(r, s) = adjoint[s];
            if constexpr (WithScalars)
              for (int p = 0; p < max_params; ++p) adjoints(r, kernels_type::slots + p) = scalar_sum[p];
          });
    };
    if (dx != nullptr) {
      if (scalars) launch_rows.template operator()<true, true>();
      else launch_rows.template operator()<true, false>();
    } else if (scalars) {
      launch_rows.template operator()<false, true>();
    } else if (per_feature) {
      launch_rows.template operator()<false, false>();
    }
    // Kernel 2: per-feature parameters, column sums over the rows in order, a chunk of columns a thread.
    if (per_feature && rows > 0) {
      const int concurrency = std::max(1, int(nn::execution_space().concurrency()));
      const int chunk = std::max(1, (k.widest + concurrency - 1) / concurrency);
      const int chunks = (k.widest + chunk - 1) / chunk;
      Kokkos::parallel_for(
          "kfsdp::expr::backward_params", Kokkos::RangePolicy<nn::execution_space>(0, chunks), KOKKOS_LAMBDA(int c) {
            const int from = c * chunk, to = from + chunk < k.widest ? from + chunk : k.widest;
            const param_sink<S> sink{grad.data(), k.stride};
            for (std::size_t r = 0; r < rows; ++r) {
              auto rw = k.row_at(xp, x_pitch, tp, t_pitch, param.data(), r);
              for (int s = 0; s < N; ++s) rw.reduced[s] = reduced(r, s);
              k.to_leaves(rw, &argmax(r, 0), dy, r, &adjoints(r, 0), from, to, sink);
            }
          });
    }
    // Scalar parameters: the rows' sums added in order.
    if (scalars && rows > 0) {
      Kokkos::parallel_for(
          "kfsdp::expr::backward_scalars", Kokkos::RangePolicy<nn::execution_space>(0, 1), KOKKOS_LAMBDA(int) {
            for (int p = 0; p < max_params; ++p) {
              if (k.stride[p] != 0 || p >= k.params) continue;
              S sum = 0;
              for (std::size_t r = 0; r < rows; ++r) sum += adjoints(r, kernels_type::slots + p);
              grad[p][0] += sum;
            }
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
  Kokkos::View<S**, Kokkos::LayoutRight, nn::memory_space> reduced_, adjoints_;
  Kokkos::View<int**, Kokkos::LayoutRight, nn::memory_space> argmax_;
};

}  // namespace kfsdp::expr
