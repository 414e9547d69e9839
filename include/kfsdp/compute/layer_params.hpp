#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::layer_params: what a layer's compute sees of its parameters (or gradients).

#include <kfsdp/model/param_table.hpp>
#include <kfsdp/nn/views.hpp>

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace kfsdp {

// One layer's parameters (layer_params<const S>) or gradients (layer_params<S>), in the order
// of its params(), as views of the engine's unsharded buffers. The views do not own the memory:
// a layer's bound views (pass_context::params) keep no freed bucket from going back to the pool,
// and they are bound again whenever their buckets are gathered anew.
KFSDP_EXPORT template <class Element>
class layer_params {
 public:
  static constexpr std::size_t capacity = 8;

  void push(Kokkos::View<Element*> flat, const param_info& info) {
    if (size_ == capacity)
      throw std::length_error("kfsdp::layer_params: a layer has more than " + std::to_string(capacity) + " parameters");
    flat_[size_] = Kokkos::View<Element*>(flat.data(), flat.extent(0));  // unmanaged: no reference kept
    info_[size_++] = &info;
  }
  // A gradient left out: a frozen parameter's, for a compute that skips it (skips_frozen_gradients).
  void push_absent(const param_info& info) { push(Kokkos::View<Element*>(), info); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  // Whether parameter i has a view (not one left out).
  [[nodiscard]] bool has(std::size_t i) const { return flat_[checked(i, 0)].data() != nullptr; }
  [[nodiscard]] const param_info& info(std::size_t i) const { return *info_[checked(i, 0)]; }
  [[nodiscard]] Kokkos::View<Element*> flat(std::size_t i) const { return flat_[checked(i, 0)]; }
  // The i-th parameter as a vector (rank 1) or a matrix (rank 2), in its declared shape; empty
  // where it was left out.
  [[nodiscard]] nn::vector_of<Element> vector(std::size_t i) const {
    if (!has(checked(i, 1))) return {};
    return nn::vector_of<Element>(flat_[i].data(), info_[i]->shape[0]);
  }
  [[nodiscard]] nn::matrix_of<Element> matrix(std::size_t i) const {
    if (!has(checked(i, 2))) return {};
    return nn::matrix_of<Element>(flat_[i].data(), info_[i]->shape[0], info_[i]->shape[1]);
  }

 private:
  std::size_t checked(std::size_t i, std::size_t rank) const {
    if (i >= size_)
      throw std::out_of_range("kfsdp::layer_params: parameter " + std::to_string(i) + " asked for, the layer has " +
                              std::to_string(size_));
    if (rank != 0 && info_[i]->rank != rank)
      throw std::invalid_argument("kfsdp::layer_params: '" + std::string(info_[i]->name.view()) + "' has rank " +
                                  std::to_string(info_[i]->rank) + ", asked for as rank " + std::to_string(rank));
    return i;
  }
  std::array<Kokkos::View<Element*>, capacity> flat_{};
  std::array<const param_info*, capacity> info_{};
  std::size_t size_ = 0;
};

}  // namespace kfsdp
