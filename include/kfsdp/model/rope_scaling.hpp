#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// RoPE's frequencies under transformers' rope_type "default", "linear" (positions divided by factor)
// and "llama3" (Llama 3.1 / 3.2 / 3.3: long wavelengths divided by factor, short ones kept, the
// band between blended), each computed in Scalar with transformers' operations in transformers'
// order, so that float's inv_freq is transformers' to the bit.
//   llama3, factor 8, low 1, high 4, original 8192: a pair with wavelength 2π / inv_freq
//     under 8192 / 4 = 2048 keeps inv_freq, over 8192 / 1 = 8192 takes inv_freq / 8, between blends.
//
//   kfsdp::rope_scaling s{.type = kfsdp::rope_type::llama3, .factor = 32, .original_max_position_embeddings = 8192};
//   float f = s.inverse_frequency<float>(/*pair=*/3, /*head_dim=*/64, /*theta=*/5e5);

#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>

namespace kfsdp {

KFSDP_EXPORT enum class rope_type { default_, linear, llama3 };

KFSDP_EXPORT struct rope_scaling {
  rope_type type = rope_type::default_;
  double factor = 1.0;                                 // linear, llama3
  double low_freq_factor = 1.0;                        // llama3
  double high_freq_factor = 4.0;                       // llama3
  std::size_t original_max_position_embeddings = 8192;  // llama3

  // transformers' inv_freq of pair i (0 ≤ i < head_dim / 2), as _compute_default_rope_parameters,
  // _compute_linear_scaling_rope_parameters and _compute_llama3_parameters make it.
  template <class Scalar>
  Scalar inverse_frequency(std::size_t i, std::size_t head_dim, double theta) const {
    // 1.0 / (base ** (arange(0, hd, 2).float() / hd)): the unscaled frequency every type starts from.
    const Scalar inv_freq = Scalar(1) / std::pow(Scalar(theta), Scalar(2 * i) / Scalar(head_dim));
    if (type == rope_type::linear) return inv_freq / Scalar(factor);
    if (type != rope_type::llama3) return inv_freq;
    const double old_context = double(original_max_position_embeddings);
    // torch computes `scalar / tensor` as reciprocal(tensor) · scalar, and compares in the tensor's type.
    const Scalar wavelen = (Scalar(1) / inv_freq) * Scalar(2 * std::numbers::pi);
    if (wavelen > Scalar(old_context / low_freq_factor)) return inv_freq / Scalar(factor);
    if (wavelen < Scalar(old_context / high_freq_factor)) return inv_freq;
    const Scalar smooth = ((Scalar(1) / wavelen) * Scalar(old_context) - Scalar(low_freq_factor)) /
                          Scalar(high_freq_factor - low_freq_factor);
    return (Scalar(1) - smooth) * inv_freq / Scalar(factor) + smooth * inv_freq;
  }

  // Throws std::invalid_argument naming the factor that would divide by zero or reverse the band.
  constexpr void validate() const {
    const auto fail = [](const char* name, double value, const char* expected) {
      throw std::invalid_argument(std::string("kfsdp::rope_scaling: ") + name + " is " + std::to_string(value) +
                                  ", expected " + expected);
    };
    const auto finite_positive = [](double value) { return value > 0.0 && value < std::numeric_limits<double>::infinity(); };
    if (type == rope_type::default_) return;
    if (!finite_positive(factor)) fail("factor", factor, "a finite positive number");
    if (type != rope_type::llama3) return;
    if (!finite_positive(low_freq_factor)) fail("low_freq_factor", low_freq_factor, "a finite positive number");
    if (!finite_positive(high_freq_factor) || !(high_freq_factor > low_freq_factor))
      fail("high_freq_factor", high_freq_factor, "a finite number above low_freq_factor");
    if (original_max_position_embeddings == 0) fail("original_max_position_embeddings", 0, "at least 1");
  }

  friend constexpr bool operator==(const rope_scaling&, const rope_scaling&) = default;
};

}  // namespace kfsdp
