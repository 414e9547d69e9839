// kfsdp::nn::rotary_embedding: the kernel bodies and their explicit instantiations for float and double
// (the declarations are in include/kfsdp/nn/rotary.hpp).

#include <kfsdp/nn/rotary.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace kfsdp::nn {

template <class Scalar>
rotary_embedding<Scalar>::rotary_embedding(std::size_t heads, std::size_t kv_heads, std::size_t head_dim,
                                           std::size_t seq_len, double theta, rope_scaling scaling)
    : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), seq_len_(seq_len) {
  const char* where = "rotary_embedding";
  for (auto [value, name] : {std::pair{heads, "heads"}, std::pair{kv_heads, "kv_heads"},
                             std::pair{head_dim, "head_dim"}, std::pair{seq_len, "seq_len"}})
    if (value == 0) throw std::invalid_argument(std::string(where) + ": " + name + " is 0, expected at least 1");
  if (head_dim % 2 != 0)
    throw std::invalid_argument(std::string(where) + ": head_dim is " + std::to_string(head_dim) +
                                ", expected an even number (RoPE turns pairs)");
  if (!(theta > 0.0))
    throw std::invalid_argument(std::string(where) + ": theta is " + std::to_string(theta) + ", expected a positive number");
  scaling.validate();
  const auto what = [] { return "rotary_embedding: in_features ((heads + 2 · kv_heads) · head_dim)"; };
  detail::check_int_extent(where, "x", "columns",
                           checked_mul(checked_add(heads, checked_mul(2, kv_heads, what), what), head_dim, what));
  detail::check_int_extent(where, "the table", "positions", seq_len);
  const std::size_t half = head_dim / 2;
  (void)detail::checked_numel(where, "cos table", {seq_len, half}, sizeof(Scalar));
  cos_ = matrix<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::rotary::cos"), seq_len, half);
  sin_ = matrix<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::rotary::sin"), seq_len, half);
  auto cos_host = Kokkos::create_mirror_view(cos_);
  auto sin_host = Kokkos::create_mirror_view(sin_);
  for (std::size_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, hd, 2).float() / hd)), scaled, then t · inv_freq, all in the scalar type.
    const Scalar inv_freq = scaling.inverse_frequency<Scalar>(i, head_dim, theta);
    for (std::size_t t = 0; t < seq_len; ++t) {
      const Scalar angle = Scalar(t) * inv_freq;
      cos_host(t, i) = std::cos(angle);
      sin_host(t, i) = std::sin(angle);
    }
  }
  Kokkos::deep_copy(cos_, cos_host);
  Kokkos::deep_copy(sin_, sin_host);
}

namespace detail {
// One thread per (row, head): the q and k heads turn by sign · angle, the v heads are copied. A free
// function, not in rotary_embedding::apply: nvcc takes no device lambda in a private member function.
template <class Scalar>
void rotary_turn(const_matrix<Scalar> in, matrix<Scalar> out, const_matrix<Scalar> cos_table,
                 const_matrix<Scalar> sin_table, int rotated, int all_heads, int head_dim, int seq, Scalar sign, int first = 0) {
  const int rows = int(in.extent(0)), half = head_dim / 2;
  Kokkos::parallel_for(
      "kfsdp::nn::rotary_embedding", Kokkos::RangePolicy<execution_space>(0, rows * all_heads), KOKKOS_LAMBDA(int index) {
        const int row = index / all_heads, head = index % all_heads, t = (first + row) % seq, column = head * head_dim;
        if (head >= rotated) {
          for (int c = 0; c < head_dim; ++c) out(row, column + c) = in(row, column + c);
          return;
        }
        for (int i = 0; i < half; ++i) {
          const Scalar c = cos_table(t, i), s = sign * sin_table(t, i);
          const Scalar a = in(row, column + i), b = in(row, column + half + i);
          out(row, column + i) = a * c - b * s;
          out(row, column + half + i) = b * c + a * s;
        }
      });
}
}  // namespace detail

template <class Scalar>
void rotary_embedding<Scalar>::apply(const char* where, const_matrix<Scalar> in, matrix<Scalar> out, bool inverse) const {
  const std::size_t rows = in.extent(0);
  detail::check_matrix(where, "input", in, rows, in_features());
  detail::check_matrix(where, "output", out, rows, in_features());
  if (rows % seq_len_ != 0)
    throw std::invalid_argument(std::string(where) + ": rows = " + std::to_string(rows) +
                                " is not a multiple of seq_len = " + std::to_string(seq_len_));
  const Scalar sign = inverse ? Scalar(-1) : Scalar(1);  // the inverse turns by −angle
  detail::rotary_turn<Scalar>(in, out, cos_, sin_, int(heads_ + kv_heads_), int(heads_ + 2 * kv_heads_),
                              int(head_dim_), int(seq_len_), sign);
}

template <class Scalar>
void rotary_embedding<Scalar>::forward(const_matrix<Scalar> x, matrix<Scalar> y) const {
  apply("rotary_embedding::forward", x, y, false);
}

template <class Scalar>
void rotary_embedding<Scalar>::forward_at(const_matrix<Scalar> x, matrix<Scalar> y, std::size_t first) const {
  const char* where = "rotary_embedding::forward_at";
  const std::size_t rows = x.extent(0);
  detail::check_matrix(where, "input", x, rows, in_features());
  detail::check_matrix(where, "output", y, rows, in_features());
  if (first > seq_len_ || rows > seq_len_ - first)
    throw std::invalid_argument(std::string(where) + ": positions " + std::to_string(first) + " .. " + std::to_string(first + rows) +
                                " (first + rows), expected at most seq_len = " + std::to_string(seq_len_) +
                                " (the positions the table holds)");
  detail::rotary_turn<Scalar>(x, y, cos_, sin_, int(heads_ + kv_heads_), int(heads_ + 2 * kv_heads_), int(head_dim_),
                              int(seq_len_), Scalar(1), int(first));
}

template <class Scalar>
void rotary_embedding<Scalar>::backward(const_matrix<Scalar> dy, matrix<Scalar> dx) const {
  apply("rotary_embedding::backward", dy, dx, true);
}

template class rotary_embedding<float>;
template class rotary_embedding<double>;
}  // namespace kfsdp::nn
