#pragma once
// inline_string<Capacity> — a string with its characters inside the object, so that it can live
// in a constexpr table (std::string cannot outlive a constant evaluation).
//
//   inline_string<16> s("h");  s.append(".").append_number(3);  s.view() -> "h.3"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kfsdp {

template <std::size_t Capacity>
class inline_string {
 public:
  constexpr inline_string() noexcept = default;
  constexpr explicit inline_string(std::string_view text) { append(text); }

  constexpr inline_string& append(std::string_view text) {
    if (text.size() > Capacity - size_)
      throw std::length_error("kfsdp::inline_string: a name is longer than its capacity of " +
                              std::to_string(Capacity) + " characters");
    for (char c : text) chars_[size_++] = c;
    return *this;
  }

  constexpr inline_string& append_number(std::size_t value) {
    char digits[20]{};
    std::size_t count = 0;
    do {
      digits[count++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    char reversed[20]{};
    for (std::size_t i = 0; i < count; ++i) reversed[i] = digits[count - 1 - i];
    return append(std::string_view(reversed, count));
  }

  [[nodiscard]] constexpr std::string_view view() const noexcept { return {chars_, size_}; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] static constexpr std::size_t capacity() noexcept { return Capacity; }

  friend constexpr bool operator==(const inline_string& a, const inline_string& b) noexcept {
    return a.view() == b.view();
  }

 private:
  char chars_[Capacity]{};
  std::size_t size_ = 0;
};

}  // namespace kfsdp
