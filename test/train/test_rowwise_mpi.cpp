// A user's layer written as an expression, in a model trained with FSDP at 1-3 ranks: the
// README's RMSNorm among six other derived layers (every backward derived) trains world-size invariantly and passes the gradient
// checker; a user layer whose width disagrees with the layer before it is refused when the model
// is built, naming both layers.
#include <doctest/doctest.h>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/gradient_check.hpp>
#include <kfsdp/train/trainer.hpp>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// The README's layer of one's own, as written there.
template <kfsdp::fixed_string Name, std::size_t Dim>
struct rms_norm : kfsdp::rowwise<Name> {
  constexpr auto params() const { return std::array{kfsdp::param_decl{"gain", {Dim}, {kfsdp::init_rule::ones}}}; }
  static constexpr auto expression(auto x, auto gain) { return x * rsqrt(mean(x * x) + 1e-6) * gain; }
};

constexpr std::size_t width = 32;
// A surrogate of seven derived layers (the user's norm inside each residual hidden layer, each an FSDP
// unit; the built-ins' expression forms; swiglu halving 2·width): the compile time of such a model is this file's.
using surrogate = kfsdp::sequential<
    "", kfsdp::linear<"input", 4, width>, kfsdp::derived::gelu<>,
    kfsdp::repeat<"hidden", 2, kfsdp::residual<"", rms_norm<"norm", width>, kfsdp::linear<"fc", width, width>, kfsdp::derived::silu<>>>,
    kfsdp::derived::layer_norm<"final_norm", width>, kfsdp::linear<"up", width, 2 * width>, kfsdp::swiglu<"gated">,
    kfsdp::derived::tanh_layer<>, kfsdp::linear<"output", width, 2>, kfsdp::derived::mse<>>;

kfsdp::io::array_dataset samples() {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  constexpr std::size_t count = 72;
  std::vector<double> x(count * 4), y(count * 2);
  for (std::size_t i = 0; i < count; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < 4; ++j) s += double(j + 1) * (x[i * 4 + j] = u(rng));
    y[i * 2] = std::sin(s / 3);
    y[i * 2 + 1] = std::cos(s / 5);
  }
  return kfsdp::io::array_dataset(x, 4, y, 2);
}

std::vector<double> train(kfsdp::comm::any_communicator comm, const kfsdp::fsdp_options& options = {}) {
  const auto data = samples();
  kfsdp::trainer<surrogate, double> t(surrogate{}, comm, options);
  t.initialize(3);
  kfsdp::optim::adamw<double> adam(t.engine().plan().shard_numel, {.lr = 1e-2});
  const std::size_t ws = std::size_t(t.engine().world_size()), rank = std::size_t(t.engine().rank());
  std::vector<double> losses;
  for (std::size_t step = 0; step < 6; ++step) {
    auto [x, y] = data.rank_slice<double>(data.micro_batch(1, step, 12), rank, ws);
    losses.push_back(t.step({{x, y}}, adam, /*max_norm=*/1.0).loss);
  }
  return losses;
}

}  // namespace

TEST_CASE("a model with the user's expression layer trains world-size invariantly") {
  kfsdp::comm::mpi world;
  kfsdp::comm::self one;
  const std::vector<double> reference = train(one);
  CHECK(reference.back() < reference.front());  // it learns
  for (const auto& losses : {train(world, {.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                          .bucketing_strategy = kfsdp::bucketing::layer}),
                             train(world, {.sharding_strategy = kfsdp::sharding_strategy::zero2,
                                          .bucketing_strategy = kfsdp::bucketing::block})})
    for (std::size_t s = 0; s < reference.size(); ++s) {
      CAPTURE(s);
      CHECK(std::abs(losses[s] - reference[s]) <= 1e-10 * std::abs(reference[s]));
    }
}

TEST_CASE("the user's expression layer passes the gradient checker in f64") {
  const kfsdp::gradient_check_report report = kfsdp::check_gradients(rms_norm<"norm", width>{});
  INFO(report.worst, ": analytic ", report.analytic, ", numeric ", report.numeric);
  CHECK(report.checked == 6 * width + width);  // every input element and every gain
  CHECK(report.max_relative_error < 1e-8);
}

