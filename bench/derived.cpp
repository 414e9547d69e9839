// bench_derived: each layer whose backward kfsdp derives from an expression (kfsdp::derived::*,
// model/rowwise.hpp) against the hand-written kernel it matches (reference/), forward and backward,
// through the layer contract the network calls (compute_t<Layer, float>), at the GPT's shapes:
// rows 8 · 64 = 512, dim 128 and 512 (the activations 4 · dim wide). Within every repeat the two
// forms run in turn and the median of each is printed with their ratio (derived / hand-written: below
// 1 is faster).
//
//   build/bench/bench_derived [--repeats N] [--rows R]
//
// Prints figures; it never fails on a timing.

#include <fmt/format.h>

#include <kfsdp/environment.hpp>
#include <kfsdp/compute/ops.hpp>

#include <hand_written.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using S = float;

struct timing {
  std::vector<double> hand_forward, derived_forward, hand_backward, derived_backward;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  Kokkos::fence();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class View>
View random_view(View v, std::mt19937_64& random) {
  std::normal_distribution<double> normal(0.0, 1.0);
  auto host = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < host.size(); ++i) host.data()[i] = S(normal(random));
  Kokkos::deep_copy(v, host);
  return v;
}

// The four calls in turn every repeat (the first warms up), then a row of medians and ratios.
template <class HF, class HB, class DF, class DB>
void time_and_print(std::string_view name, std::size_t rows, std::size_t width, std::size_t repeats, HF hand_forward,
                    HB hand_backward, DF derived_forward, DB derived_backward) {
  timing t;
  for (std::size_t r = 0; r <= repeats; ++r) {
    const double hf = seconds(hand_forward), hb = seconds(hand_backward);
    const double df = seconds(derived_forward), db = seconds(derived_backward);
    if (r == 0) continue;
    t.hand_forward.push_back(hf);
    t.hand_backward.push_back(hb);
    t.derived_forward.push_back(df);
    t.derived_backward.push_back(db);
  }
  const double hf = median(t.hand_forward), df = median(t.derived_forward);
  const double hb = median(t.hand_backward), db = median(t.derived_backward);
  fmt::print("{:<12} {:>11} {:>9.4f} {:>9.4f} {:>6.2f} {:>9.4f} {:>9.4f} {:>6.2f}\n", name, fmt::format("[{}, {}]", rows, width),
             hf * 1e3, df * 1e3, df / hf, hb * 1e3, db * 1e3, db / hb);
}

// Hand-written layer H against derived layer D on [rows, width] (features -> features).
template <class H, class D>
void compare(std::string_view name, const H& hand_layer, const D& derived_layer, std::size_t rows, std::size_t width,
             std::size_t repeats) {
  std::mt19937_64 random(1);
  const auto decls = derived_layer.params();
  std::vector<kfsdp::param_info> infos(decls.size());
  std::vector<Kokkos::View<S*>> values, grads;
  kfsdp::layer_params<const S> p;
  kfsdp::layer_params<S> g;
  for (std::size_t i = 0; i < decls.size(); ++i) {
    infos[i].name = kfsdp::inline_string<kfsdp::max_param_name>(decls[i].name);
    infos[i].rank = 1;
    infos[i].shape[0] = infos[i].numel = decls[i].shape[0];
    values.push_back(random_view(Kokkos::View<S*>("p", infos[i].numel), random));
    grads.emplace_back("g", infos[i].numel);
  }
  for (std::size_t i = 0; i < decls.size(); ++i) {
    p.push(values[i], infos[i]);
    g.push(grads[i], infos[i]);
  }
  const auto x = random_view(kfsdp::nn::matrix<S>("x", rows, width), random);
  const auto dy = random_view(kfsdp::nn::matrix<S>("dy", rows, width), random);
  kfsdp::nn::matrix<S> y("y", rows, width), dx("dx", rows, width);
  kfsdp::reference::hand_written_t<H, S> hand(hand_layer);
  kfsdp::compute_t<D, S> derived(derived_layer);
  time_and_print(name, rows, width, repeats, [&] { hand.forward(p, x, y); }, [&] { hand.backward(p, g, dy, dx); },
                 [&] { derived.forward(p, x, y); }, [&] { derived.backward(p, g, dy, dx); });
}

void compare_mse(std::size_t rows, std::size_t width, std::size_t repeats) {
  std::mt19937_64 random(2);
  const auto x = random_view(kfsdp::nn::matrix<S>("x", rows, width), random);
  const auto target = random_view(kfsdp::nn::matrix<S>("t", rows, width), random);
  kfsdp::nn::matrix<S> dx("dx", rows, width);
  kfsdp::reference::hand_written_t<kfsdp::mse<>, S> hand(kfsdp::mse<>{});
  kfsdp::compute_t<kfsdp::derived::mse<>, S> derived(kfsdp::derived::mse<>{});
  time_and_print("mse", rows, width, repeats, [&] { (void)hand.forward(x, target); },
                 [&] { hand.backward(S(1) / S(rows), dx); }, [&] { (void)derived.forward(x, target); },
                 [&] { derived.backward(S(1) / S(rows), dx); });
}

template <std::size_t Dim>
void compare_all(std::size_t rows, std::size_t repeats) {
  compare("layer_norm", kfsdp::layer_norm<"ln", Dim>{}, kfsdp::derived::layer_norm<"ln", Dim>{}, rows, Dim, repeats);
  compare("gelu", kfsdp::gelu<>{}, kfsdp::derived::gelu<>{}, rows, 4 * Dim, repeats);
  compare("gelu_tanh", kfsdp::gelu_tanh<>{}, kfsdp::derived::gelu_tanh<>{}, rows, 4 * Dim, repeats);
  compare("silu", kfsdp::silu<>{}, kfsdp::derived::silu<>{}, rows, 4 * Dim, repeats);
  compare("relu", kfsdp::relu<>{}, kfsdp::derived::relu<>{}, rows, 4 * Dim, repeats);
  compare("tanh", kfsdp::tanh_layer<>{}, kfsdp::derived::tanh_layer<>{}, rows, 4 * Dim, repeats);
  compare_mse(rows, Dim, repeats);
}

}  // namespace

int main(int argc, char** argv) {
  kfsdp::environment kokkos(argc, argv);
  std::size_t repeats = 50, rows = 512;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i], text = argv[i + 1];
    std::size_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || value == 0) {
      fmt::print(stderr, "error: bench_derived: {} is '{}', expected a positive integer\n", flag, text);
      return 2;
    }
    if (flag == "--repeats") repeats = value;
    else if (flag == "--rows") rows = value;
    else {
      fmt::print(stderr, "error: bench_derived: unknown flag {} (flags: --repeats, --rows)\n", flag);
      return 2;
    }
  }
  if (argc % 2 == 0) {
    fmt::print(stderr, "error: bench_derived: {} needs a value\n", argv[argc - 1]);
    return 2;
  }
  fmt::print("bench_derived: f32, {} repeats, median ms; ratio = derived / hand-written\n", repeats);
  fmt::print("{:<12} {:>11} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6}\n", "layer", "shape", "hand fwd", "drv fwd", "ratio",
             "hand bwd", "drv bwd", "ratio");
  compare_all<128>(rows, repeats);
  compare_all<512>(rows, repeats);
}
