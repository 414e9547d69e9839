#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// A tensor's element type: safetensors' dtypes, under the names its headers use (kfsdp's parameters
// are F32 or F64). Here rather than in io/ because the engine's state dicts (tensor/state_dict.hpp)
// need it; the names stay in kfsdp::io, where the format defines them (defined in
// src/io/checkpoint/safetensors.cpp).
//
//   static_assert(kfsdp::io::dtype_of<float> == kfsdp::io::dtype::F32);
//   kfsdp::io::dtype_size(kfsdp::io::dtype::BF16);       // 2

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kfsdp::io {

/// Element types of safetensors (the names are those written in the header).
enum class dtype : std::uint8_t { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

/// The header name of a dtype: dtype_name(dtype::BF16) -> "BF16".
[[nodiscard]] std::string_view dtype_name(dtype type) noexcept;

/// Bytes per element: dtype_size(dtype::F32) -> 4.
[[nodiscard]] std::size_t dtype_size(dtype type) noexcept;

/// The dtype with this header name: parse_dtype("F64") -> dtype::F64, parse_dtype("f64") -> nullopt.
[[nodiscard]] std::optional<dtype> parse_dtype(std::string_view name) noexcept;

/// The dtype of a C++ scalar type: dtype_of<float> == dtype::F32.
KFSDP_EXPORT template <class Scalar>
inline constexpr dtype dtype_of = [] {
  static_assert(sizeof(Scalar) == 0,
                "dtype_of<Scalar>: no safetensors dtype for this type; use float, double, an "
                "integer type or bool");
  return dtype::U8;
}();
template <> inline constexpr dtype dtype_of<float> = dtype::F32;
template <> inline constexpr dtype dtype_of<double> = dtype::F64;
template <> inline constexpr dtype dtype_of<bool> = dtype::BOOL;
template <> inline constexpr dtype dtype_of<std::int8_t> = dtype::I8;
template <> inline constexpr dtype dtype_of<std::uint8_t> = dtype::U8;
template <> inline constexpr dtype dtype_of<std::int16_t> = dtype::I16;
template <> inline constexpr dtype dtype_of<std::uint16_t> = dtype::U16;
template <> inline constexpr dtype dtype_of<std::int32_t> = dtype::I32;
template <> inline constexpr dtype dtype_of<std::uint32_t> = dtype::U32;
template <> inline constexpr dtype dtype_of<std::int64_t> = dtype::I64;
template <> inline constexpr dtype dtype_of<std::uint64_t> = dtype::U64;

}  // namespace kfsdp::io