namespace {
// A hand-written layer with a per-feature parameter that does not say its width.
struct silent_width_op {
  template <class Layer> explicit silent_width_op(const Layer&) {}
  void forward(const kfsdp::layer_params<const double>&, kfsdp::nn::const_matrix<double>, kfsdp::nn::matrix<double>) {}
  void backward(const kfsdp::layer_params<const double>&, const kfsdp::layer_params<double>&, kfsdp::nn::const_matrix<double>,
                kfsdp::nn::matrix<double>) {}
};
template <kfsdp::fixed_string Name>
struct silent_width {
  static constexpr auto name = Name;
  static constexpr kfsdp::layer_kind kind = kfsdp::layer_kind::layer;
  constexpr auto params() const { return std::array{kfsdp::param_decl{"gain", {16}}}; }
  template <class S> using compute = silent_width_op;
};
template <class Model>
void build(kfsdp::comm::mpi& world) {
  kfsdp::trainer<Model, double> t(Model{}, world);
}
}  // namespace

TEST_CASE("a user layer narrower than its input is refused when the model is built, naming both layers") {
  kfsdp::comm::mpi world;
  using too_narrow = kfsdp::sequential<"", kfsdp::linear<"fc", 4, 256>, rms_norm<"norm", 128>,
                                       kfsdp::linear<"output", 128, 1>, kfsdp::mse<>>;
  CHECK_THROWS_WITH_AS(build<too_narrow>(world),
                       "kfsdp::network: layer 'norm' cannot take the 256 features 'fc' before it gives: "
                       "'(x * rsqrt((mean((x * x)) + 0.000001)))' (256 wide) * 'gain' (128 wide): the widths differ",
                       std::invalid_argument);
  using unsaid = kfsdp::sequential<"", kfsdp::linear<"fc", 4, 16>, silent_width<"scale">, kfsdp::linear<"output", 16, 1>,
                                   kfsdp::mse<>>;
  CHECK_THROWS_WITH_AS(build<unsaid>(world),
                       "kfsdp::network: layer 'scale' has parameter 'gain' [16] but does not say how many features it "
                       "takes: give it expected_in_features() (or write it as a kfsdp::rowwise expression, whose widths "
                       "are derived)",
                       std::invalid_argument);
  // The swiglu halves: 2·H in, H out, and the next layer must take H.
  using gated = kfsdp::sequential<"", kfsdp::linear<"up", 4, 10>, kfsdp::swiglu<"act">, kfsdp::linear<"down", 10, 1>,
                                  kfsdp::mse<>>;
  CHECK_THROWS_WITH_AS(build<gated>(world),
                       "kfsdp::network: layer 'down' takes 10 features, 'act' before it gives 5", std::invalid_argument);
}

TEST_CASE("a tie that cannot bind is refused when the model is built, naming the layer and the owner") {
  kfsdp::comm::mpi world;
  using missing = kfsdp::sequential<"", kfsdp::embedding<"wte", 8, 4>,
                                    kfsdp::tied<"wpe.weight", "weight", kfsdp::linear<"head", 4, 8, false>>,
                                    kfsdp::cross_entropy<"", 8>>;
  CHECK_THROWS_WITH_AS(build<missing>(world), "kfsdp::network: 'head' ties 'weight' to 'wpe.weight', which the model does not have",
                       std::invalid_argument);
  // The owner in block b's unit, the tied layer in the root's: the owner would not be gathered when it runs.
  using across = kfsdp::sequential<"", kfsdp::block<"b", kfsdp::embedding<"wte", 8, 4>>,
                                   kfsdp::tied<"b.wte.weight", "weight", kfsdp::linear<"head", 4, 8, false>>,
                                   kfsdp::cross_entropy<"", 8>>;
  CHECK_THROWS_WITH_AS(build<across>(world),
                       "kfsdp::network: 'head' (unit 0) ties to 'b.wte.weight' of unit 1; tie only to a parameter of the "
                       "root or of the same unit",
                       std::invalid_argument);
}
