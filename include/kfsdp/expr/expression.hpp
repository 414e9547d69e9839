#pragma once
// kfsdp::expr — the compute between matrix products, written once as an expression over a row.
//
// A row-wise layer's forward is an expression of its input row x (a second row t for a loss's
// target), its parameters and constants; the expression's type is the computation:
//
//   x * rsqrt(mean(x * x) + 1e-6) * g        (RMSNorm: g a per-feature parameter)
//     -> binary<mul, binary<mul, input<0>, unary<rsqrt, binary<add, reduce<mean, ...>, constant>>>, param<0>>
//
// Every node offers, at column j of a row,
//   value(row, j)                  -> its value (what forward computes: scalars only);
//   record(row, j, tape)           -> fills its tape: its value and its children's tapes, the values
//                                     the reverse sweep needs (tape<S>: one aggregate per column,
//                                     filled in place so the compiler keeps it in registers; no
//                                     run-time tape);
//   reverse(row, j, tape, a, sink) -> hands the adjoint a down by its vector-Jacobian rule, one rule
//                                     per primitive (mul: a·b to the left, a·a to the right), to the
//                                     sink's leaves: input<I>(column, a), param<K>(column, a),
//                                     reduced<Slot>(a).
// A row reduction (sum, mean, max) is a value per row: the kernels compute it in a sweep of its own
// before the columns that use it, and keep it for backward (the only thing kept besides the input;
// everything else is recomputed). Its adjoint is a broadcast: the adjoint that reaches it, summed
// over the columns, goes back to every column of its body (mean: divided by the width; max: to the
// first column where the maximum is). Reductions are numbered in post order (inner first), so a
// reduction's slot is a compile-time index into the row's registers.
//
// Widths: an input row is the layer's input (a slice of it: x.slice(offset, width), x.half(k)); a
// per-feature parameter is as wide as it is declared; constants, scalar parameters ([1]) and
// reductions broadcast. bind() checks, when the layer is built, that everything an operation joins
// is as wide as the rest, naming both sides; the output is as wide as the expression.

#include <Kokkos_Core.hpp>

#include <kfsdp/detail/erf.hpp>
#include <kfsdp/detail/kokkos_math.hpp>

#include <array>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace kfsdp::expr {

inline constexpr int max_params = 8;  // as many as kfsdp::layer_params holds

// What one row looks like to the nodes: row r of each input, the parameters (stride 1 per feature,
// 0 a scalar) and this row's reductions.
template <class S, int Reductions>
struct row {
  using scalar = S;
  const S* input[2] = {nullptr, nullptr};
  const S* param[max_params] = {};
  int stride[max_params] = {};
  S reduced[Reductions > 0 ? Reductions : 1] = {};
};

// What bind() checks widths against, and names in its messages.
struct shape {
  std::size_t input_width[2] = {0, 0};
  std::size_t param_width[max_params] = {};  // 0: a scalar parameter (shape [1]), broadcast
  std::string_view param_name[max_params] = {};
  int params = 0;
};
inline constexpr std::size_t broadcast = 0;  // bind()'s width of a value that is the same on every column

template <class S> struct leaf_tape { S v; };
template <class S, class A> struct unary_tape { S v; A a; };
template <class S, class A, class B> struct binary_tape { S v; A a; B b; };

struct node_tag {  // the base of every node: the operators below take exactly these
  constexpr bool operator==(const node_tag&) const = default;
};
template <class T>
concept node = std::is_base_of_v<node_tag, std::remove_cvref_t<T>>;

namespace detail {
inline std::string quoted(const std::string& text) { return std::string(1, '\'').append(text).append(1, '\''); }
inline std::string width_string(std::size_t w) { return w == broadcast ? "a broadcast value" : std::to_string(w) + " wide"; }
// The width of a and b joined by an operation: equal, or one of them broadcast.
inline std::size_t join_widths(std::size_t a, std::size_t b, const std::string& left, const std::string& right,
                               std::string_view op) {
  if (a == broadcast) return b;
  if (b == broadcast || a == b) return a;
  throw std::invalid_argument("'" + left + "' (" + width_string(a) + ") " + std::string(op) + " '" + right + "' (" +
                              width_string(b) + "): the widths differ");
}
}  // namespace detail

