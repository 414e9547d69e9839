// kfsdp::nn::embedding: the kernel bodies and their explicit instantiations for float and double
// (the declarations are in include/kfsdp/nn/embedding.hpp).

#include <kfsdp/nn/detail/elementwise.hpp>
#include <kfsdp/nn/embedding.hpp>

#include <string>

namespace kfsdp::nn {

namespace detail {

template <class Scalar>
void embedding_gather(const_matrix<Scalar> weight, const_index_vector ids, matrix<Scalar> y,
                      bool add) {
  const int rows = int(y.extent(0)), cols = int(y.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::embedding_gather",
      Kokkos::MDRangePolicy<execution_space, Kokkos::Rank<2>>({0, 0}, {rows, cols}),
      KOKKOS_LAMBDA(int n, int c) {
        const Scalar value = weight(ids(n), c);
        y(n, c) = add ? y(n, c) + value : value;
      });
}

// One team per table row; the team's threads split the columns and walk n in order.
template <class Scalar>
void embedding_scatter_add(const_index_vector ids, const_matrix<Scalar> dy,
                           matrix<Scalar> dweight) {
  using team_policy = Kokkos::TeamPolicy<execution_space>;
  using member = team_policy::member_type;
  const int rows = int(dy.extent(0)), cols = int(dy.extent(1));
  Kokkos::parallel_for(
      "kfsdp::nn::embedding_scatter_add", team_policy(int(dweight.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const member& team) {
        const int row = team.league_rank();
        for (int n = 0; n < rows; ++n) {
          if (ids(n) != row) continue;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols),
                               [&](int c) { dweight(row, c) += dy(n, c); });
        }
      });
}

}  // namespace detail

template <class Scalar>
void embedding<Scalar>::check_forward(const char* where, const params& p, const_index_vector ids,
                                      const matrix<Scalar>& y) const {
  detail::check_matrix(where, "weight", p.weight, num_embeddings_, dim_);
  detail::check_matrix(where, "y", y, ids.extent(0), dim_);
  const int bad = detail::count_ids_out_of_range(ids, int(num_embeddings_));
  if (bad > 0)
    throw std::out_of_range(std::string(where) + ": ids has " + std::to_string(bad) +
                            " entries outside [0, " + std::to_string(num_embeddings_) + ")");
}

template <class Scalar>
void embedding<Scalar>::forward(const params& p, const_index_vector ids, matrix<Scalar> y,
                                cache& c) const {
  check_forward("embedding::forward", p, ids, y);
  detail::embedding_gather<Scalar>(p.weight, ids, y, false);
  c.ids = ids;
}

template <class Scalar>
void embedding<Scalar>::forward_add(const params& p, const_index_vector ids, matrix<Scalar> y,
                                    cache& c) const {
  check_forward("embedding::forward_add", p, ids, y);
  detail::embedding_gather<Scalar>(p.weight, ids, y, true);
  c.ids = ids;
}

template <class Scalar>
void embedding<Scalar>::backward(const grads& g, const cache& c, const_matrix<Scalar> dy) const {
  detail::check_matrix("embedding::backward", "grads.weight", g.weight, num_embeddings_, dim_);
  detail::check_matrix("embedding::backward", "dy", dy, c.ids.extent(0), dim_);
  detail::embedding_scatter_add<Scalar>(c.ids, dy, g.weight);
}

template class embedding<float>;
template class embedding<double>;
}  // namespace kfsdp::nn
