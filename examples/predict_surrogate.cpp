// predict_surrogate — the trained heat surrogate inside a solver: no MPI, no gradients, one process.
// Loads what train_surrogate --save wrote (weights, sizes and normalisation), predicts the test
// problems' temperatures and prints the relative L2 error, as train_surrogate --eval on does.
//
//   mpirun -np 2 build/examples/train_surrogate --save surrogate.safetensors
//   build/examples/predict_surrogate --load surrogate.safetensors
//
// kfsdp::predictor normalises the inputs and maps the predictions back with the statistics the
// file carries; `ldd build/examples/predict_surrogate` lists no MPI library. With --inputs FILE
// (6 numbers a row: x, y, x0, y0, amplitude, width) it prints those rows' predictions instead, one
// a line to 17 digits (what test_surrogate_c_api.py compares the C API's and Fortran's with).

#include <cmath>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/environment.hpp>
#include <kfsdp/infer/predictor.hpp>
#include <kfsdp/tensor/stateful.hpp>  // metadata_map, read_file_metadata

#include "cli.hpp"
#include "heat_problem.hpp"
#include "heat_surrogate.hpp"

// Every number in a text file, in order.
static std::vector<double> read_numbers(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("--inputs {} cannot be opened for reading", path));
  std::vector<double> numbers;
  for (double x; in >> x;) numbers.push_back(x);
  if (!in.eof()) throw std::invalid_argument(fmt::format("--inputs {}: not a number after {} numbers", path, numbers.size()));
  return numbers;
}

int main(int argc, char** argv) {
  kfsdp::environment kokkos_up(argc, argv);
  kfsdp::examples::cli c("predict_surrogate", "the heat surrogate's predictions on test problems, without MPI");
  c.flag("load", "surrogate.safetensors", "the weights train_surrogate --save wrote")
      .flag("test-problems", "32", "heat problems to predict (drawn with --test-seed)")
      .flag("test-seed", "1000", "the test problems' seed (train_surrogate's default)")
      .flag("grid", "10", "finite-difference grid n: each problem gives n * n samples")
      .flag("inputs", "", "a text file of rows of 6 features: print their predictions instead");
  try {
    if (!c.parse(argc, argv)) return 0;
    const std::string file = c.str("load");
    const auto test = kfsdp::examples::heat_samples(kfsdp::examples::random_sources(c.size("test-problems"), c.size("test-seed")),
                                                    c.positive("grid"));
    const kfsdp::io::metadata_map saved = kfsdp::io::read_file_metadata(file);  // the sizes train_surrogate recorded
    kfsdp::predictor<kfsdp::examples::surrogate, double> model(kfsdp::examples::make_saved_surrogate(saved, file, sizeof(double)),
                                                               file);
    if (const std::string inputs = c.str("inputs"); !inputs.empty()) {
      const std::vector<double> x = read_numbers(inputs);
      if (x.empty() || x.size() % 6 != 0)
        throw std::invalid_argument(fmt::format("--inputs {}: {} numbers, expected rows of 6 (x, y, x0, y0, amplitude, width)",
                                                inputs, x.size()));
      for (const double u : model.predict(x, x.size() / 6)) fmt::print("{:.17g}\n", u);
      return 0;
    }
    const std::vector<double> u = model.predict(test.features, test.count);
    double error = 0, norm = 0;
    for (std::size_t i = 0; i < test.count; ++i) {
      error += (u[i] - test.targets[i]) * (u[i] - test.targets[i]);
      norm += test.targets[i] * test.targets[i];
    }
    fmt::print("test relative L2 {:.9g} ({} samples, {} normalised by the file's statistics)\n", std::sqrt(error / norm),
               test.count, model.normalizes() ? "inputs and predictions" : "nothing");
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return 2;
  }
}
