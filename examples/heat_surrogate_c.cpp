// libheat_surrogate — the heat surrogate behind the C API (kfsdp/infer/kfsdp_infer.h), for solvers
// in C or Fortran (examples/heat_solver.f90). Links the kfsdp library only: no MPI.
//
//   mpirun -np 2 build/examples/train_surrogate --save surrogate.safetensors
//   cc solver.c -Iinclude -Lbuild/examples -lheat_surrogate   # kfsdp_load("surrogate.safetensors", &model)

#include <cstddef>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include <kfsdp/infer/c_api.hpp>

#include "heat_surrogate.hpp"

namespace {

// The sizes train_surrogate --save recorded in the file's metadata.
kfsdp::examples::surrogate surrogate_from(const kfsdp::io::metadata_map& saved) {
  const auto size = [&](const char* key) {  // strict: "64abc" is refused
    return kfsdp::io::metadata_count(saved, key);
  };
  const std::size_t width = size("surrogate.width");  // one statement each: argument order is unspecified
  return kfsdp::examples::make_surrogate(width, size("surrogate.depth"));
}

}  // namespace

KFSDP_INFER_C_API(surrogate_from)
