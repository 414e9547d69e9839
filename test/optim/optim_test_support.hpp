#pragma once
// Helpers shared by the optimizer tests: host vectors in and out of 1-D views, deterministic data.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../support/messages.hpp"

namespace kfsdp::optim::test {

template <class Scalar>
Kokkos::View<Scalar*> to_view(const std::vector<Scalar>& values, const std::string& label = "values") {
  Kokkos::View<Scalar*> view(label, values.size());
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = values[i];
  Kokkos::deep_copy(view, host);
  return view;
}

template <class View>
auto to_vector(const View& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::vector<typename View::non_const_value_type> values(view.extent(0));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = host(i);
  return values;
}

// A fixed pseudo-random sequence in [-1, 1) with a few larger entries, the same on every machine.
template <class Scalar>
std::vector<Scalar> test_values(std::size_t count, unsigned seed) {
  std::vector<Scalar> values(count);
  unsigned state = seed * 2654435761u + 12345u;
  for (auto& value : values) {
    state = state * 1664525u + 1013904223u;
    value = static_cast<Scalar>(static_cast<double>(state >> 8) / double(1u << 23) - 1.0);
  }
  if (count > 3) values[3] *= Scalar(40);  // a large gradient
  return values;
}

// The message of the std::invalid_argument that `call` throws, or "" when it throws none.
template <class Call>
std::string invalid_argument_message(Call&& call) {
  return kfsdp::test::error_message(std::forward<Call>(call));
}

}  // namespace kfsdp::optim::test