// --- leaves ---

// Input row I: 0 the layer's input, 1 a loss's target. A slice (Sliced) reads columns
// [offset, offset + width); the whole row reads column j at j, an index the compiler sees is the
// same in every leaf (so a loop writing dx[j] twice still vectorises).
template <int I, bool Sliced = false>
struct input : node_tag {
  static constexpr int reductions = 0;
  static constexpr unsigned inputs = 1u << I, params = 0;  // the leaves below a node, a bit each
  static constexpr bool uniform = false;  // the same value on every column of a row
  static constexpr bool whole = !Sliced;  // the whole row: named plainly
  int offset = 0, width = -1;  // -1: to the end of the row (resolved by bind)
  int part = -1, parts = 0;    // half(k): the k-th of `parts` equal parts, resolved by bind

  // x.slice(offset, width): columns [offset, offset + width) of the row.
  [[nodiscard]] constexpr input<I, true> slice(int from, int count) const {
    input<I, true> s;
    s.offset = from;
    s.width = count;
    return s;
  }
  // x.half(0), x.half(1): the first and second half of the row (SwiGLU's gate and value).
  [[nodiscard]] constexpr input<I, true> half(int k) const {
    input<I, true> s;
    s.part = k;
    s.parts = 2;
    return s;
  }
  KOKKOS_FORCEINLINE_FUNCTION int column(int j) const { return Sliced ? offset + j : j; }

  template <class S> using tape = leaf_tape<S>;
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION typename Row::scalar value(const Row& r, int j) const {
    return r.input[I][column(j)];
  }
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION void record(const Row& r, int j, leaf_tape<typename Row::scalar>& t) const {
    t.v = value(r, j);
  }
  template <class Row, class Tape, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void reverse(const Row&, int j, const Tape&, typename Row::scalar a, Sink& s) const {
    s.template input<I>(column(j), a);
  }
  template <int First> constexpr input numbered() const { return *this; }
  template <class F> KOKKOS_FORCEINLINE_FUNCTION void for_each_reduction(F&&) const {}

  std::size_t bind(const shape& s) {
    const std::size_t all = s.input_width[I];
    if (parts > 0) {
      if (all % std::size_t(parts) != 0)
        throw std::invalid_argument(detail::quoted(name()) + ": the input is " + std::to_string(all) + " wide, expected a multiple of " +
                                    std::to_string(parts));
      width = int(all / std::size_t(parts));
      offset = part * width;
    } else if (width < 0) {
      width = int(all) - offset;
    }
    if (offset < 0 || width <= 0 || std::size_t(offset) + std::size_t(width) > all)
      throw std::invalid_argument(detail::quoted(name()) + " reads columns [" + std::to_string(offset) + ", " +
                                  std::to_string(offset + width) + ") of an input " + std::to_string(all) + " wide");
    return std::size_t(width);
  }
  [[nodiscard]] std::string name() const {
    const std::string base = I == 0 ? "x" : "t";
    if (parts > 0) return base + ".half(" + std::to_string(part) + ")";
    if (whole) return base;
    return base + "[" + std::to_string(offset) + ":" + (width < 0 ? std::string() : std::to_string(offset + width)) + "]";
  }
  constexpr bool operator==(const input&) const = default;
};

// Parameter K of the layer, in the order of its params(): per feature (its declared length) or, declared
// [1], a scalar.
template <int K>
struct param : node_tag {
  static constexpr int reductions = 0;
  static constexpr unsigned inputs = 0, params = 1u << K;
  static constexpr bool uniform = false;  // a scalar parameter is too, but that is known at bind
  static_assert(K < max_params, "kfsdp::expr::param: a layer has at most 8 parameters");
  std::string_view label;  // the parameter's name, for messages (set by bind)

