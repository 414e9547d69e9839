#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// A full ("original") state dict: unsharded, unpadded parameters under their dotted names, in host
// memory, in model order. It is what a checkpoint holds and what the engine loads and shards.
//
//   kfsdp::state_dict sd = engine.original_state_dict();
//   std::span<const float> w = sd.at("lm_head.weight").values<float>();   // [256, D] row-major

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/tensor/dtype.hpp>
#include <kfsdp/meta/shape_string.hpp>

namespace kfsdp {

// A tensor's element type: safetensors' dtypes (kfsdp's parameters are F32 or F64).
KFSDP_EXPORT using io::dtype;
using io::dtype_of;

KFSDP_EXPORT struct tensor {
  std::string name;
  std::vector<std::size_t> shape;
  kfsdp::dtype type = dtype::F32;
  std::vector<std::byte> bytes;  // row-major, numel · dtype_size(type)

  [[nodiscard]] std::size_t numel() const {
    std::size_t n = 1;
    for (std::size_t e : shape) n *= e;
    return n;
  }
  template <class Scalar>
  [[nodiscard]] std::span<Scalar> values() {
    check_type<Scalar>();
    return {reinterpret_cast<Scalar*>(bytes.data()), bytes.size() / sizeof(Scalar)};
  }
  template <class Scalar>
  [[nodiscard]] std::span<const Scalar> values() const {
    check_type<Scalar>();
    return {reinterpret_cast<const Scalar*>(bytes.data()), bytes.size() / sizeof(Scalar)};
  }

  // A tensor of zeros.
  static tensor zeros(std::string name, std::vector<std::size_t> shape, kfsdp::dtype type) {
    tensor t{std::move(name), std::move(shape), type, {}};
    t.bytes.assign(t.numel() * io::dtype_size(type), std::byte{0});
    return t;
  }

 private:
  template <class Scalar>
  void check_type() const {
    if (dtype_of<Scalar> != type)
      throw std::invalid_argument(fmt::format("kfsdp::tensor '{}': dtype is {}, asked for {}", name,
                                              io::dtype_name(type), io::dtype_name(dtype_of<Scalar>)));
  }
};

KFSDP_EXPORT class state_dict {
 public:
  state_dict() = default;
  explicit state_dict(std::vector<tensor> tensors) : tensors_(std::move(tensors)) {}

  void add(tensor t) {
    if (find(t.name) != nullptr)
      throw std::invalid_argument("kfsdp::state_dict: '" + t.name + "' is already present");
    tensors_.push_back(std::move(t));
  }
  [[nodiscard]] const tensor* find(std::string_view name) const {
    for (const tensor& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  [[nodiscard]] tensor* find(std::string_view name) {
    for (tensor& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  [[nodiscard]] const tensor& at(std::string_view name) const {
    if (const tensor* t = find(name)) return *t;
    throw std::out_of_range("kfsdp::state_dict: no tensor named '" + std::string(name) + "'");
  }
  [[nodiscard]] tensor& at(std::string_view name) {
    return const_cast<tensor&>(static_cast<const state_dict&>(*this).at(name));
  }
  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  [[nodiscard]] bool empty() const noexcept { return tensors_.empty(); }
  [[nodiscard]] auto begin() const noexcept { return tensors_.begin(); }
  [[nodiscard]] auto end() const noexcept { return tensors_.end(); }
  [[nodiscard]] auto begin() noexcept { return tensors_.begin(); }
  [[nodiscard]] auto end() noexcept { return tensors_.end(); }

 private:
  std::vector<tensor> tensors_;
};

}  // namespace kfsdp
