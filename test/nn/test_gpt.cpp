// Tests of include/kfsdp/nn/gpt.hpp: the tiny GPT (L = 2, D = 16, H = 2, T = 8, B = 2).
#include "nn_test_helpers.hpp"

#include <kfsdp/nn/gpt.hpp>


using namespace kfsdp::nn;
using namespace kfsdp::nn::testing;

namespace {

const gpt_config tiny{.layers = 2, .dim = 16, .heads = 2, .seq = 8, .vocab = 256};
constexpr std::size_t tiny_batch = 2;

std::vector<int> bytes_of(const std::string& text, std::size_t from, std::size_t count) {
  std::vector<int> ids;
  for (std::size_t i = 0; i < count; ++i) ids.push_back(int(static_cast<unsigned char>(text[from + i])));
  return ids;
}

const std::string text = "To be, or not to be, that is the question: whether 'tis nobler";

}  // namespace

TEST_CASE("gpt: the loss at random init is close to ln(256)") {
  auto params = allocate_gpt_tensors<double>(tiny);
  init_gpt2(params, tiny, 1);
  gpt<double> model(tiny, tiny_batch);
  model.set_batch(bytes_of(text, 0, 16), bytes_of(text, 1, 16));
  const double loss = model.forward_all(params);
  MESSAGE("loss at init " << loss << ", ln 256 = " << std::log(256.0));
  CHECK(loss == doctest::Approx(std::log(256.0)).epsilon(0.02));
}

TEST_CASE("gpt: stage-wise gradients match central differences (double)") {
  auto params = allocate_gpt_tensors<double>(tiny);
  auto grads = allocate_gpt_tensors<double>(tiny);
  init_gpt2(params, tiny, 2);
  // Bigger weights than at init, so that every path carries a gradient well above rounding.
  std::uint64_t seed = 100;
  for_each_tensor(params, [&seed](const std::string& name, const auto& view) {
    if (name.find("ln_") == std::string::npos) fill_uniform(view, seed++, -0.3, 0.3);
  });
  gpt<double> model(tiny, tiny_batch);
  model.set_batch(bytes_of(text, 3, 16), bytes_of(text, 4, 16));
  const gpt_tensors<const double> weights = params;
  for (std::size_t s = 0; s < model.stages(); ++s) model.forward(s, weights.stage(s));
  for (std::size_t s = model.stages(); s-- > 0;) model.backward(s, weights.stage(s), grads.stage(s));
  auto loss = [&] { return model.forward_all(weights); };
  // A few entries of every tensor, against the gradient tensor of the same name.
  for_each_tensor(params, [&](const std::string& name, const auto& view) {
    for_each_tensor(grads, [&](const std::string& grad_name, const auto& grad) {
      if (grad_name == name) check_gradient(name, view, grad, loss, 6);
    });
  });
}

TEST_CASE("gpt: stages run in order and take the tensors of their kind") {
  auto params = allocate_gpt_tensors<double>(tiny);
  const gpt_tensors<const double> weights = params;
  gpt<double> model(tiny, tiny_batch);
  CHECK_THROWS_AS(model.forward(0, weights.stage(0)), std::logic_error);  // no batch yet
  model.set_batch(bytes_of(text, 0, 16), bytes_of(text, 1, 16));
  CHECK_THROWS_WITH_AS(model.forward(0, weights.stage(1)),
                       "gpt::forward: stage 0 takes gpt_embedding_tensors, the tensors given are "
                       "block_tensors",
                       std::invalid_argument);
  CHECK_THROWS_AS(model.forward(2, weights.stage(2)), std::logic_error);  // stage 1 skipped
  model.forward(0, weights.stage(0));
  CHECK_THROWS_AS(model.backward(0, weights.stage(0), params.stage(0)), std::logic_error);
  CHECK_THROWS_AS(model.forward(4, weights.stage(3)), std::out_of_range);
  CHECK_THROWS_AS(model.set_batch(std::vector<int>(15), std::vector<int>(16)),
                  std::invalid_argument);
}

