#pragma once
// Values for collective tests: what each rank contributes, and vectors of any element type compared
// by value (bf16 and f16 have no operator==).

#include <cstddef>
#include <vector>

#include <kfsdp/comm/communicator.hpp>

namespace kfsdp::test {

// The value rank `rank` contributes at position `index`: distinct for every (rank, index). For
// bf16 and f16, small integers instead (16*rank + index%16 + 1 <= 64, and every integer up to 256
// is exact in bf16), so that every partial sum over 4 ranks is exact too.
template <class T>
T contribution(int rank, std::size_t index) {
  if constexpr (comm::half_element<T>)
    return T(static_cast<float>(16 * rank + static_cast<int>(index % 16) + 1));
  else
    return static_cast<T>(100 * rank + static_cast<int>(index) + 1);
}

template <class T>
std::vector<T> contributions(int rank, std::size_t count) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = contribution<T>(rank, i);
  return values;
}

template <class T>
std::vector<double> values_of(const std::vector<T>& elements) {
  std::vector<double> values;
  for (const T& element : elements) values.push_back(static_cast<double>(element));
  return values;
}

}  // namespace kfsdp::test