  template <class S> using tape = leaf_tape<S>;
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION typename Row::scalar value(const Row& r, int j) const {
    return r.param[K][j * r.stride[K]];
  }
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION void record(const Row& r, int j, leaf_tape<typename Row::scalar>& t) const {
    t.v = value(r, j);
  }
  template <class Row, class Tape, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void reverse(const Row&, int j, const Tape&, typename Row::scalar a, Sink& s) const {
    s.template param<K>(j, a);
  }
  template <int First> constexpr param numbered() const { return *this; }
  template <class F> KOKKOS_FORCEINLINE_FUNCTION void for_each_reduction(F&&) const {}
  std::size_t bind(const shape& s) {
    if (K >= s.params)
      throw std::invalid_argument("the expression uses parameter " + std::to_string(K) + ", the layer declares " +
                                  std::to_string(s.params));
    label = s.param_name[K];
    return s.param_width[K];
  }
  [[nodiscard]] std::string name() const { return label.empty() ? std::string(1, 'p').append(std::to_string(K)) : std::string(label); }
  constexpr bool operator==(const param&) const = default;
};

struct constant : node_tag {
  static constexpr int reductions = 0;
  static constexpr unsigned inputs = 0, params = 0;
  static constexpr bool uniform = true;
  double number = 0;
  constexpr constant() = default;
  constexpr explicit constant(double v) : number(v) {}
  template <class S> using tape = leaf_tape<S>;
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION typename Row::scalar value(const Row&, int) const {
    return typename Row::scalar(number);
  }
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION void record(const Row&, int, leaf_tape<typename Row::scalar>& t) const {
    t.v = typename Row::scalar(number);
  }
  template <class Row, class Tape, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void reverse(const Row&, int, const Tape&, typename Row::scalar, Sink&) const {}
  template <int First> constexpr constant numbered() const { return *this; }
  template <class F> KOKKOS_FORCEINLINE_FUNCTION void for_each_reduction(F&&) const {}
  std::size_t bind(const shape&) const { return broadcast; }
  [[nodiscard]] std::string name() const {
    std::string text = std::to_string(number);
    while (text.size() > 1 && text.back() == '0' && text[text.size() - 2] != '.') text.pop_back();
    return text;
  }
  constexpr bool operator==(const constant&) const = default;
};

template <class Kind, class A, int Slot>
struct reduce;
template <class T> inline constexpr bool is_reduce_v = false;
template <class Kind, class A, int Slot> inline constexpr bool is_reduce_v<reduce<Kind, A, Slot>> = true;
// Worth computing once per row: a function of reductions and constants that is not itself a reduction.
template <class A>
inline constexpr bool hoistable = A::uniform && A::reductions > 0 && !is_reduce_v<A>;
template <bool Hoist, int First, class A>
constexpr auto numbered_operand(const A& a);

// --- element-wise primitives: a value and a vector-Jacobian rule each ---
// unary: value(x, c) and adjoint(a, x, y, c), y the value (c: the constant of pow, max, min).

struct neg_fn {
  static constexpr std::string_view name = "-";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return -x; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S, S, S) { return -a; }
};
struct exp_fn {
  static constexpr std::string_view name = "exp";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return math::exp(x); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S, S y, S) { return a * y; }
};
struct log_fn {
  static constexpr std::string_view name = "log";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return math::log(x); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S x, S, S) { return a / x; }
};
struct sqrt_fn {
  static constexpr std::string_view name = "sqrt";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return math::sqrt(x); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S, S y, S) { return a * S(0.5) / y; }
};
struct rsqrt_fn {  // d x^(-1/2) = −½ y³
  static constexpr std::string_view name = "rsqrt";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return S(1) / math::sqrt(x); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S, S y, S) { return a * (S(-0.5) * y * y * y); }
};
struct tanh_fn {
  static constexpr std::string_view name = "tanh";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return math::tanh(x); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S, S y, S) { return a * (S(1) - y * y); }
};
struct erf_fn {  // erf' = 2/√π · exp(−x²); fast_erf and fast_exp vectorise where libm's do not
  static constexpr std::string_view name = "erf";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return math::fast_erf(x); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S x, S, S) {
    return a * (S(1.12837916709551257390) * math::fast_exp_nonpositive(-x * x));
  }
};
struct sigmoid_fn {
  static constexpr std::string_view name = "sigmoid";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return S(1) / (S(1) + math::exp(-x)); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S, S y, S) { return a * (y * (S(1) - y)); }
};
struct abs_fn {
  static constexpr std::string_view name = "abs";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S) { return x < S(0) ? -x : x; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S x, S, S) {
    return x > S(0) ? a : (x < S(0) ? -a : S(0));
  }
};
struct pow_fn {  // x^c, c a constant
  static constexpr std::string_view name = "pow";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S c) { return c == S(2) ? x * x : math::pow(x, c); }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S x, S, S c) {
    return c == S(2) ? a * (S(2) * x) : a * (c * math::pow(x, c - S(1)));
  }
};
struct max_fn {  // max(x, c): relu is max(x, 0); the gradient goes to x where x > c
  static constexpr std::string_view name = "max";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S c) { return x > c ? x : c; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S x, S, S c) { return x > c ? a : S(0); }
};
struct min_fn {
  static constexpr std::string_view name = "min";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S c) { return x < c ? x : c; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S adjoint(S a, S x, S, S c) { return x < c ? a : S(0); }
};

