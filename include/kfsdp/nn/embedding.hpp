#pragma once
// kfsdp::nn::embedding — rows of a table: y[n, :] = weight[ids[n], :], PyTorch's nn.Embedding.
//
//   kfsdp::nn::embedding<double> wte(/*num_embeddings=*/256, /*dim=*/64);
//   auto cache = wte.make_cache(rows);
//   wte.forward({weight}, ids, x, cache);        // x = weight[ids]
//   wpe.forward_add({pos_weight}, positions, x, pos_cache);   // x += pos_weight[positions]
//   wte.backward({dweight}, cache, dx);          // dweight[ids[n]] += dx[n]
//
// The backward scatter-add is deterministic: each table row is owned by one team, which adds the
// rows of dy that hit it in increasing n (no atomics, so the same sums in the same order on every
// backend and at every world size). It costs num_embeddings · rows id comparisons, cheap for a byte
// vocabulary. Ids outside [0, num_embeddings) throw std::out_of_range from forward.
// Conventions: see views.hpp. Not a kfsdp::nn::layer (its input is ids, not a matrix).

#include <kfsdp/nn/views.hpp>

#include <cstddef>
#include <type_traits>

namespace kfsdp::nn {

// embedding_tensors<const S> are the parameters, embedding_tensors<S> the gradients.
template <class Element>
struct embedding_tensors {
  matrix_of<Element> weight;  // [num_embeddings, dim]

  embedding_tensors() = default;
  embedding_tensors(matrix_of<Element> weight_) : weight(weight_) {}
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  embedding_tensors(const embedding_tensors<Other>& other) : weight(other.weight) {}
};

template <class Scalar>
class embedding {
 public:
  using scalar_type = Scalar;
  using params = embedding_tensors<const Scalar>;
  using grads = embedding_tensors<Scalar>;
  struct cache {
    const_index_vector ids;  // kept as a view
  };

  // Throws std::overflow_error when the weight [num_embeddings, dim] has more than 2^64 bytes.
  embedding(std::size_t num_embeddings, std::size_t dim)
      : num_embeddings_(num_embeddings), dim_(dim) {
    (void)detail::checked_numel("embedding", "weight", {num_embeddings, dim}, sizeof(Scalar));
  }

  [[nodiscard]] std::size_t num_embeddings() const noexcept { return num_embeddings_; }
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] cache make_cache(std::size_t /*rows*/) const { return {}; }

  // y [rows, dim] = weight[ids], ids [rows].
  void forward(const params& p, const_index_vector ids, matrix<Scalar> y, cache& c) const;
  // y [rows, dim] += weight[ids]: the second embedding of a sum (GPT's wpe).
  void forward_add(const params& p, const_index_vector ids, matrix<Scalar> y, cache& c) const;
  // dweight[ids[n], :] += dy[n, :].
  void backward(const grads& g, const cache& c, const_matrix<Scalar> dy) const;

 private:
  void check_forward(const char* where, const params& p, const_index_vector ids,
                     const matrix<Scalar>& y) const;
  std::size_t num_embeddings_;
  std::size_t dim_;
};

extern template class embedding<float>;
extern template class embedding<double>;

}  // namespace kfsdp::nn
