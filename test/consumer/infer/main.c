/* An outside C99 program over the installed model library, built with pkg-config alone
 * (scripts/test-consumer):
 *   cc -std=c99 main.c $(pkg-config --cflags --libs kfsdp-infer) -o infer-c
 *   ./infer-c MODEL.safetensors EXPECTED0 EXPECTED1      (make_model.py writes both)
 * Loads the model, checks its sizes, predicts two rows and compares with the expected values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <kfsdp/infer/kfsdp_infer.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: infer-c MODEL.safetensors EXPECTED0 EXPECTED1\n");
    return 2;
  }
  kfsdp_model* model = NULL;
  if (kfsdp_load(argv[1], &model) != KFSDP_OK) {
    fprintf(stderr, "infer-c: %s\n", kfsdp_last_error());
    return 1;
  }
  size_t in = 0, out = 0;
  double x[2 * 6], u[2];
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 6; ++c) x[r * 6 + c] = 0.1 * (c + 1) + 0.3 * r; /* make_model.py's rows */
  if (kfsdp_features(model, &in, &out) != KFSDP_OK || kfsdp_predict(model, x, 2, 6, u, 2) != KFSDP_OK) {
    fprintf(stderr, "infer-c: %s\n", kfsdp_last_error());
    kfsdp_free(model);
    return 1;
  }
  kfsdp_free(model);
  int ok = in == 6 && out == 1;
  for (int r = 0; r < 2; ++r) {
    const double expected = strtod(argv[2 + r], NULL);
    /* kfsdp's erf and Python's may differ in the last bits */
    ok = ok && fabs(u[r] - expected) <= 1e-12 * fabs(expected);
  }
  printf("infer-c: %zu -> %zu features, predictions %.17g %.17g%s\n", in, out, u[0], u[1],
         ok ? "" : " (FAILED: expected 6 -> 1 and make_model.py's values)");
  return ok ? 0 : 1;
}
