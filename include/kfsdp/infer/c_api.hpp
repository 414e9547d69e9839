#pragma once
// kfsdp/infer/c_api.hpp — the C API of kfsdp/infer/kfsdp_infer.h for one model type, defined in a
// small shared library of the user's (linked with the kfsdp library only, no MPI). A factory builds the
// model the file's metadata describes; KFSDP_INFER_C_API defines the extern "C" functions over a
// kfsdp::predictor<Model, double>:
//
//   #include <kfsdp/infer/c_api.hpp>
//   surrogate surrogate_from(const kfsdp::io::metadata_map& saved) {     // sizes from the metadata
//     const std::size_t width = kfsdp::io::metadata_count(saved, "surrogate.width");
//     return make_surrogate(width, kfsdp::io::metadata_count(saved, "surrogate.depth"));
//   }
//   KFSDP_INFER_C_API(surrogate_from)
//
// Every exception (the factory's included) becomes a status and kfsdp_last_error's message: none
// crosses the C boundary. One such library defines the kfsdp_* symbols: load one per process.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <Kokkos_Core.hpp>

#include <kfsdp/infer/kfsdp_infer.h>

#include <kfsdp/environment.hpp>
#include <kfsdp/infer/predictor.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/tensor/stateful.hpp>  // metadata_count, for the factory

// The C header's opaque type: a model of any type behind the C functions.
struct kfsdp_model {
  kfsdp_model() = default;
  virtual ~kfsdp_model() = default;
  kfsdp_model(const kfsdp_model&) = delete;
  kfsdp_model& operator=(const kfsdp_model&) = delete;
  virtual std::vector<double> predict(std::span<const double> inputs, std::size_t rows) = 0;
  std::size_t in_features = 0, out_features = 0;
};

namespace kfsdp::c_api {

namespace detail {

template <class Model>
class served_model final : public kfsdp_model {
 public:
  served_model(const Model& model, const std::string& path) : predictor_(model, path) {
    in_features = predictor_.in_features();
    out_features = predictor_.out_features();
  }
  std::vector<double> predict(std::span<const double> inputs, std::size_t rows) override {
    return predictor_.predict(inputs, rows);
  }

