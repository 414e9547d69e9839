#pragma once
// The heat-equation surrogate of train_surrogate and predict_surrogate: input layer, --depth
// residual hidden layers x + gelu(fc(x)) (each an FSDP unit), output layer, MSE; sizes at run time.
//
//   const auto model = kfsdp::examples::make_surrogate(64, 4);   // 6 -> 64 -> 4 x 64 -> 1

#include <cstddef>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>
#endif

namespace kfsdp::examples {

// x + gelu(fc(x)), --depth times; sizes given at run time.
using hidden_layer = kfsdp::residual<"", kfsdp::linear<"fc">, kfsdp::gelu<>>;
using surrogate = kfsdp::sequential<"", kfsdp::linear<"input">, kfsdp::gelu<>, kfsdp::repeat<"hidden", kfsdp::dyn, hidden_layer>,
                                    kfsdp::linear<"output">, kfsdp::mse<>>;

inline surrogate make_surrogate(std::size_t width, std::size_t depth) {
  return surrogate({6, width}, {}, {depth, hidden_layer({width, width}, {})}, {width, 1}, {});
}

}  // namespace kfsdp::examples
