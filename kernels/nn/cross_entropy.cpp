// kfsdp::nn::cross_entropy: the kernel bodies and their explicit instantiations for float and double
// (the declarations are in include/kfsdp/nn/cross_entropy.hpp).

#include <kfsdp/nn/cross_entropy.hpp>
#include <kfsdp/nn/detail/elementwise.hpp>
#include <kfsdp/detail/erf.hpp>
#include <kfsdp/detail/kokkos_math.hpp>
#include <kfsdp/detail/vector_for.hpp>

#include <string>

namespace kfsdp::nn {

namespace detail {

template <class Scalar>
void cross_entropy_rows(const_matrix<Scalar> logits, const_index_vector targets,
                        vector<Scalar> logsumexp, vector<Scalar> losses) {
  const int rows = int(logits.extent(0)), classes = int(logits.extent(1));
  kfsdp::detail::vector_for<execution_space>("kfsdp::nn::cross_entropy_rows", rows, KOKKOS_LAMBDA(std::int64_t n) {
    Scalar max_logit = logits(n, 0);
    for (int v = 1; v < classes; ++v)
      if (logits(n, v) > max_logit) max_logit = logits(n, v);
    // logit − max ≤ 0 exactly: the exp that vectorises
    const Scalar sum =
        kfsdp::detail::lane_sum<Scalar>(classes, [&](int v) { return math::fast_exp_nonpositive(logits(n, v) - max_logit); });
    const Scalar lse = max_logit + math::log(sum);
    logsumexp(n) = lse;
    losses(n) = lse - logits(n, targets(n));
  });
}

// Σ_n losses[n] in index order on the host copy: the same sum on every backend.
template <class Scalar>
Scalar ordered_sum(const_vector<Scalar> values) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values);
  Scalar sum = 0;
  for (std::size_t n = 0; n < host.extent(0); ++n) sum += host(n);
  return sum;
}

template <class Scalar>
void cross_entropy_gradient(const_matrix<Scalar> logits, const_index_vector targets,
                            const_vector<Scalar> logsumexp, Scalar grad_scale,
                            matrix<Scalar> dlogits) {
  const int rows = int(logits.extent(0)), classes = int(logits.extent(1));
  kfsdp::detail::vector_for<execution_space>("kfsdp::nn::cross_entropy_gradient", rows, KOKKOS_LAMBDA(std::int64_t n) {
    // logsumexp = max + log Σ ≥ max, also once rounded: logit − logsumexp ≤ 0
    const Scalar row_logsumexp = logsumexp(n);
    const int target = targets(n);
    for (int v = 0; v < classes; ++v)
      dlogits(n, v) =
          (math::fast_exp_nonpositive(logits(n, v) - row_logsumexp) - (v == target ? Scalar(1) : Scalar(0))) * grad_scale;
  });
}

}  // namespace detail

template <class Scalar>
typename cross_entropy<Scalar>::cache cross_entropy<Scalar>::make_cache(std::size_t rows) const {
  (void)detail::checked_numel("cross_entropy::make_cache", "logsumexp", {rows}, sizeof(Scalar));
  cache c;
  c.logsumexp = vector<Scalar>(Kokkos::view_alloc("kfsdp::nn::cross_entropy::logsumexp"), rows);
  c.losses = vector<Scalar>(Kokkos::view_alloc("kfsdp::nn::cross_entropy::losses"), rows);
  return c;
}

template <class Scalar>
Scalar cross_entropy<Scalar>::forward(const_matrix<Scalar> logits, const_index_vector targets,
                                      cache& c) const {
  const char* where = "cross_entropy::forward";
  const std::size_t rows = logits.extent(0);
  detail::check_matrix(where, "logits", logits, rows, classes_);
  detail::check_vector(where, "targets", targets, rows);
  if (classes_ == 0) throw std::invalid_argument("cross_entropy: classes must be > 0");
  const int bad = detail::count_ids_out_of_range(targets, int(classes_));
  if (bad > 0)
    throw std::out_of_range(std::string(where) + ": targets has " + std::to_string(bad) +
                            " entries outside [0, " + std::to_string(classes_) + ")");
  if (c.logsumexp.extent(0) != rows) c = make_cache(rows);
  detail::cross_entropy_rows<Scalar>(logits, targets, c.logsumexp, c.losses);
  c.logits = logits;
  c.targets = targets;
  if (rows == 0) return Scalar(0);
  return detail::ordered_sum<Scalar>(c.losses) / Scalar(rows);
}

template <class Scalar>
void cross_entropy<Scalar>::backward(const cache& c, Scalar grad_scale,
                                     matrix<Scalar> dlogits) const {
  const char* where = "cross_entropy::backward";
  const std::size_t rows = c.logits.extent(0);
  detail::check_matrix(where, "cache.logits", c.logits, rows, classes_);
  detail::check_vector(where, "cache.logsumexp", c.logsumexp, rows);
  detail::check_matrix(where, "dlogits", dlogits, rows, classes_);
  detail::cross_entropy_gradient<Scalar>(c.logits, c.targets, c.logsumexp, grad_scale, dlogits);
}

template class cross_entropy<float>;
template class cross_entropy<double>;
}  // namespace kfsdp::nn
