/* The C API (kfsdp/infer/kfsdp_infer.h) from C99, over libheat_surrogate (examples/heat_surrogate_c.cpp):
 * errors come back as a status and a message naming the parameter, the value seen and the value
 * expected; predictions of rows together equal those of each row alone; the last free finalizes
 * the Kokkos the first load started, after which a load is refused.
 * usage: test_c_api MODEL.safetensors SCRATCH_DIR (run by test/examples/test_surrogate_c_api.py) */
#include <stdio.h>
#include <string.h>

#include <kfsdp/infer/kfsdp_infer.h>

static int failures = 0;

static void check(int condition, const char* what) {
  printf("%s %s\n", condition ? "ok  " : "FAIL", what);
  if (!condition) ++failures;
}

/* Whether the call gave `status` and a message containing `part`. */
static void check_error(int got, int status, const char* part, const char* what) {
  const char* message = kfsdp_last_error();
  const int matches = got == status && strstr(message, part) != NULL;
  printf("%s %s: status %d, \"%s\"\n", matches ? "ok  " : "FAIL", what, got, message);
  if (!matches) ++failures;
}

int main(int argc, char** argv) {
  kfsdp_model* model = NULL;
  kfsdp_model* other = (kfsdp_model*)&failures; /* a load that fails must set it to NULL */
  size_t in_features = 0, out_features = 0;
  static const double source[4] = {0.4, 0.6, 1.2, 0.08};
  double x[3 * 6], u[3], alone[3], spare[1];
  char path[4096];
  FILE* file;
  int r, c;
  if (argc != 3) {
    fprintf(stderr, "usage: test_c_api MODEL.safetensors SCRATCH_DIR\n");
    return 2;
  }
  check(strcmp(kfsdp_last_error(), "") == 0, "no message before a call fails");

  /* Loading: bad arguments, a missing file, a file that is no safetensors. */
  check_error(kfsdp_load(NULL, &model), KFSDP_INVALID_ARGUMENT, "kfsdp_load: path is NULL", "a NULL path");
  check_error(kfsdp_load(argv[1], NULL), KFSDP_INVALID_ARGUMENT, "kfsdp_load: model is NULL",
              "a NULL model address");
  snprintf(path, sizeof path, "%s/missing.safetensors", argv[2]);
  check_error(kfsdp_load(path, &other), KFSDP_LOAD_FAILED, "missing.safetensors", "a missing file");
  check(other == NULL, "a failed load sets the model to NULL");
  snprintf(path, sizeof path, "%s/garbage.safetensors", argv[2]);
  file = fopen(path, "w");
  fputs("not a safetensors file", file);
  fclose(file);
  check_error(kfsdp_load(path, &model), KFSDP_LOAD_FAILED, "garbage.safetensors",
              "a file that is no safetensors");

  snprintf(path, sizeof path, "%s/no-sizes.safetensors", argv[2]);
  file = fopen(path, "wb");
  fwrite("\x02\0\0\0\0\0\0\0{}", 1, 10, file); /* a safetensors file with no tensors and no metadata */
  fclose(file);
  check_error(kfsdp_load(path, &model), KFSDP_LOAD_FAILED,
              "no-sizes.safetensors: checkpoint metadata: no 'surrogate.width'",
              "a file without the surrogate's sizes (the factory's exception)");
  snprintf(path, sizeof path, "%s/bad-stats.safetensors", argv[2]); /* written by test_surrogate_c_api.py */
  check_error(kfsdp_load(path, &model), KFSDP_LOAD_FAILED,
              "'normalization.features.stddev' has 2 values, expected in_features = 6 (the model's)",
              "normalisation statistics that do not fit the model (io::stats_from_metadata)");
  snprintf(path, sizeof path, "%s/huge-depth.safetensors", argv[2]); /* written by test_surrogate_c_api.py */
  check_error(kfsdp_load(path, &model), KFSDP_LOAD_FAILED, "surrogate.depth 1000000000000) does not fit: it needs",
              "a depth of 1e12 is refused before the model is built (kfsdp::require_host_memory)");

  check(kfsdp_load(argv[1], &model) == KFSDP_OK && model != NULL, "the trained surrogate loads");
  if (model == NULL) {
    printf("%s\n", kfsdp_last_error());
    return 1;
  }
  check(
      kfsdp_features(model, &in_features, &out_features) == KFSDP_OK && in_features == 6 && out_features == 1,
      "kfsdp_features: 6 in, 1 out");
  check_error(kfsdp_features(NULL, &in_features, &out_features), KFSDP_INVALID_ARGUMENT,
              "kfsdp_features: model is NULL", "kfsdp_features of NULL");

  /* Predicting: sizes checked before anything is read. */
  for (r = 0; r < 3; ++r) /* nodes (x, y) along a diagonal, one source (x0, y0, amplitude, width) */
    for (c = 0; c < 6; ++c) x[r * 6 + c] = c < 2 ? 0.2 + 0.25 * r + 0.1 * c : source[c - 2];
  check_error(kfsdp_predict(model, x, 3, 5, u, 3), KFSDP_INVALID_ARGUMENT,
              "kfsdp_predict: features is 5, expected 6", "5 features");
  check_error(kfsdp_predict(model, x, 0, 6, u, 3), KFSDP_INVALID_ARGUMENT,
              "kfsdp_predict: rows is 0, expected at least 1", "0 rows");
  check_error(kfsdp_predict(model, NULL, 3, 6, u, 3), KFSDP_INVALID_ARGUMENT,
              "kfsdp_predict: inputs is NULL, expected rows * features = 18 values", "NULL inputs");
  check_error(kfsdp_predict(model, x, 3, 6, NULL, 3), KFSDP_INVALID_ARGUMENT,
              "kfsdp_predict: outputs is NULL, expected room for rows * out_features = 3 values",
              "NULL outputs");
  check_error(kfsdp_predict(model, x, 3, 6, u, 2), KFSDP_INVALID_ARGUMENT,
              "kfsdp_predict: outputs_length is 2, expected at least rows * out_features = 3",
              "too short outputs");
  check_error(kfsdp_predict(NULL, x, 3, 6, u, 3), KFSDP_INVALID_ARGUMENT, "kfsdp_predict: model is NULL",
              "a NULL model");

  check(kfsdp_predict(model, x, 3, 6, u, 3) == KFSDP_OK, "3 rows predict");
  for (r = 0; r < 3; ++r) {
    check(kfsdp_predict(model, x + 6 * r, 1, 6, spare, 1) == KFSDP_OK, "1 row predicts");
    alone[r] = spare[0];
  }
  for (r = 0; r < 3; ++r) {
    const double scale = u[r] < 0 ? -u[r] : u[r], difference = u[r] - alone[r];
    printf("     row %d: %.17g together, %.17g alone\n", r, u[r], alone[r]);
    check((difference < 0 ? -difference : difference) <= 1e-12 * scale && u[r] == u[r],
          "together as alone (1e-12)");
  }

  /* Freeing: NULL is nothing; the last model finalizes the Kokkos its load started. */
  kfsdp_free(NULL);
  kfsdp_free(model);
  check_error(kfsdp_load(argv[1], &model), KFSDP_KOKKOS_UNAVAILABLE,
              "Kokkos was finalized when the last model was freed", "a load after the last free");

  printf("test_c_api: %d checks failed\n", failures);
  return failures == 0 ? 0 : 1;
}
