// bench/blas — sgemm of every BLAS library given, side by side in one process, at the matrix products
// of one GPT training step (each linear layer's forward and two backward products, and attention's
// four per head), single-threaded; the figures behind the build's -Dblas default (docs/performance.md).
//
//   build/bench/bench_blas                                       (the libraries this build found)
//   build/bench/bench_blas --layers 6 --dim 512 --heads 8 --seq 128 --batch 8 --rounds 5
//   build/bench/bench_blas /usr/lib/x86_64-linux-gnu/libblis.so.4 ...   (any libraries exporting sgemm_)
//
// Each library is opened with dlopen(RTLD_LOCAL), so each call reaches that library's own sgemm_. The
// rounds interleave the libraries (a burst of load from elsewhere falls on all of them); each figure is
// the median over the rounds of a shape's median time. Row-major products go to the column-major
// sgemm_ as their transposes: C = op(A)·op(B) row-major is Cᵀ = op(B)ᵀ·op(A)ᵀ column-major.
#include <dlfcn.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace {

// The Fortran BLAS symbol every library exports (LP64: 32-bit integers).
using sgemm_function = void(const char*, const char*, const int*, const int*, const int*, const float*,
                            const float*, const int*, const float*, const int*, const float*, float*, const int*);

struct library {
  std::string path;
  sgemm_function* sgemm = nullptr;
};

// One row-major product C[m×n] = op(A)·op(B) with inner size k, and how many times a step does it.
struct product {
  std::string name;
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  int per_step = 1;
  double flops() const { return 2.0 * m * n * k; }
};

struct gpt_shape {
  int layers = 6, dim = 512, heads = 8, seq = 128, batch = 8, vocab = 256;
};

// Every matrix product of one step at one rank's tokens (= batch · seq):
//   linear in→out: forward y = x·Wᵀ (N,T), weight gradient dW += dyᵀ·x (T,N), input gradient dx = dy·W (N,N);
//   attention per (window, head), head size hd = dim / heads: scores q·kᵀ (N,T), out p·v (N,N), and in
//   backward dp = dout·vᵀ (N,T), dv = pᵀ·dout (T,N), dq = ds·k (N,N), dk = dsᵀ·q (T,N).
std::vector<product> step_products(const gpt_shape& g) {
  const int tokens = g.batch * g.seq, d = g.dim, t = g.seq, hd = g.dim / g.heads;
  std::vector<product> products;
  const auto linear = [&](std::string name, int in, int out, int count) {
    products.push_back({name + " fwd", false, true, tokens, out, in, count});
    products.push_back({name + " dW", true, false, out, in, tokens, count});
    products.push_back({name + " dx", false, false, tokens, in, out, count});
  };
  linear("c_attn", d, 3 * d, g.layers);
  linear("attn.c_proj", d, d, g.layers);
  linear("c_fc", d, 4 * d, g.layers);
  linear("mlp.c_proj", 4 * d, d, g.layers);
  linear("lm_head", d, g.vocab, 1);
  const int per_head = g.layers * g.batch * g.heads;
  products.push_back({"attn q.k^T (x2)", false, true, t, t, hd, 2 * per_head});   // scores, dp
  products.push_back({"attn p.v (x2)", false, false, t, hd, t, 2 * per_head});    // out, dq
  products.push_back({"attn p^T.dout (x2)", true, false, t, hd, t, 2 * per_head});  // dv, dk
  return products;
}

double seconds_of(const library& lib, const product& p, const std::vector<float>& a, const std::vector<float>& b,
                  std::vector<float>& c, int repeats) {
  // Row-major A is m×k ('N') or k×m ('T'); its leading dimension is its row length.
  const int lda = p.trans_a ? p.m : p.k, ldb = p.trans_b ? p.k : p.n, ldc = p.n;
  const float alpha = 1, beta = 0;
  const char* ta = p.trans_a ? "T" : "N";
  const char* tb = p.trans_b ? "T" : "N";
  std::vector<double> times;
  for (int r = 0; r < repeats + 1; ++r) {  // the first call warms up (packing buffers, caches)
    const auto start = std::chrono::steady_clock::now();
    lib.sgemm(tb, ta, &p.n, &p.m, &p.k, &alpha, b.data(), &ldb, a.data(), &lda, &beta, c.data(), &ldc);
    if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + std::ptrdiff_t(times.size() / 2), times.end());
  return times[times.size() / 2];
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + std::ptrdiff_t(values.size() / 2), values.end());
  return values[values.size() / 2];
}

int parse_int(std::string_view flag, std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || value < 1)
    throw std::invalid_argument(fmt::format("bench_blas: {} = '{}', expected a positive integer", flag, text));
  return value;
}

// The libraries of this build (-Dblas candidates found at configure time), from meson.
std::vector<std::string> configured_libraries() {
  std::vector<std::string> paths;
  std::string_view list = KFSDP_BENCH_BLAS_LIBRARIES;  // "path1;path2;..."
  while (!list.empty()) {
    const auto end = list.find(';');
    if (end != 0) paths.emplace_back(list.substr(0, end));
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return paths;
}

}  // namespace