template <class Fn, class A>
struct unary : node_tag {
  static constexpr int reductions = A::reductions;
  static constexpr unsigned inputs = A::inputs, params = A::params;
  static constexpr bool uniform = A::uniform;
  A a;
  double c = 0;

  template <class S> using tape = unary_tape<S, typename A::template tape<S>>;
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION typename Row::scalar value(const Row& r, int j) const {
    using S = typename Row::scalar;
    return Fn::value(a.value(r, j), S(c));
  }
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION void record(const Row& r, int j, tape<typename Row::scalar>& t) const {
    using S = typename Row::scalar;
    a.record(r, j, t.a);
    t.v = Fn::value(t.a.v, S(c));
  }
  template <class Row, class Tape, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void reverse(const Row& r, int j, const Tape& t, typename Row::scalar adj, Sink& s) const {
    using S = typename Row::scalar;
    a.reverse(r, j, t.a, Fn::adjoint(adj, t.a.v, t.v, S(c)), s);
  }
  template <int First>
  constexpr auto numbered() const {
    using B = decltype(a.template numbered<First>());
    return unary<Fn, B>{{}, a.template numbered<First>(), c};
  }
  template <class F> KOKKOS_FORCEINLINE_FUNCTION void for_each_reduction(F&& f) const { a.for_each_reduction(f); }
  std::size_t bind(const shape& s) { return a.bind(s); }
  [[nodiscard]] std::string name() const {
    std::string out(Fn::name);
    if constexpr (std::is_same_v<Fn, neg_fn>) return out.append(a.name());
    out.append(1, '(').append(a.name());
    if constexpr (std::is_same_v<Fn, pow_fn> || std::is_same_v<Fn, max_fn> || std::is_same_v<Fn, min_fn>)
      out.append(", ").append(constant(c).name());
    return out.append(1, ')');
  }
  constexpr bool operator==(const unary&) const = default;
};

// binary: value(x, y) and adjoints(a, x, y, v) -> {to x, to y}.
template <class S> struct adjoint_pair { S x, y; };
struct add_fn {
  static constexpr std::string_view name = "+";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S y) { return x + y; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static adjoint_pair<S> adjoints(S a, S, S, S) { return {a, a}; }
};
struct sub_fn {
  static constexpr std::string_view name = "-";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S y) { return x - y; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static adjoint_pair<S> adjoints(S a, S, S, S) { return {a, -a}; }
};
struct mul_fn {
  static constexpr std::string_view name = "*";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S y) { return x * y; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static adjoint_pair<S> adjoints(S a, S x, S y, S) { return {a * y, a * x}; }
};
struct div_fn {
  static constexpr std::string_view name = "/";
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static S value(S x, S y) { return x / y; }
  template <class S> KOKKOS_FORCEINLINE_FUNCTION static adjoint_pair<S> adjoints(S a, S, S y, S v) { return {a / y, -a * v / y}; }
};

template <class Fn, class A, class B>
struct binary : node_tag {
  static constexpr unsigned inputs = A::inputs | B::inputs, params = A::params | B::params;
  static constexpr bool uniform = A::uniform && B::uniform;
  // A row value (see row_value_kind) beside a column value is computed once per row: numbered()
  // wraps it, and it takes a slot of its own.
  static constexpr bool hoist_a = !uniform && hoistable<A>, hoist_b = !uniform && hoistable<B>;
  static constexpr int reductions = A::reductions + hoist_a + B::reductions + hoist_b;
  A a;
  B b;

