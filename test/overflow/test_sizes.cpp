// Sizes near 2^64 through every path: descriptors with dyn sizes -> param_table -> shard plan ->
// the nn layers' buffers -> a network and a trainer built with them. Each must stop with
// std::overflow_error naming the operand before anything is allocated: an attempted huge
// allocation would throw Kokkos' own error here (and abort under ASan, allocation-size-too-big),
// a wrapped small one would be overrun (caught by ASan in scripts/test-sanitizers).
#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/meta/checked.hpp>
#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/param_table.hpp>
#include <kfsdp/nn/attention.hpp>
#include <kfsdp/nn/cross_entropy.hpp>
#include <kfsdp/nn/embedding.hpp>
#include <kfsdp/nn/linear.hpp>
#include <kfsdp/plan/shard_plan.hpp>
#include <kfsdp/compute/network.hpp>
#include <kfsdp/train/trainer.hpp>

#include <activation.hpp>
#include <layer_norm.hpp>
#include <mse.hpp>

namespace {

constexpr std::size_t pow2(unsigned e) { return std::size_t(1) << e; }

// Runs f, which must throw std::overflow_error whose message holds every one of `parts`.
template <class F>
void check_overflow(F&& f, std::initializer_list<std::string> parts) {
  std::string message;
  CHECK_THROWS_AS(
      [&] {
        try {
          f();
        } catch (const std::overflow_error& e) {
          message = e.what();
          throw;
        }
      }(),
      std::overflow_error);
  for (const std::string& part : parts) {
    INFO("message: ", message);
    CHECK(message.find(part) != std::string::npos);
  }
}

std::string text(std::size_t v) { return std::to_string(v); }

// A pass whose parameters are never reached: the sizes must stop the forward first.
struct no_params_pass final : kfsdp::pass_context<double> {
  kfsdp::layer_params<const double> bind_params(std::span<const std::size_t>) override { return {}; }
  kfsdp::layer_params<double> grads(std::span<const std::size_t>, bool) override { return {}; }
};

}  // namespace

TEST_CASE("checked_mul and checked_add name what is computed and the operands") {
  check_overflow([] { (void)kfsdp::checked_mul(pow2(40), pow2(30), [] { return "fc.weight's elements"; }); },
                 {"fc.weight's elements", text(pow2(40)), text(pow2(30)), "overflows 64 bits"});
  check_overflow([] { (void)kfsdp::checked_add(pow2(63), pow2(63), [] { return "a sum"; }); }, {"a sum", text(pow2(63))});
  CHECK(kfsdp::checked_mul(pow2(31), pow2(32), [] { return ""; }) == pow2(63));
  CHECK(kfsdp::checked_add(pow2(63) - 1, pow2(63), [] { return ""; }) == std::size_t(-1));
  static_assert(kfsdp::product_fits({pow2(32), pow2(31), 1}) && !kfsdp::product_fits({pow2(32), pow2(31), 2}));
  static_assert(kfsdp::scaled_extent<3, 64> == 192 && kfsdp::scaled_extent<3, kfsdp::dyn> == kfsdp::dyn);
}

TEST_CASE("descriptors with dyn sizes -> param_table") {
  using one = kfsdp::sequential<"", kfsdp::linear<"fc">>;
  // A linear with 2^63 input features and 2 outputs: 2^64 weight elements.
  check_overflow([] { (void)kfsdp::make_param_table(one(kfsdp::linear<"fc">(pow2(63), 2))); },
                 {"fc.weight", text(pow2(63))});
  using emb = kfsdp::sequential<"", kfsdp::embedding<"wte">>;
  check_overflow([] { (void)kfsdp::make_param_table(emb(kfsdp::embedding<"wte">(pow2(40), pow2(30)))); },
                 {"wte.weight", text(pow2(40)), text(pow2(30))});
}

TEST_CASE("param_table -> shard plan") {
  using one = kfsdp::sequential<"", kfsdp::linear<"fc">>;
  // 2^61 · 4 weight elements fit, but not their bytes once gathered.
  const auto table = kfsdp::make_param_table(one(kfsdp::linear<"fc">(4, pow2(61))));
  check_overflow([&] { (void)kfsdp::make_shard_plan(table, 1, kfsdp::bucketing::layer); }, {"bytes", "· 8"});
  // World size 2^60: every rank holds a padded row, 2^60 · 64 elements gathered.
  const auto small = kfsdp::make_param_table(kfsdp::sequential<"", kfsdp::linear<"fc", 64, 64>>{});
  check_overflow([&] { (void)kfsdp::make_shard_plan(small, pow2(60), kfsdp::bucketing::layer); },
                 {"fc.weight", text(pow2(60))});
}