int main(int argc, char** argv) try {
  gpt_shape shape;
  int rounds = 3, repeats = 10;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("bench_blas: {} needs a value", arg));
      return std::string_view(argv[++i]);
    };
    if (arg == "--help") {
      fmt::print("usage: bench_blas [--layers N --dim N --heads N --seq N --batch N --vocab N --rounds N "
                 "--repeats N] [libblas.so ...]\n(default: the BLAS libraries this build found: {})\n",
                 KFSDP_BENCH_BLAS_LIBRARIES);
      return 0;
    }
    if (arg == "--layers") shape.layers = parse_int(arg, value());
    else if (arg == "--dim") shape.dim = parse_int(arg, value());
    else if (arg == "--heads") shape.heads = parse_int(arg, value());
    else if (arg == "--seq") shape.seq = parse_int(arg, value());
    else if (arg == "--batch") shape.batch = parse_int(arg, value());
    else if (arg == "--vocab") shape.vocab = parse_int(arg, value());
    else if (arg == "--rounds") rounds = parse_int(arg, value());
    else if (arg == "--repeats") repeats = parse_int(arg, value());
    else if (arg.starts_with("--")) throw std::invalid_argument(fmt::format("bench_blas: unknown flag {}", arg));
    else paths.emplace_back(arg);
  }
  if (shape.dim % shape.heads != 0)
    throw std::invalid_argument(fmt::format("bench_blas: --dim {} is not a multiple of --heads {}", shape.dim, shape.heads));
  if (paths.empty()) paths = configured_libraries();

  // One thread each, as one rank per core runs them (set before a library reads them at load time).
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv("BLIS_NUM_THREADS", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("MKL_NUM_THREADS", "1", 1);
  setenv("MKL_THREADING_LAYER", "SEQUENTIAL", 1);
  std::vector<library> libraries;
  for (const auto& path : paths) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) throw std::runtime_error(fmt::format("bench_blas: cannot open {}: {}", path, dlerror()));
    auto* sgemm = reinterpret_cast<sgemm_function*>(dlsym(handle, "sgemm_"));
    if (sgemm == nullptr) throw std::runtime_error(fmt::format("bench_blas: {} has no sgemm_", path));
    libraries.push_back({path, sgemm});
  }

  const auto products = step_products(shape);
  std::size_t largest = 0;
  for (const auto& p : products) largest = std::max({largest, std::size_t(p.m) * p.k, std::size_t(p.k) * p.n, std::size_t(p.m) * p.n});
  std::vector<float> a(largest), b(largest), c(largest);
  for (std::size_t i = 0; i < largest; ++i) {  // ordinary floats in [-1, 1) from an integer hash
    const auto mixed = std::uint32_t(i * 2654435761U + 12345U);
    a[i] = float(mixed >> 8) / float(1U << 23) - 1.0F;
    b[i] = float((mixed * 2246822519U) >> 8) / float(1U << 23) - 1.0F;
  }

  // seconds[library][product]: every round's median.
  std::vector<std::vector<std::vector<double>>> seconds(libraries.size(), std::vector<std::vector<double>>(products.size()));
  for (int round = 0; round < rounds; ++round)
    for (std::size_t p = 0; p < products.size(); ++p)
      for (std::size_t l = 0; l < libraries.size(); ++l)
        seconds[l][p].push_back(seconds_of(libraries[l], products[p], a, b, c, repeats));

  fmt::print("# sgemm, 1 thread, GPT --layers {} --dim {} --heads {} --seq {} --batch {} --vocab {} ({} tokens); "
             "GFLOP/s, median of {} rounds x {} repeats\n",
             shape.layers, shape.dim, shape.heads, shape.seq, shape.batch, shape.vocab, shape.batch * shape.seq,
             rounds, repeats);
  for (std::size_t l = 0; l < libraries.size(); ++l) fmt::print("#   [{}] {}\n", l, libraries[l].path);
  fmt::print("{:<20} {:>2}{:>2} {:>6} {:>6} {:>6} {:>7}", "product", "A", "B", "m", "n", "k", "x/step");
  for (std::size_t l = 0; l < libraries.size(); ++l) fmt::print(" {:>8}", fmt::format("[{}]", l));
  fmt::print("\n");
  std::vector<double> step_seconds(libraries.size(), 0.0);
  double step_flops = 0;
  for (std::size_t p = 0; p < products.size(); ++p) {
    const auto& pr = products[p];
    fmt::print("{:<20} {:>2}{:>2} {:>6} {:>6} {:>6} {:>7}", pr.name, pr.trans_a ? "T" : "N", pr.trans_b ? "T" : "N", pr.m,
               pr.n, pr.k, pr.per_step);
    for (std::size_t l = 0; l < libraries.size(); ++l) {
      const double s = median(seconds[l][p]);
      step_seconds[l] += s * pr.per_step;
      fmt::print(" {:>8.1f}", pr.flops() / s / 1e9);
    }
    step_flops += pr.flops() * pr.per_step;
    fmt::print("\n");
  }
  fmt::print("{:<41} {:>7}", "one step's products (ms)", "");
  for (const double s : step_seconds) fmt::print(" {:>8.1f}", s * 1e3);
  fmt::print("\n{:<41} {:>7}", "one step's products (GFLOP/s)", "");
  for (const double s : step_seconds) fmt::print(" {:>8.1f}", step_flops / s / 1e9);
  fmt::print("\n");
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "{}\n", e.what());
  return 1;
}