TEST_CASE("gpt: gradient accumulation adds, and grad_scale scales the whole gradient") {
  auto params = allocate_gpt_tensors<double>(tiny);
  auto once = allocate_gpt_tensors<double>(tiny);
  auto twice = allocate_gpt_tensors<double>(tiny);
  init_gpt2(params, tiny, 3);
  gpt<double> model(tiny, tiny_batch);
  model.set_batch(bytes_of(text, 5, 16), bytes_of(text, 6, 16));
  model.forward_all(params);
  model.backward_all(params, once);
  model.forward_all(params);
  model.set_grad_scale(model.grad_scale() * 2);
  model.backward_all(params, twice);
  model.forward_all(params);
  model.set_grad_scale(model.grad_scale() / 2);
  model.backward_all(params, twice);  // twice = 2 g + g
  std::vector<std::vector<double>> a, b;
  for_each_tensor(once, [&](const std::string&, const auto& v) { a.push_back(to_vector(v)); });
  for_each_tensor(twice, [&](const std::string&, const auto& v) { b.push_back(to_vector(v)); });
  for (std::size_t t = 0; t < a.size(); ++t)
    for (std::size_t i = 0; i < a[t].size(); ++i) CHECK(b[t][i] == doctest::Approx(3 * a[t][i]));
}

TEST_CASE("gpt: the same batch gives bit-identical gradients (deterministic)") {
  auto params = allocate_gpt_tensors<double>(tiny);
  init_gpt2(params, tiny, 4);
  auto g1 = allocate_gpt_tensors<double>(tiny);
  auto g2 = allocate_gpt_tensors<double>(tiny);
  gpt<double> model(tiny, tiny_batch);
  model.set_batch(bytes_of(text, 7, 16), bytes_of(text, 8, 16));
  model.forward_all(params);
  model.backward_all(params, g1);
  gpt<double> other(tiny, tiny_batch);
  other.set_batch(bytes_of(text, 7, 16), bytes_of(text, 8, 16));
  other.forward_all(params);
  other.backward_all(params, g2);
  std::vector<double> a, b;
  for_each_tensor(g1, [&](const std::string&, const auto& v) { auto x = to_vector(v); a.insert(a.end(), x.begin(), x.end()); });
  for_each_tensor(g2, [&](const std::string&, const auto& v) { auto x = to_vector(v); b.insert(b.end(), x.begin(), x.end()); });
  CHECK(a == b);
}

TEST_CASE("gpt: a few SGD steps lower the loss; generate continues a prompt") {
  auto params = allocate_gpt_tensors<double>(tiny);
  auto grads = allocate_gpt_tensors<double>(tiny);
  init_gpt2(params, tiny, 5);
  gpt<double> model(tiny, tiny_batch);
  model.set_batch(bytes_of(text, 0, 16), bytes_of(text, 1, 16));
  const double first = model.forward_all(params);
  double last = first;
  for (int step = 0; step < 30; ++step) {
    fill_zero(grads);
    model.forward_all(params);
    model.backward_all(params, grads);
    for_each_tensor(params, [&](const std::string& name, const auto& view) {
      for_each_tensor(grads, [&](const std::string& gname, const auto& gview) {
        if (gname != name) return;
        auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
        auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gview);
        for (std::size_t i = 0; i < p.span(); ++i) p.data()[i] -= 0.5 * g.data()[i];
        Kokkos::deep_copy(view, p);
      });
    });
    last = model.forward_all(params);
  }
  MESSAGE("loss " << first << " -> " << last << " after 30 SGD steps");
  CHECK(last < first - 1.0);
  const std::string greedy = generate<double>(tiny, params, "To be", 12, {.temperature = 0});
  CHECK(greedy.size() == 17);
  CHECK(greedy.substr(0, 5) == "To be");
  CHECK(greedy == generate<double>(tiny, params, "To be", 12, {.temperature = 0}));
  const std::string sampled = generate<double>(tiny, params, "To be", 12, {.temperature = 1, .seed = 9});
  CHECK(sampled == generate<double>(tiny, params, "To be", 12, {.temperature = 1, .seed = 9}));
  MESSAGE("greedy: " << greedy << " | sampled: " << sampled);
}

TEST_CASE("gpt in float runs and agrees with double at init") {
  auto pd = allocate_gpt_tensors<double>(tiny);
  auto pf = allocate_gpt_tensors<float>(tiny);
  init_gpt2(pd, tiny, 6);
  init_gpt2(pf, tiny, 6);
  gpt<double> md(tiny, tiny_batch);
  gpt<float> mf(tiny, tiny_batch);
  md.set_batch(bytes_of(text, 0, 16), bytes_of(text, 1, 16));
  mf.set_batch(bytes_of(text, 0, 16), bytes_of(text, 1, 16));
  CHECK(double(mf.forward_all(pf)) == doctest::Approx(md.forward_all(pd)).epsilon(1e-4));
}
