#pragma once
// Device-callable math functions: Kokkos 4 has them in Kokkos::, Kokkos 3.4 in Kokkos::Experimental::.

#include <Kokkos_Core.hpp>

namespace kfsdp::nn::detail::math {

#if KOKKOS_VERSION >= 40000
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
#endif

}  // namespace kfsdp::nn::detail::math
