#pragma once
// The compute of a row-wise layer (model/rowwise.hpp): its expression, built once from the
// descriptor, run by the fused kernels of compute/rowwise_kernels.hpp under the layer contract of
// compute/ops.hpp. Kernels are named by the expression's type alone (no layer name in it), so the
// CUDA build compiles them.

#include <kfsdp/compute/rowwise_kernels.hpp>
#include <kfsdp/model/rowwise.hpp>
#include <kfsdp/compute/layer_params.hpp>

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace kfsdp {

namespace detail {
// The descriptor's expression, its reductions numbered: expression(x, [t,] p0, p1, ...).
template <class Layer>
constexpr auto make_expression(const Layer& d) {
  constexpr std::size_t params = std::tuple_size_v<std::remove_cvref_t<decltype(d.params())>>;
  static_assert(params <= std::size_t(expr::max_params), "kfsdp::rowwise: a layer has at most 8 parameters");
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    if constexpr (std::is_same_v<output_t<Layer>, loss>)
      return expr::numbered(d.expression(expr::input<0>{}, expr::input<1>{}, expr::param<int(K)>{}...));
    else
      return expr::numbered(d.expression(expr::input<0>{}, expr::param<int(K)>{}...));
  }(std::make_index_sequence<params>{});
}

// The parameters' widths and names as the expression's bind() wants them; 1-D only.
template <class Layer>
expr::shape expression_shape(const Layer& d, std::string_view layer) {
  expr::shape s;
  for (const param_decl& decl : d.params()) {
    if (decl.rank != 1)
      throw std::invalid_argument("kfsdp::rowwise '" + std::string(layer) + "': parameter '" + std::string(decl.name) +
                                  "' has rank " + std::to_string(decl.rank) +
                                  ", expected 1 (a row-wise expression takes [features] or [1] parameters)");
    s.param_width[s.params] = decl.shape[0] == 1 ? expr::broadcast : decl.shape[0];
    s.param_name[s.params++] = decl.name;
  }
  return s;
}

template <class M>
std::size_t row_pitch(const M& m) {
  return m.extent(0) > 1 ? std::size_t(m.stride(0)) : m.extent(1);
}
}  // namespace detail

template <class Layer>
using expression_t = decltype(detail::make_expression(std::declval<const Layer&>()));

// features -> features.
template <class E, class S>
class rowwise_op {
 public:
  template <class Layer>
  explicit rowwise_op(const Layer& d) : runner_(detail::make_expression(d)), shape_(detail::expression_shape(d, Layer::name.view())) {}

  // The output's width for an input `in` features wide; throws std::invalid_argument naming the
  // terms whose widths disagree (the network calls it when it is built).
  std::size_t bind_width(std::size_t in) {
    shape_.input_width[0] = in;
    return runner_.bind(shape_);
  }

  void forward(const layer_params<const S>& p, nn::const_matrix<S> x, nn::matrix<S> y) {
    if (!runner_.bound() || runner_.in_width() != x.extent(1)) (void)bind_width(x.extent(1));
    nn::detail::check_matrix("rowwise::forward", "y", y, x.extent(0), runner_.out_width());
    runner_.forward(x, {}, pointers(p), y.data(), detail::row_pitch(y));
    input_ = x;
  }
  void backward(const layer_params<const S>& p, const layer_params<S>& g, nn::const_matrix<S> dy, nn::matrix<S> dx) {
    const std::size_t rows = input_.extent(0);
    nn::detail::check_matrix("rowwise::backward", "dy", dy, rows, runner_.out_width());
    if (dx.data() != nullptr) nn::detail::check_matrix("rowwise::backward", "dx", dx, rows, runner_.in_width());
    runner_.backward(input_, {}, pointers(p), pointers(g), expr::matrix_adjoint<S>{dy.data(), detail::row_pitch(dy)},
                     dx.data(), dx.data() != nullptr ? detail::row_pitch(dx) : 0);
  }

  [[nodiscard]] const E& expression() const noexcept { return runner_.kernels().expr; }

 private:
  template <class Element>
  std::array<Element*, expr::max_params> pointers(const layer_params<Element>& p) const {
    if (int(p.size()) != shape_.params)
      throw std::invalid_argument("kfsdp::rowwise: " + std::to_string(p.size()) + " parameters given, the layer declares " +
                                  std::to_string(shape_.params));
    std::array<Element*, expr::max_params> out{};
    for (std::size_t i = 0; i < p.size(); ++i) out[i] = p.flat(i).data();
    return out;
  }

  expr::rowwise_runner<E, S> runner_;
  expr::shape shape_;
  nn::const_matrix<S> input_;
};

// features + target values -> loss: the mean of the expression over its elements (or its rows).
template <class E, class S>
class rowwise_loss_op {
 public:
  template <class Layer>
  explicit rowwise_loss_op(const Layer& d) : runner_(detail::make_expression(d)), shape_(detail::expression_shape(d, Layer::name.view())) {
    if (shape_.params != 0)
      throw std::invalid_argument("kfsdp::rowwise_loss '" + std::string(Layer::name.view()) + "': a loss layer takes no parameters");
  }

  std::size_t bind_width(std::size_t in) {
    shape_.input_width[0] = shape_.input_width[1] = in;
    (void)runner_.bind(shape_);
    return in;
  }

  S forward(nn::const_matrix<S> x, nn::const_matrix<S> t) {
    const std::size_t rows = x.extent(0);
    nn::detail::check_matrix("rowwise_loss::forward", "target", t, rows, x.extent(1));
    if (!runner_.bound() || runner_.in_width() != x.extent(1)) (void)bind_width(x.extent(1));
    const std::size_t width = runner_.out_width();
    if (row_sums_.extent(0) != rows) {
      (void)nn::detail::checked_numel("rowwise_loss::forward", "row sums", {rows}, sizeof(S));
      row_sums_ = nn::vector<S>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::expr::loss_rows"), rows);
    }
    runner_.forward_sums(x, t, {}, row_sums_.data());
    input_ = x;
    target_ = t;
    if (rows == 0) return S(0);
    // The rows in index order on the host: the same sum on every backend.
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), row_sums_);
    S sum = 0;
    for (std::size_t r = 0; r < rows; ++r) sum += host(r);
    return sum / (S(rows) * S(width));
  }
  // dx = grad_scale · d(the row's mean)/dx, grad_scale being d(loss)/d(the row's mean).
  void backward(S grad_scale, nn::matrix<S> dx) {
    nn::detail::check_matrix("rowwise_loss::backward", "dx", dx, input_.extent(0), runner_.in_width());
    runner_.backward(input_, target_, {}, {}, expr::constant_adjoint<S>{grad_scale / S(runner_.out_width())}, dx.data(),
                     detail::row_pitch(dx));
  }

 private:
  expr::rowwise_runner<E, S> runner_;
  expr::shape shape_;
  nn::const_matrix<S> input_, target_;
  nn::vector<S> row_sums_;
};

namespace detail {
template <class Layer, class S>
struct rowwise_compute {
  using type = std::conditional_t<std::is_same_v<output_t<Layer>, loss>, rowwise_loss_op<expression_t<Layer>, S>,
                                  rowwise_op<expression_t<Layer>, S>>;
};
}  // namespace detail

}  // namespace kfsdp
