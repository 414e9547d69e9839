#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// fixed_string<N> — a string literal usable as a template argument (a structural type).
//
//   template <kfsdp::fixed_string Name> struct layer { static constexpr auto name = Name; };
//   layer<"c_attn">::name.view()  -> "c_attn"

#include <cstddef>
#include <string_view>

namespace kfsdp {

KFSDP_EXPORT template <std::size_t N>
struct fixed_string {
  char chars[N + 1]{};

  constexpr fixed_string(const char (&text)[N + 1]) noexcept {  // NOLINT: implicit on purpose
    for (std::size_t i = 0; i <= N; ++i) chars[i] = text[i];
  }
  [[nodiscard]] static constexpr std::size_t size() noexcept { return N; }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {chars, N}; }
};

template <std::size_t N>
fixed_string(const char (&)[N]) -> fixed_string<N - 1>;

}  // namespace kfsdp