  template <class S> using tape = binary_tape<S, typename A::template tape<S>, typename B::template tape<S>>;
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION typename Row::scalar value(const Row& r, int j) const {
    return Fn::value(a.value(r, j), b.value(r, j));
  }
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION void record(const Row& r, int j, tape<typename Row::scalar>& t) const {
    a.record(r, j, t.a);
    b.record(r, j, t.b);
    t.v = Fn::value(t.a.v, t.b.v);
  }
  template <class Row, class Tape, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void reverse(const Row& r, int j, const Tape& t, typename Row::scalar adj, Sink& s) const {
    const auto d = Fn::adjoints(adj, t.a.v, t.b.v, t.v);
    a.reverse(r, j, t.a, d.x, s);
    b.reverse(r, j, t.b, d.y, s);
  }
  template <int First>
  constexpr auto numbered() const {
    constexpr int second = First + A::reductions + hoist_a;
    const auto na = numbered_operand<hoist_a, First>(a);
    const auto nb = numbered_operand<hoist_b, second>(b);
    return binary<Fn, std::remove_const_t<decltype(na)>, std::remove_const_t<decltype(nb)>>{{}, na, nb};
  }
  template <class F> KOKKOS_FORCEINLINE_FUNCTION void for_each_reduction(F&& f) const {
    a.for_each_reduction(f);
    b.for_each_reduction(f);
  }
  std::size_t bind(const shape& s) {
    const std::size_t wa = a.bind(s), wb = b.bind(s);
    return detail::join_widths(wa, wb, a.name(), b.name(), Fn::name);
  }
  [[nodiscard]] std::string name() const {
    std::string out(1, '(');  // appended piece by piece: GCC 12 warns -Wrestrict on "(" + std::string&&
    out.append(a.name()).append(1, ' ').append(Fn::name).append(1, ' ').append(b.name()).append(1, ')');
    return out;
  }
  constexpr bool operator==(const binary&) const = default;
};

// --- row reductions ---

struct sum_kind { static constexpr std::string_view name = "sum"; };
// A row value: a function of constants and reductions only (rsqrt(mean(x·x) + ε)), computed once
// per row like a reduction over a single column, its adjoint summed over the columns that use it.
struct row_value_kind { static constexpr std::string_view name = "row value"; };
struct mean_kind { static constexpr std::string_view name = "mean"; };
struct max_kind { static constexpr std::string_view name = "max"; };

// A reduction of its body over the row, a broadcast value; Slot its place among the row's
// reductions (-1 until numbered()).
template <class Kind, class A, int Slot = -1>
struct reduce : node_tag {
  static constexpr int reductions = A::reductions + 1;
  static constexpr unsigned inputs = A::inputs, params = A::params;
  static constexpr bool uniform = true;
  static constexpr int slot = Slot;
  using kind = Kind;
  using body_type = A;
  A a;
  int width = 0;  // the body's width, set by bind

  template <class S> using tape = leaf_tape<S>;
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION typename Row::scalar value(const Row& r, int) const {
    return r.reduced[Slot];
  }
  template <class Row>
  KOKKOS_FORCEINLINE_FUNCTION void record(const Row& r, int j, leaf_tape<typename Row::scalar>& t) const {
    t.v = value(r, j);
  }
  template <class Row, class Tape, class Sink>
  KOKKOS_FORCEINLINE_FUNCTION void reverse(const Row&, int, const Tape&, typename Row::scalar adj, Sink& s) const {
    s.template reduced<Slot>(adj);
  }
  template <int First>
  constexpr auto numbered() const {
    using NA = decltype(a.template numbered<First>());
    return reduce<Kind, NA, First + A::reductions>{{}, a.template numbered<First>(), width};
  }
  // Inner reductions first: a reduction's body may use them.
  template <class F> KOKKOS_FORCEINLINE_FUNCTION void for_each_reduction(F&& f) const {
    a.for_each_reduction(f);
    f(*this);
  }
  std::size_t bind(const shape& s) {
    const std::size_t w = a.bind(s);
    width = w == broadcast ? 1 : int(w);
    return broadcast;
  }
  [[nodiscard]] std::string name() const {
    if constexpr (std::is_same_v<Kind, row_value_kind>) return a.name();
    return std::string(Kind::name).append(1, '(').append(a.name()).append(1, ')');
  }
  constexpr bool operator==(const reduce&) const = default;
};