 private:
  predictor<Model, double> predictor_;  // built in place: its forward context refers to it
};

// The message of this thread's last failed call (kfsdp_last_error).
inline std::string& last_error() {
  thread_local std::string message;
  return message;
}

inline int fail(int status, std::string_view message) noexcept {
  try {
    last_error().assign(message);
  } catch (...) {
    last_error().clear();  // no memory for the message: better none than a stale one
  }
  return status;
}

// Kokkos for the loaded models: started by the first load if nobody had, finalized with the last free.
struct kokkos_use {
  std::mutex mutex;
  std::size_t models = 0;
  std::unique_ptr<environment> started;  // Kokkos, where a load started it
  bool finalized = false;                // by the last free: Kokkos cannot start again
};
inline kokkos_use& kokkos() {
  static kokkos_use use;
  return use;
}

// Thrown where Kokkos cannot be started; becomes KFSDP_KOKKOS_UNAVAILABLE.
struct kokkos_unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs `body` (which returns a status), turning whatever it throws into a status and a message.
template <class Body>
int guarded(const char* function, int error_status, Body&& body) noexcept {
  try {
    return body();
  } catch (const kokkos_unavailable& e) {
    return fail(KFSDP_KOKKOS_UNAVAILABLE, fmt::format("{}: {}", function, e.what()));
  } catch (const std::bad_alloc&) {
    return fail(KFSDP_FAILED, std::string(function) + ": out of memory");
  } catch (const std::exception& e) {
    try {
      return fail(error_status, fmt::format("{}: {}", function, e.what()));
    } catch (...) {
      return fail(error_status, function);
    }
  } catch (...) {
    return fail(KFSDP_FAILED, std::string(function) + ": an unknown exception");
  }
}

}  // namespace detail

/// kfsdp_load for the models `make_model(metadata)` builds from the file's metadata.
template <class Factory>
int load(const char* path, kfsdp_model** model, Factory&& make_model) noexcept {
  if (model == nullptr)
    return detail::fail(KFSDP_INVALID_ARGUMENT,
                        "kfsdp_load: model is NULL, expected the address of a kfsdp_model* to set");
  *model = nullptr;
  if (path == nullptr)
    return detail::fail(KFSDP_INVALID_ARGUMENT, "kfsdp_load: path is NULL, expected a safetensors file");
  return detail::guarded("kfsdp_load", KFSDP_LOAD_FAILED, [&] {
    detail::kokkos_use& kokkos = detail::kokkos();
    const std::lock_guard<std::mutex> lock(kokkos.mutex);
    if (kokkos.finalized)
      throw detail::kokkos_unavailable(
          "Kokkos was finalized when the last model was freed, and it cannot start twice in a process "
          "(keep a model loaded while the program predicts, or initialise Kokkos yourself)");
#if KOKKOS_VERSION >= 40000
    if (Kokkos::is_finalized())
      throw detail::kokkos_unavailable(
          "Kokkos was finalized by the program, and it cannot start twice in a process");
#endif
    // A failed load leaves Kokkos running: the next load may succeed, and the last free finalizes it.
    if (!Kokkos::is_initialized()) kokkos.started = std::make_unique<environment>();
    const io::metadata_map metadata = io::read_file_metadata(path);
    using model_type = std::remove_cvref_t<std::invoke_result_t<Factory&, const io::metadata_map&>>;
    const auto built = [&]() -> model_type {
      try {
        return make_model(metadata);
      } catch (const std::bad_alloc&) {
        throw;
      } catch (const std::exception& e) {  // the factory knows the metadata, not the file: name it
        throw std::invalid_argument(fmt::format("{}: {}", path, e.what()));
      }
    };
    *model = new detail::served_model<model_type>(built(), path);
    ++kokkos.models;
    return int(KFSDP_OK);
  });
}

/// kfsdp_features.
inline int features(const kfsdp_model* model, std::size_t* in_features, std::size_t* out_features) noexcept {
  if (model == nullptr)
    return detail::fail(KFSDP_INVALID_ARGUMENT, "kfsdp_features: model is NULL, expected a loaded model");
  if (in_features == nullptr || out_features == nullptr)
    return detail::fail(KFSDP_INVALID_ARGUMENT,
                        in_features == nullptr ? "kfsdp_features: in_features is NULL, expected a size_t*"
                                               : "kfsdp_features: out_features is NULL, expected a size_t*");
  *in_features = model->in_features;
  *out_features = model->out_features;
  return KFSDP_OK;
}

/// kfsdp_predict: the sizes checked against the model's before anything is read.
inline int predict(kfsdp_model* model, const double* inputs, std::size_t rows, std::size_t features,
                   double* outputs, std::size_t outputs_length) noexcept {
  return detail::guarded("kfsdp_predict", KFSDP_FAILED, [&] {
    const auto refuse = [](std::string message) { return detail::fail(KFSDP_INVALID_ARGUMENT, message); };
    if (model == nullptr) return refuse("kfsdp_predict: model is NULL, expected a loaded model");
    if (features != model->in_features)
      return refuse(fmt::format("kfsdp_predict: features is {}, expected {} (the model's input features)",
                                features, model->in_features));
    if (rows == 0) return refuse("kfsdp_predict: rows is 0, expected at least 1");
    if (rows > SIZE_MAX / features || rows > SIZE_MAX / model->out_features)
      return refuse(fmt::format("kfsdp_predict: rows is {}, more than a size_t counts values of", rows));
    if (inputs == nullptr)
      return refuse(fmt::format("kfsdp_predict: inputs is NULL, expected rows * features = {} values",
                                rows * features));
    if (outputs == nullptr)
      return refuse(
          fmt::format("kfsdp_predict: outputs is NULL, expected room for rows * out_features = {} values",
                      rows * model->out_features));
    if (outputs_length < rows * model->out_features)
      return refuse(
          fmt::format("kfsdp_predict: outputs_length is {}, expected at least rows * out_features = {}",
                      outputs_length, rows * model->out_features));
    const std::vector<double> predicted =
        model->predict(std::span<const double>(inputs, rows * features), rows);
    std::copy(predicted.begin(), predicted.end(), outputs);
    return int(KFSDP_OK);
  });
}

/// kfsdp_free: the last model finalizes Kokkos where a load started it.
inline void free_model(kfsdp_model* model) noexcept {
  if (model == nullptr) return;
  delete model;  // its views go before Kokkos might
  detail::kokkos_use& kokkos = detail::kokkos();
  const std::lock_guard<std::mutex> lock(kokkos.mutex);
  if (--kokkos.models == 0 && kokkos.started) {
    kokkos.started.reset();
    kokkos.finalized = true;
  }
}

/// kfsdp_last_error.
inline const char* last_error() noexcept { return detail::last_error().c_str(); }

}  // namespace kfsdp::c_api

/// Defines kfsdp_infer.h's functions for the model `make_model(const kfsdp::io::metadata_map&)`
/// returns; use it once, in the model's shared library.
#define KFSDP_INFER_C_API(make_model)                                                                  \
  extern "C" int kfsdp_load(const char* path, kfsdp_model** model) {                                   \
    return ::kfsdp::c_api::load(path, model, make_model);                                              \
  }                                                                                                    \
  extern "C" int kfsdp_features(const kfsdp_model* model, size_t* in_features, size_t* out_features) { \
    return ::kfsdp::c_api::features(model, in_features, out_features);                                 \
  }                                                                                                    \
  extern "C" int kfsdp_predict(kfsdp_model* model, const double* inputs, size_t rows, size_t features, \
                               double* outputs, size_t outputs_length) {                               \
    return ::kfsdp::c_api::predict(model, inputs, rows, features, outputs, outputs_length);            \
  }                                                                                                    \
  extern "C" void kfsdp_free(kfsdp_model* model) { ::kfsdp::c_api::free_model(model); }                \
  extern "C" const char* kfsdp_last_error(void) { return ::kfsdp::c_api::last_error(); }
