#pragma once
// Device-callable math functions, wherever this Kokkos keeps them: Kokkos 3.7 moved them from
// Kokkos::Experimental:: to Kokkos::. Kernels write kfsdp::math::sqrt(x) and so on.

#include <Kokkos_Core.hpp>

namespace kfsdp::math {

#if KOKKOS_VERSION >= 30700
using Kokkos::cos;
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

}  // namespace kfsdp::math