// Numbers an operand of a binary node from slot First; a hoisted one (a row value beside column
// values) becomes reduce<row_value_kind, ...>, its slot after its body's.
template <bool Hoist, int First, class A>
constexpr auto numbered_operand(const A& a) {
  if constexpr (Hoist) {
    using NA = decltype(a.template numbered<First>());
    return reduce<row_value_kind, NA, First + A::reductions>{{}, a.template numbered<First>(), 0};
  } else {
    return a.template numbered<First>();
  }
}

// --- how expressions are written ---

template <class T>
KOKKOS_FORCEINLINE_FUNCTION constexpr auto as_node(const T& v) {
  if constexpr (node<T>) return v;
  else return constant(double(v));
}
template <class T>
using node_type = decltype(as_node(std::declval<T>()));

template <class T, class U>
concept operands = (node<T> || node<U>) && (node<T> || std::is_arithmetic_v<T>) && (node<U> || std::is_arithmetic_v<U>);

template <class Fn, class T, class U>
constexpr auto make_binary(const T& x, const U& y) {
  return binary<Fn, node_type<T>, node_type<U>>{{}, as_node(x), as_node(y)};
}
template <class T, class U> requires operands<T, U>
constexpr auto operator+(const T& x, const U& y) { return make_binary<add_fn>(x, y); }
template <class T, class U> requires operands<T, U>
constexpr auto operator-(const T& x, const U& y) { return make_binary<sub_fn>(x, y); }
template <class T, class U> requires operands<T, U>
constexpr auto operator*(const T& x, const U& y) { return make_binary<mul_fn>(x, y); }
template <class T, class U> requires operands<T, U>
constexpr auto operator/(const T& x, const U& y) { return make_binary<div_fn>(x, y); }

template <class Fn, node A>
constexpr auto make_unary(const A& x, double c = 0) { return unary<Fn, A>{{}, x, c}; }
template <node A> constexpr auto operator-(const A& x) { return make_unary<neg_fn>(x); }
template <node A> constexpr auto exp(const A& x) { return make_unary<exp_fn>(x); }
template <node A> constexpr auto log(const A& x) { return make_unary<log_fn>(x); }
template <node A> constexpr auto sqrt(const A& x) { return make_unary<sqrt_fn>(x); }
template <node A> constexpr auto rsqrt(const A& x) { return make_unary<rsqrt_fn>(x); }
template <node A> constexpr auto tanh(const A& x) { return make_unary<tanh_fn>(x); }
template <node A> constexpr auto erf(const A& x) { return make_unary<erf_fn>(x); }
template <node A> constexpr auto sigmoid(const A& x) { return make_unary<sigmoid_fn>(x); }
template <node A> constexpr auto abs(const A& x) { return make_unary<abs_fn>(x); }
template <node A> constexpr auto pow(const A& x, double c) { return make_unary<pow_fn>(x, c); }
template <node A> constexpr auto max(const A& x, double c) { return make_unary<max_fn>(x, c); }
template <node A> constexpr auto min(const A& x, double c) { return make_unary<min_fn>(x, c); }

template <node A> constexpr auto sum(const A& x) { return reduce<sum_kind, A>{{}, x}; }
template <node A> constexpr auto mean(const A& x) { return reduce<mean_kind, A>{{}, x}; }
template <node A> constexpr auto max(const A& x) { return reduce<max_kind, A>{{}, x}; }

// e's tape at column j of row r: every value its reverse sweep reads.
template <node E, class Row>
KOKKOS_FORCEINLINE_FUNCTION auto record(const E& e, const Row& r, int j) {
  typename E::template tape<typename Row::scalar> t;
  e.record(r, j, t);
  return t;
}

// The expression with its reductions numbered (what the kernels run).
template <node E>
constexpr auto numbered(const E& e) { return e.template numbered<0>(); }

}  // namespace kfsdp::expr
