// kfsdp::nn::cached_attention: the kernel bodies and their explicit instantiations for float and double
// (the declarations are in include/kfsdp/nn/cached_attention.hpp).

#include <kfsdp/nn/cached_attention.hpp>
#include <kfsdp/detail/kokkos_math.hpp>

#include <stdexcept>
#include <string>
#include <utility>

namespace kfsdp::nn {

template <class Scalar>
cached_attention<Scalar>::cached_attention(std::size_t heads, std::size_t kv_heads, std::size_t head_dim,
                                           std::size_t max_positions)
    : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {
  const char* where = "cached_attention";
  for (auto [value, name] : {std::pair{heads, "heads"}, std::pair{kv_heads, "kv_heads"}, std::pair{head_dim, "head_dim"},
                             std::pair{max_positions, "max_positions"}})
    if (value == 0) throw std::invalid_argument(std::string(where) + ": " + name + " is 0, expected at least 1");
  if (heads % kv_heads != 0)
    throw std::invalid_argument(std::string(where) + ": kv_heads = " + std::to_string(kv_heads) +
                                " does not divide heads = " + std::to_string(heads));
  const auto what = [] { return "cached_attention: in_features ((heads + 2 · kv_heads) · head_dim)"; };
  detail::check_int_extent(where, "qkv", "columns", checked_mul(checked_add(heads, checked_mul(2, kv_heads, what), what), head_dim, what));
  detail::check_int_extent(where, "the cache", "positions", max_positions);
  const std::size_t width = kv_heads * head_dim;
  (void)detail::checked_numel(where, "keys", {max_positions, width}, sizeof(Scalar));
  keys_ = matrix<Scalar>("kfsdp::nn::cached_attention::keys", max_positions, width);
  values_ = matrix<Scalar>("kfsdp::nn::cached_attention::values", max_positions, width);
}

namespace detail {
// Copies the rows' k and v columns to cache positions first, first + 1, ...
template <class Scalar>
void store_keys_values(const_matrix<Scalar> qkv, matrix<Scalar> keys, matrix<Scalar> values, int first, int q_width) {
  const int width = int(keys.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::cached_attention::store", Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {int(qkv.extent(0)), width}),
      KOKKOS_LAMBDA(int r, int c) {
        keys(first + r, c) = qkv(r, q_width + c);
        values(first + r, c) = qkv(r, q_width + width + c);
      });
}

// One thread per (row, query head): scores over positions 0 .. first + row, the softmax (its maximum
// subtracted), then the weighted sum of the values. A free function: nvcc takes no device lambda in a
// private member function.
template <class Scalar>
void attend_cached(const_matrix<Scalar> qkv, const_matrix<Scalar> keys, const_matrix<Scalar> values, vector<Scalar> scores,
                   matrix<Scalar> y, int first, int heads, int group, int head_dim, int max_positions) {
  const Scalar scale = Scalar(1) / math::sqrt(Scalar(head_dim));
  Kokkos::parallel_for(
      "kfsdp::nn::cached_attention", Kokkos::RangePolicy<execution_space>(0, int(qkv.extent(0)) * heads), KOKKOS_LAMBDA(int index) {
        const int row = index / heads, head = index % heads, kv_first = (head / group) * head_dim, q_first = head * head_dim;
        const int seen = first + row + 1;  // positions 0 .. first + row
        const std::size_t base = std::size_t(index) * std::size_t(max_positions);
        Scalar largest = 0;
        for (int s = 0; s < seen; ++s) {
          Scalar dot = 0;
          for (int c = 0; c < head_dim; ++c) dot += qkv(row, q_first + c) * keys(s, kv_first + c);
          scores(base + s) = dot * scale;
          if (s == 0 || scores(base + s) > largest) largest = scores(base + s);
        }
        Scalar total = 0;
        for (int s = 0; s < seen; ++s) total += scores(base + s) = math::exp(scores(base + s) - largest);
        for (int c = 0; c < head_dim; ++c) {
          Scalar sum = 0;
          for (int s = 0; s < seen; ++s) sum += scores(base + s) * values(s, kv_first + c);
          y(row, q_first + c) = sum / total;
        }
      });
}
}  // namespace detail

template <class Scalar>
void cached_attention<Scalar>::forward(const_matrix<Scalar> qkv, matrix<Scalar> y, std::size_t first) {
  const char* where = "cached_attention::forward";
  const std::size_t rows = qkv.extent(0);
  detail::check_matrix(where, "qkv", qkv, rows, in_features());
  detail::check_matrix(where, "y", y, rows, out_features());
  if (first > max_positions() || rows > max_positions() - first)
    throw std::invalid_argument(std::string(where) + ": positions " + std::to_string(first) + " .. " +
                                std::to_string(first + rows) + " (first + rows), expected at most max_positions = " +
                                std::to_string(max_positions()));
  if (rows == 0) return;
  const std::size_t needed = detail::checked_numel(where, "scores", {rows, heads_, max_positions()}, sizeof(Scalar));
  if (scores_.extent(0) < needed)
    scores_ = vector<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::nn::cached_attention::scores"), needed);
  detail::store_keys_values<Scalar>(qkv, keys_, values_, int(first), int(heads_ * head_dim_));
  detail::attend_cached<Scalar>(qkv, keys_, values_, scores_, y, int(first), int(heads_), int(heads_ / kv_heads_), int(head_dim_),
                                int(max_positions()));
}

template class cached_attention<float>;
template class cached_attention<double>;
}  // namespace kfsdp::nn
