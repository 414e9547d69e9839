/* kfsdp_infer.h — a trained kfsdp model's forward from C (and Fortran, through kfsdp_infer.f90).
 *
 * The functions are implemented by a small shared library that compiles one model type
 * (kfsdp/infer/c_api.hpp, KFSDP_INFER_C_API; examples/heat_surrogate_c.cpp builds libheat_surrogate).
 * Every function but kfsdp_free and kfsdp_last_error returns a status: KFSDP_OK, or an error code
 * with a message in kfsdp_last_error(). No C++ exception leaves these functions.
 *
 *   kfsdp_model* model = NULL;
 *   if (kfsdp_load("surrogate.safetensors", &model) != KFSDP_OK) {
 *     fprintf(stderr, "%s\n", kfsdp_last_error());
 *     return 1;
 *   }
 *   double x[2 * 6] = {...}, u[2];                         // 2 rows of 6 features, row-major
 *   if (kfsdp_predict(model, x, 2, 6, u, 2) != KFSDP_OK) ...
 *   kfsdp_free(model);
 *
 * Kokkos: the first kfsdp_load starts Kokkos if it is not running, and the kfsdp_free of the last
 * model finalizes it again if kfsdp_load started it. Kokkos cannot start twice in a process, so a
 * kfsdp_load after that is refused (KFSDP_KOKKOS_UNAVAILABLE): keep a model loaded for as long as
 * the program predicts, or initialise Kokkos yourself (then it is never finalized here).
 * Call these functions from one thread at a time: a model reuses its buffers, and no concurrent use
 * of Kokkos' execution space is assumed. */
#ifndef KFSDP_INFER_H
#define KFSDP_INFER_H

#include <stddef.h>

/* Exported from the model's shared library even where it is built with -fvisibility=hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define KFSDP_INFER_API __attribute__((visibility("default")))
#else
#define KFSDP_INFER_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded model: its weights, normalisation and buffers (opaque). */
typedef struct kfsdp_model kfsdp_model;

/* The status every call returns (an int, for C and Fortran alike). */
enum {
  KFSDP_OK = 0,
  KFSDP_INVALID_ARGUMENT = 1,   /* a null pointer, or sizes that do not fit the model */
  KFSDP_LOAD_FAILED = 2,        /* the file is missing, unreadable, or does not fit the model */
  KFSDP_KOKKOS_UNAVAILABLE = 3, /* Kokkos cannot be started (it was finalized) */
  KFSDP_FAILED = 4              /* anything else (out of memory, an error inside the forward) */
};

/* Loads the weights, normalisation and sizes in the safetensors file `path` into a new model,
 * stored in *model (NULL on error). */
KFSDP_INFER_API int kfsdp_load(const char* path, kfsdp_model** model);

/* Features a row of inputs has, and a row of predictions. */
KFSDP_INFER_API int kfsdp_features(const kfsdp_model* model, size_t* in_features, size_t* out_features);

/* The predictions for `rows` rows of `features` inputs each (row-major: inputs[r * features + c]),
 * in the units of the training data: outputs[r * out_features + c], for which `outputs_length`
 * values (at least rows * out_features) are available. `features` must be the model's. */
KFSDP_INFER_API int kfsdp_predict(kfsdp_model* model, const double* inputs, size_t rows, size_t features,
                                  double* outputs, size_t outputs_length);

/* Frees a model (NULL: nothing); the last one finalizes Kokkos if kfsdp_load started it. */
KFSDP_INFER_API void kfsdp_free(kfsdp_model* model);

/* The message of the last call on this thread that failed ("" if none); valid until this
 * thread's next failing call. */
KFSDP_INFER_API const char* kfsdp_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* KFSDP_INFER_H */
