#pragma once
// Definitions of kfsdp::nn::gpt and its helpers; included by kernels/nn/gpt.cpp.

#include <kfsdp/nn/gpt.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace kfsdp::nn {

namespace detail {

// positions[row] = row % seq_len: the position of each row in its window.
inline void fill_positions(index_vector positions, std::size_t seq_len) {
  const int seq = int(seq_len);
  Kokkos::parallel_for(
      "kfsdp::nn::gpt::positions", Kokkos::RangePolicy<execution_space>(0, int(positions.extent(0))),
      KOKKOS_LAMBDA(int row) { positions(row) = row % seq; });
}

template <class Scalar>
matrix<Scalar> zero_matrix(const std::string& label, std::size_t rows, std::size_t cols) {
  return matrix<Scalar>(Kokkos::view_alloc(label), rows, cols);
}
template <class Scalar>
vector<Scalar> zero_vector(const std::string& label, std::size_t size) {
  return vector<Scalar>(Kokkos::view_alloc(label), size);
}

// Uniform in (0, 1] from 53 random bits: the same numbers on every standard library.
inline double uniform_open_closed(std::mt19937_64& rng) {
  return (double(rng() >> 11) + 1.0) * 0x1.0p-53;
}

inline double standard_normal(std::mt19937_64& rng) {
  const double u1 = uniform_open_closed(rng), u2 = uniform_open_closed(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
}

template <class View>
void fill_normal(const View& view, double stddev, std::mt19937_64& rng) {
  auto host = Kokkos::create_mirror_view(view);
  auto flat = host.data();  // host mirror of a LayoutRight view: contiguous
  for (std::size_t i = 0; i < host.span(); ++i) flat[i] = typename View::value_type(stddev * standard_normal(rng));
  Kokkos::deep_copy(view, host);
}

}  // namespace detail

template <class Scalar>
gpt_tensors<Scalar> allocate_gpt_tensors(const gpt_config& config) {
  config.validate();
  const std::size_t d = config.dim, v = config.vocab, t = config.seq;
  using detail::zero_matrix;
  using detail::zero_vector;
  gpt_tensors<Scalar> tensors;
  tensors.embeddings = {zero_matrix<Scalar>("transformer.wte.weight", v, d),
                        zero_matrix<Scalar>("transformer.wpe.weight", t, d)};
  for (std::size_t i = 0; i < config.layers; ++i) {
    const std::string prefix = "transformer.h." + std::to_string(i) + ".";
    block_tensors<Scalar> b;
    b.ln_1 = {zero_vector<Scalar>(prefix + "ln_1.weight", d),
              zero_vector<Scalar>(prefix + "ln_1.bias", d)};
    b.attn.c_attn = {zero_matrix<Scalar>(prefix + "attn.c_attn.weight", 3 * d, d),
                     zero_vector<Scalar>(prefix + "attn.c_attn.bias", 3 * d)};
    b.attn.c_proj = {zero_matrix<Scalar>(prefix + "attn.c_proj.weight", d, d),
                     zero_vector<Scalar>(prefix + "attn.c_proj.bias", d)};
    b.ln_2 = {zero_vector<Scalar>(prefix + "ln_2.weight", d),
              zero_vector<Scalar>(prefix + "ln_2.bias", d)};
    b.mlp.c_fc = {zero_matrix<Scalar>(prefix + "mlp.c_fc.weight", 4 * d, d),
                  zero_vector<Scalar>(prefix + "mlp.c_fc.bias", 4 * d)};
    b.mlp.c_proj = {zero_matrix<Scalar>(prefix + "mlp.c_proj.weight", d, 4 * d),
                    zero_vector<Scalar>(prefix + "mlp.c_proj.bias", d)};
    tensors.blocks.push_back(b);
  }
  tensors.head = {{zero_vector<Scalar>("transformer.ln_f.weight", d),
                   zero_vector<Scalar>("transformer.ln_f.bias", d)},
                  zero_matrix<Scalar>("lm_head.weight", v, d)};
  return tensors;
}

template <class Scalar>
void fill_zero(const gpt_tensors<Scalar>& tensors) {
  for_each_tensor(tensors, [](const std::string&, const auto& view) {
    Kokkos::deep_copy(view, Scalar(0));
  });
}

template <class Scalar>
void init_gpt2(const gpt_tensors<Scalar>& tensors, const gpt_config& config, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double stddev = 0.02;
  const double proj_stddev = 0.02 / std::sqrt(2.0 * double(config.layers));
  auto ends_with = [](const std::string& name, std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for_each_tensor(tensors, [&](const std::string& name, const auto& view) {
    if (ends_with(name, "c_proj.weight"))
      detail::fill_normal(view, proj_stddev, rng);
    else if (ends_with(name, ".bias"))
      Kokkos::deep_copy(view, Scalar(0));
    else if (name.find("ln_") != std::string::npos)  // ln_1, ln_2, ln_f weights
      Kokkos::deep_copy(view, Scalar(1));
    else
      detail::fill_normal(view, stddev, rng);
  });
}

template <class Scalar>
gpt<Scalar>::gpt(const gpt_config& config, std::size_t batch)
    : config_((config.validate(), config)),
      batch_(batch),
      wte_(config.vocab, config.dim),
      wpe_(config.seq, config.dim),
      block_(config.dim, config.heads, config.seq),
      ln_f_(config.dim),
      lm_head_(config.dim, config.vocab, /*has_bias=*/false),
      loss_fn_(config.vocab) {
  if (batch == 0) throw std::invalid_argument("gpt: batch must be > 0");
  const std::size_t n = rows(), d = config.dim, seq = config.seq;
  tokens_ = index_vector("kfsdp::nn::gpt::tokens", n);
  targets_ = index_vector("kfsdp::nn::gpt::targets", n);
  positions_ = index_vector("kfsdp::nn::gpt::positions", n);
  detail::fill_positions(positions_, seq);
  for (std::size_t s = 0; s <= config.layers; ++s)
    residual_.push_back(detail::zero_matrix<Scalar>("kfsdp::nn::gpt::residual", n, d));
  for (std::size_t i = 0; i < config.layers; ++i) block_caches_.push_back(block_.make_cache(n));
  ln_f_cache_ = ln_f_.make_cache(n);
  ln_f_out_ = detail::zero_matrix<Scalar>("kfsdp::nn::gpt::ln_f_out", n, d);
  logits_ = detail::zero_matrix<Scalar>("kfsdp::nn::gpt::logits", n, config.vocab);
  loss_cache_ = loss_fn_.make_cache(n);
  d_stream_ = detail::zero_matrix<Scalar>("kfsdp::nn::gpt::d_stream", n, d);
  d_ln_f_out_ = detail::zero_matrix<Scalar>("kfsdp::nn::gpt::d_ln_f_out", n, d);
  d_logits_ = detail::zero_matrix<Scalar>("kfsdp::nn::gpt::d_logits", n, config.vocab);
  grad_scale_ = Scalar(1) / Scalar(n);
}

template <class Scalar>
void gpt<Scalar>::set_batch(const_index_vector tokens, const_index_vector targets) {
  detail::check_vector("gpt::set_batch", "tokens", tokens, rows());
  detail::check_vector("gpt::set_batch", "targets", targets, rows());
  Kokkos::deep_copy(tokens_, tokens);
  Kokkos::deep_copy(targets_, targets);
  grad_scale_ = Scalar(1) / Scalar(rows());
  have_batch_ = true;
  next_forward_ = 0;
  next_backward_ = 0;
}

template <class Scalar>
void gpt<Scalar>::set_batch(const std::vector<int>& tokens, const std::vector<int>& targets) {
  if (tokens.size() != rows())
    detail::throw_shape("gpt::set_batch", "tokens", detail::shape_string(tokens.size()),
                        detail::shape_string(rows()));
  if (targets.size() != rows())
    detail::throw_shape("gpt::set_batch", "targets", detail::shape_string(targets.size()),
                        detail::shape_string(rows()));
  Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host_tokens(
      tokens.data(), tokens.size()),
      host_targets(targets.data(), targets.size());
  auto device_tokens = Kokkos::create_mirror_view_and_copy(memory_space(), host_tokens);
  auto device_targets = Kokkos::create_mirror_view_and_copy(memory_space(), host_targets);
  set_batch(const_index_vector(device_tokens), const_index_vector(device_targets));
}

template <class Scalar>
typename gpt<Scalar>::stage_kind gpt<Scalar>::kind_of(const char* where, std::size_t stage) const {
  if (stage == 0) return stage_kind::embeddings;
  if (stage <= config_.layers) return stage_kind::block;
  if (stage == config_.layers + 1) return stage_kind::head;
  throw std::out_of_range(std::string(where) + ": stage " + std::to_string(stage) +
                          " is not in [0, " + std::to_string(stages()) + ")");
}

template <class Scalar>
template <class Tensors, class Variant>
const Tensors& gpt<Scalar>::expect(const char* where, std::size_t stage, const Variant& v) const {
  static const char* const kinds[] = {"gpt_embedding_tensors", "block_tensors", "gpt_head_tensors"};
  const auto* tensors = std::get_if<Tensors>(&v);
  if (tensors == nullptr) {
    const std::size_t wanted = std::size_t(kind_of(where, stage));
    throw std::invalid_argument(std::string(where) + ": stage " + std::to_string(stage) +
                                " takes " + kinds[wanted] + ", the tensors given are " +
                                kinds[v.index()]);
  }
  return *tensors;
}

template <class Scalar>
void gpt<Scalar>::forward(std::size_t stage, const params& p) {
  const char* where = "gpt::forward";
  const stage_kind kind = kind_of(where, stage);
  if (!have_batch_) throw std::logic_error("gpt::forward: call set_batch first");
  if (stage != next_forward_ && stage != 0)
    throw std::logic_error("gpt::forward: stage " + std::to_string(stage) + " called, stage " +
                           std::to_string(next_forward_) + " expected (stages run in order)");
  next_backward_ = 0;
  switch (kind) {
    case stage_kind::embeddings: {
      const auto& t = expect<gpt_embedding_tensors<const Scalar>>(where, stage, p);
      wte_.forward({t.wte}, tokens_, residual_[0], wte_cache_);
      wpe_.forward_add({t.wpe}, positions_, residual_[0], wpe_cache_);
      break;
    }
    case stage_kind::block: {
      const auto& t = expect<block_tensors<const Scalar>>(where, stage, p);
      block_.forward(t, residual_[stage - 1], residual_[stage], block_caches_[stage - 1]);
      break;
    }
    case stage_kind::head: {
      const auto& t = expect<gpt_head_tensors<const Scalar>>(where, stage, p);
      ln_f_.forward(t.ln_f, residual_[config_.layers], ln_f_out_, ln_f_cache_);
      lm_head_.forward({t.lm_head}, ln_f_out_, logits_, lm_head_cache_);
      loss_ = loss_fn_.forward(logits_, targets_, loss_cache_);
      next_backward_ = stages();
      break;
    }
  }
  next_forward_ = stage + 1;
}

template <class Scalar>
void gpt<Scalar>::backward(std::size_t stage, const params& p, const grads& g) {
  const char* where = "gpt::backward";
  const stage_kind kind = kind_of(where, stage);
  if (next_backward_ != stage + 1)
    throw std::logic_error(
        "gpt::backward: stage " + std::to_string(stage) + " called, " +
        (next_backward_ == 0 ? std::string("but no full forward precedes it")
                             : "stage " + std::to_string(next_backward_ - 1) + " expected"));
  switch (kind) {
    case stage_kind::head: {
      const auto& t = expect<gpt_head_tensors<const Scalar>>(where, stage, p);
      const auto& dt = expect<gpt_head_tensors<Scalar>>(where, stage, g);
      loss_fn_.backward(loss_cache_, grad_scale_, d_logits_);
      lm_head_.backward({t.lm_head}, {dt.lm_head}, lm_head_cache_, d_logits_, d_ln_f_out_);
      ln_f_.backward(t.ln_f, dt.ln_f, ln_f_cache_, d_ln_f_out_, d_stream_);
      break;
    }
    case stage_kind::block: {
      const auto& t = expect<block_tensors<const Scalar>>(where, stage, p);
      const auto& dt = expect<block_tensors<Scalar>>(where, stage, g);
      block_.backward(t, dt, block_caches_[stage - 1], d_stream_, d_stream_);  // in place
      break;
    }
    case stage_kind::embeddings: {
      const auto& dt = expect<gpt_embedding_tensors<Scalar>>(where, stage, g);
      wte_.backward({dt.wte}, wte_cache_, d_stream_);
      wpe_.backward({dt.wpe}, wpe_cache_, d_stream_);
      break;
    }
  }
  next_backward_ = stage;
}

template <class Scalar>
Scalar gpt<Scalar>::loss() const {
  if (next_forward_ != stages()) throw std::logic_error("gpt::loss: the head stage has not run");
  return loss_;
}

template <class Scalar>
Scalar gpt<Scalar>::forward_all(const gpt_tensors<const Scalar>& p) {
  if (p.blocks.size() != config_.layers)
    throw std::invalid_argument("gpt::forward_all: params has " + std::to_string(p.blocks.size()) +
                                " blocks, expected " + std::to_string(config_.layers));
  for (std::size_t s = 0; s < stages(); ++s) forward(s, p.stage(s));
  return loss();
}

template <class Scalar>
void gpt<Scalar>::backward_all(const gpt_tensors<const Scalar>& p, const gpt_tensors<Scalar>& g) {
  if (p.blocks.size() != config_.layers || g.blocks.size() != config_.layers)
    throw std::invalid_argument("gpt::backward_all: params and grads need " +
                                std::to_string(config_.layers) + " blocks");
  for (std::size_t s = stages(); s-- > 0;) backward(s, p.stage(s), g.stage(s));
}

template <class Scalar>
const_matrix<Scalar> gpt<Scalar>::residual(std::size_t stage) const {
  if (stage > config_.layers)
    throw std::out_of_range("gpt::residual: stage " + std::to_string(stage) + " is not in [0, " +
                            std::to_string(config_.layers + 1) + ")");
  return residual_[stage];
}

template <class Scalar>
std::vector<int> generate(
    const gpt_config& config,
    const std::function<gpt_stage_tensors<const Scalar>(std::size_t)>& stage_params,
    std::vector<int> prompt, std::size_t new_tokens, sampling how) {
  if (prompt.empty()) throw std::invalid_argument("generate: prompt is empty");
  for (int id : prompt)
    if (id < 0 || std::size_t(id) >= config.vocab)
      throw std::invalid_argument("generate: prompt id " + std::to_string(id) +
                                  " is not in [0, " + std::to_string(config.vocab) + ")");
  gpt<Scalar> model(config, 1);
  std::mt19937_64 rng(how.seed);
  const std::size_t seq = config.seq;
  std::vector<int> window(seq), targets(seq, 0);
  for (std::size_t step = 0; step < new_tokens; ++step) {
    // The last ≤ seq tokens, zero-padded after: causal masking keeps the padding out of them.
    const std::size_t used = std::min(seq, prompt.size());
    std::fill(window.begin(), window.end(), 0);
    std::copy(prompt.end() - std::ptrdiff_t(used), prompt.end(), window.begin());
    model.set_batch(window, targets);
    for (std::size_t s = 0; s < model.stages(); ++s) model.forward(s, stage_params(s));
    auto last = Kokkos::subview(model.logits(), used - 1, Kokkos::ALL);
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), last);
    std::size_t next = 0;
    if (how.temperature <= 0) {
      for (std::size_t v = 1; v < config.vocab; ++v)
        if (host(v) > host(next)) next = v;
    } else {
      double max_logit = double(host(0));
      for (std::size_t v = 1; v < config.vocab; ++v) max_logit = std::max(max_logit, double(host(v)));
      std::vector<double> weights(config.vocab);
      double total = 0;
      for (std::size_t v = 0; v < config.vocab; ++v)
        total += weights[v] = std::exp((double(host(v)) - max_logit) / how.temperature);
      double pick = detail::uniform_open_closed(rng) * total;
      next = config.vocab - 1;
      for (std::size_t v = 0; v < config.vocab; ++v) {
        pick -= weights[v];
        if (pick <= 0) {
          next = v;
          break;
        }
      }
    }
    prompt.push_back(int(next));
  }
  return prompt;
}

template <class Scalar>
std::string generate(const gpt_config& config, const gpt_tensors<const Scalar>& params,
                     std::string_view prompt, std::size_t new_bytes, sampling how) {
  if (config.vocab != 256)
    throw std::invalid_argument("generate: text needs vocab = 256, config has " +
                                std::to_string(config.vocab));
  std::vector<int> ids;
  for (unsigned char byte : prompt) ids.push_back(int(byte));
  const std::function<gpt_stage_tensors<const Scalar>(std::size_t)> stage_params =
      [&params](std::size_t s) { return params.stage(s); };
  const std::vector<int> out = generate<Scalar>(config, stage_params, std::move(ids), new_bytes, how);
  std::string text;
  for (int id : out) text.push_back(char(static_cast<unsigned char>(id)));
  return text;
}

}  // namespace kfsdp::nn
