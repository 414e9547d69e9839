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
  return kfsdp::examples::make_saved_surrogate(saved, "the library's weights", sizeof(double));
}

}  // namespace

KFSDP_INFER_C_API(surrogate_from)
