#pragma once
// A 1-D Kokkos view's values on the host, as doubles, to compare whole (==) or print.
//   CHECK(test::host_values(engine.shards().chunk(p)) == before);

#include <vector>

#include <Kokkos_Core.hpp>

namespace kfsdp::test {

template <class View>
std::vector<double> host_values(const View& v) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

}  // namespace kfsdp::test