TEST_CASE("the layers' buffer sizes") {
  // A linear with 2^63 features: its weight's bytes.
  check_overflow([] { kfsdp::nn::linear<double>(pow2(63), 1); }, {"linear", "weight", "bytes", text(pow2(63))});
  check_overflow([] { kfsdp::nn::linear<float>(pow2(62), 4); }, {"linear", "weight", "elements", text(pow2(62))});
  check_overflow([] { kfsdp::nn::embedding<double>(pow2(40), pow2(30)); }, {"embedding", "weight", text(pow2(40))});
  check_overflow([] { kfsdp::reference::layer_norm<double>(pow2(62)); }, {"layer_norm", "weight", text(pow2(62))});
  check_overflow([] { (void)kfsdp::reference::layer_norm<double>(16).make_cache(pow2(62)); },
                 {"layer_norm::make_cache", "mean", text(pow2(62))});
  check_overflow([] { (void)kfsdp::nn::cross_entropy<float>(256).make_cache(pow2(63)); },
                 {"cross_entropy::make_cache", text(pow2(63))});
  // Attention: 3 · dim, a window's heads · seq · seq, and batch · heads · seq · seq.
  check_overflow([] { kfsdp::nn::causal_self_attention<double>(pow2(63), 1, 1); }, {"in_features ((heads + 2 · kv_heads) · head_dim)", text(pow2(63))});
  check_overflow([] { kfsdp::nn::causal_self_attention<double>(64, 4, pow2(31)); }, {"probabilities", text(pow2(31))});
  check_overflow([] { (void)kfsdp::nn::causal_self_attention<double>(64, 4, 32).make_cache(pow2(62)); },
                 {"causal_self_attention::make_cache", "probs", text(pow2(57))});
  // Views too large for the kernels' int indices stop at the shape check: a batch of 2^40 rows.
  std::array<double, 4> storage{};
  const kfsdp::nn::const_matrix<double> huge(storage.data(), pow2(40), 4);
  const kfsdp::nn::matrix<double> huge_out(storage.data(), pow2(40), 4);
  check_overflow([&] { kfsdp::reference::mse_loss<double>(4).forward(huge, huge); }, {"mse_loss::forward", text(pow2(40))});
  check_overflow([&] { kfsdp::reference::activation<double>(kfsdp::reference::activation_kind::relu, 4).forward(huge, huge_out); },
                 {"activation::forward", text(pow2(40))});
}

TEST_CASE("a network built with them: the activations' sizes stop the forward") {
  using model = kfsdp::sequential<"", kfsdp::linear<"fc">, kfsdp::relu<>, kfsdp::mse<>>;
  const model m(kfsdp::linear<"fc">(pow2(30), pow2(30)), {}, {});
  kfsdp::network<model, double> net(m);
  no_params_pass pass;
  std::array<double, 4> storage{};
  // A batch of 2^40 rows × 2^30 features: fc's output [2^40, 2^30] has 2^70 elements.
  const kfsdp::nn::const_matrix<double> x(storage.data(), pow2(40), pow2(30));
  check_overflow([&] { (void)net.forward(pass, x); }, {"layer 'fc'", text(pow2(40)), text(pow2(30))});
  // 2^31 rows into a linear(4, 1): 16 GiB of output would fit 64 bits, the kernels' int rows do not.
  const model narrow(kfsdp::linear<"fc">(4, 1), {}, {});
  kfsdp::network<model, double> narrow_net(narrow);
  const kfsdp::nn::const_matrix<double> tall(storage.data(), pow2(31), 4);
  check_overflow([&] { (void)narrow_net.forward(pass, tall); }, {"layer 'fc'", text(pow2(31)), "rows", "at most 2147483647"});
}

TEST_CASE("a trainer built with them stops at its shard plan") {
  using model = kfsdp::sequential<"", kfsdp::linear<"fc">, kfsdp::mse<>>;
  kfsdp::comm::self one;
  check_overflow(
      [&] {
        kfsdp::trainer<model, double> t(model(kfsdp::linear<"fc">(4, pow2(61)), {}), one,
                                        {.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                         .bucketing_strategy = kfsdp::bucketing::layer});
      },
      {"make_shard_plan", "· 8"});
  using two = kfsdp::sequential<"", kfsdp::linear<"fc">>;
  check_overflow([&] { (void)kfsdp::make_param_table(two(kfsdp::linear<"fc">(pow2(63), 2))); }, {text(pow2(63))});
}
