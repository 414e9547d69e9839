#pragma once
// The heat-equation surrogate of train_surrogate and predict_surrogate: input layer, --depth
// residual hidden layers x + gelu(fc(x)) (each an FSDP unit), output layer, MSE; sizes at run time.
//
//   const auto model = kfsdp::examples::make_surrogate(64, 4);   // 6 -> 64 -> 4 x 64 -> 1

#include <cstddef>
#include <string_view>

#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/tensor/stateful.hpp>         // metadata_map, metadata_count
#include <kfsdp/meta/host_memory.hpp>        // require_host_memory
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

// Its parameters, counted before it is built, in doubles (absurd sizes stay absurd, never wrap):
// input 6·w + w, --depth layers of w·w + w, output w + 1.
inline double surrogate_parameters(std::size_t width, std::size_t depth) {
  const double w = double(width);
  return 7 * w + double(depth) * (w * w + w) + w + 1;
}

// The surrogate a file's metadata describes (surrogate.width and .depth, read strictly: "64abc" is
// refused), once the whole model in `scalar_bytes` fits this rank's memory: what --eval, the
// predictor and the C API build.
inline surrogate make_saved_surrogate(const kfsdp::io::metadata_map& saved, std::string_view file, std::size_t scalar_bytes) {
  const std::size_t width = kfsdp::io::metadata_count(saved, "surrogate.width");
  const std::size_t depth = kfsdp::io::metadata_count(saved, "surrogate.depth");
  kfsdp::require_host_memory(surrogate_parameters(width, depth) * double(scalar_bytes),
                             fmt::format("the model of {} (surrogate.width {}, surrogate.depth {})", file, width, depth));
  return make_surrogate(width, depth);
}

}  // namespace kfsdp::examples
