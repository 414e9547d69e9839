#pragma once
// kfsdp::nn::gpt — the compute of nanoGPT's GPT-2 (byte vocabulary), split into stages so that an
// FSDP engine can gather the parameters of one stage at a time:
//   stage 0        embeddings:  x = wte[token] + wpe[position]
//   stage 1 .. L   transformer block i − 1 (transformer.h.{i−1})
//   stage L + 1    head:        ln_f, lm_head (untied, no bias), cross-entropy → loss
// Parameters are NOT owned: each call receives the stage's views (PyTorch layouts). The gpt object
// owns the activations of one batch of `batch` windows of seq_len tokens (rows = batch · seq_len).
//
//   kfsdp::nn::gpt_config config{.layers = 2, .dim = 16, .heads = 2, .seq = 8};
//   auto params = kfsdp::nn::allocate_gpt_tensors<double>(config);   // owned by the caller
//   auto grads = kfsdp::nn::allocate_gpt_tensors<double>(config);    // zero-filled
//   kfsdp::nn::init_gpt2(params, config, /*seed=*/1);
//   kfsdp::nn::gpt_tensors<const double> weights = params;           // the const view of them
//   kfsdp::nn::gpt<double> model(config, /*batch=*/2);
//   model.set_batch(tokens, targets);                 // [rows] int views, or host std::vectors
//   for (std::size_t s = 0; s < model.stages(); ++s) model.forward(s, weights.stage(s));
//   double loss = model.loss();
//   for (std::size_t s = model.stages(); s-- > 0;) model.backward(s, weights.stage(s), grads.stage(s));
//
// forward must run stage 0, 1, ..., L + 1 in order; backward L + 1, ..., 0 after a full forward
// (std::logic_error otherwise). backward ACCUMULATES into the gradients (see views.hpp).

#include <kfsdp/model/gpt.hpp>
#include <kfsdp/nn/block.hpp>
#include <kfsdp/nn/cross_entropy.hpp>
#include <kfsdp/nn/embedding.hpp>
#include <kfsdp/nn/layer_norm.hpp>
#include <kfsdp/nn/linear.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace kfsdp::nn {

// The sizes: kfsdp::gpt_config (layers, dim, heads, seq, vocab), shared with the descriptor.
using kfsdp::gpt_config;

// Stage 0: transformer.wte.weight [V, D], transformer.wpe.weight [T, D].
template <class Element>
struct gpt_embedding_tensors {
  matrix_of<Element> wte;
  matrix_of<Element> wpe;

  gpt_embedding_tensors() = default;
  gpt_embedding_tensors(matrix_of<Element> wte_, matrix_of<Element> wpe_) : wte(wte_), wpe(wpe_) {}
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  gpt_embedding_tensors(const gpt_embedding_tensors<Other>& other)
      : wte(other.wte), wpe(other.wpe) {}
};

// Stage L + 1: transformer.ln_f.{weight, bias} [D], lm_head.weight [V, D].
template <class Element>
struct gpt_head_tensors {
  layer_norm_tensors<Element> ln_f;
  matrix_of<Element> lm_head;

  gpt_head_tensors() = default;
  gpt_head_tensors(layer_norm_tensors<Element> ln_f_, matrix_of<Element> lm_head_)
      : ln_f(ln_f_), lm_head(lm_head_) {}
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  gpt_head_tensors(const gpt_head_tensors<Other>& other)
      : ln_f(other.ln_f), lm_head(other.lm_head) {}
};

// The tensors of one stage: which alternative is set must match the stage's kind.
template <class Element>
using gpt_stage_tensors =
    std::variant<gpt_embedding_tensors<Element>, block_tensors<Element>, gpt_head_tensors<Element>>;

// All tensors of a GPT: parameters (Element = const S), gradients or owned storage (Element = S).
template <class Element>
struct gpt_tensors {
  gpt_embedding_tensors<Element> embeddings;
  std::vector<block_tensors<Element>> blocks;  // transformer.h.0 .. h.{L−1}
  gpt_head_tensors<Element> head;

  gpt_tensors() = default;
  template <class Other>
    requires(std::is_same_v<const Other, Element> && !std::is_same_v<Other, Element>)
  gpt_tensors(const gpt_tensors<Other>& other)
      : embeddings(other.embeddings), blocks(other.blocks.begin(), other.blocks.end()),
        head(other.head) {}

  // stage(0) = embeddings, stage(1 + i) = blocks[i], stage(L + 1) = head.
  [[nodiscard]] gpt_stage_tensors<Element> stage(std::size_t index) const {
    if (index == 0) return embeddings;
    if (index <= blocks.size()) return blocks[index - 1];
    if (index == blocks.size() + 1) return head;
    throw std::out_of_range("gpt_tensors::stage: stage " + std::to_string(index) +
                            " is not in [0, " + std::to_string(blocks.size() + 2) + ")");
  }
};

// Calls f(name, view) for every tensor, in the order of nanoGPT's state dict, with its names:
// "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight", ...,
// "transformer.ln_f.bias", "lm_head.weight". view is a matrix_of or a vector_of Element.
template <class Element, class Function>
void for_each_tensor(const gpt_tensors<Element>& tensors, Function&& f) {
  f(std::string("transformer.wte.weight"), tensors.embeddings.wte);
  f(std::string("transformer.wpe.weight"), tensors.embeddings.wpe);
  for (std::size_t i = 0; i < tensors.blocks.size(); ++i) {
    const auto& b = tensors.blocks[i];
    const std::string prefix = "transformer.h." + std::to_string(i) + ".";
    f(prefix + "ln_1.weight", b.ln_1.weight);
    f(prefix + "ln_1.bias", b.ln_1.bias);
    f(prefix + "attn.c_attn.weight", b.attn.c_attn.weight);
    f(prefix + "attn.c_attn.bias", b.attn.c_attn.bias);
    f(prefix + "attn.c_proj.weight", b.attn.c_proj.weight);
    f(prefix + "attn.c_proj.bias", b.attn.c_proj.bias);
    f(prefix + "ln_2.weight", b.ln_2.weight);
    f(prefix + "ln_2.bias", b.ln_2.bias);
    f(prefix + "mlp.c_fc.weight", b.mlp.c_fc.weight);
    f(prefix + "mlp.c_fc.bias", b.mlp.c_fc.bias);
    f(prefix + "mlp.c_proj.weight", b.mlp.c_proj.weight);
    f(prefix + "mlp.c_proj.bias", b.mlp.c_proj.bias);
  }
  f(std::string("transformer.ln_f.weight"), tensors.head.ln_f.weight);
  f(std::string("transformer.ln_f.bias"), tensors.head.ln_f.bias);
  f(std::string("lm_head.weight"), tensors.head.lm_head);
}

// Zero-filled tensors of the shapes of config (storage for parameters or gradients).
template <class Scalar>
gpt_tensors<Scalar> allocate_gpt_tensors(const gpt_config& config);

// Sets every tensor to zero (e.g. gradients before a step).
template <class Scalar>
void fill_zero(const gpt_tensors<Scalar>& tensors);

// nanoGPT's initialisation: linear and embedding weights ~ N(0, 0.02), the two c_proj weights of
// each block ~ N(0, 0.02 / sqrt(2 L)), biases 0, layer-norm weights 1. Drawn on the host from
// std::mt19937_64(seed) in for_each_tensor order (Box–Muller), so the same on every platform.
template <class Scalar>
void init_gpt2(const gpt_tensors<Scalar>& tensors, const gpt_config& config, std::uint64_t seed);

// How generate picks the next byte: temperature 0 is greedy (argmax), else softmax(logits / T).
struct sampling {
  double temperature = 1.0;
  std::uint64_t seed = 0;
};

template <class Scalar>
class gpt {
 public:
  using scalar_type = Scalar;
  using params = gpt_stage_tensors<const Scalar>;
  using grads = gpt_stage_tensors<Scalar>;

  // Activations for `batch` windows of config.seq tokens.
  gpt(const gpt_config& config, std::size_t batch);

  [[nodiscard]] const gpt_config& config() const noexcept { return config_; }
  [[nodiscard]] std::size_t batch() const noexcept { return batch_; }
  [[nodiscard]] std::size_t rows() const noexcept { return batch_ * config_.seq; }
  [[nodiscard]] std::size_t stages() const noexcept { return config_.stages(); }

  // tokens and targets [rows]: row b·T + t is token t of window b, target its next byte.
  // Resets the gradient scale of the loss to 1 / rows (the mean over this batch).
  void set_batch(const_index_vector tokens, const_index_vector targets);
  void set_batch(const std::vector<int>& tokens, const std::vector<int>& targets);
  // dlogits = (softmax − onehot) · grad_scale; 1 / global rows for a batch split over ranks.
  void set_grad_scale(Scalar grad_scale) noexcept { grad_scale_ = grad_scale; }
  [[nodiscard]] Scalar grad_scale() const noexcept { return grad_scale_; }

  void forward(std::size_t stage, const params& p);
  void backward(std::size_t stage, const params& p, const grads& g);
  // Mean cross-entropy over the batch, after forward of stage L + 1.
  [[nodiscard]] Scalar loss() const;
  // Convenience: every stage, from one full set of tensors. forward_all returns the loss.
  Scalar forward_all(const gpt_tensors<const Scalar>& p);
  void backward_all(const gpt_tensors<const Scalar>& p, const gpt_tensors<Scalar>& g);

  // The residual stream after stage s < L + 1 [rows, D], and the logits [rows, V].
  [[nodiscard]] const_matrix<Scalar> residual(std::size_t stage) const;
  [[nodiscard]] const_matrix<Scalar> logits() const noexcept { return logits_; }

 private:
  enum class stage_kind { embeddings, block, head };
  [[nodiscard]] stage_kind kind_of(const char* where, std::size_t stage) const;
  template <class Tensors, class Variant>
  const Tensors& expect(const char* where, std::size_t stage, const Variant& v) const;

  gpt_config config_;
  std::size_t batch_;
  embedding<Scalar> wte_;
  embedding<Scalar> wpe_;
  transformer_block<Scalar> block_;  // one object (and its backward scratch) for every block
  layer_norm<Scalar> ln_f_;
  linear<Scalar> lm_head_;
  cross_entropy<Scalar> loss_fn_;

  index_vector tokens_, targets_, positions_;  // [rows]
  std::vector<matrix<Scalar>> residual_;       // L + 1 of [rows, D]
  typename embedding<Scalar>::cache wte_cache_, wpe_cache_;
  std::vector<typename transformer_block<Scalar>::cache> block_caches_;
  typename layer_norm<Scalar>::cache ln_f_cache_;
  matrix<Scalar> ln_f_out_;  // [rows, D]
  typename linear<Scalar>::cache lm_head_cache_;
  matrix<Scalar> logits_;  // [rows, V]
  typename cross_entropy<Scalar>::cache loss_cache_;
  // backward
  matrix<Scalar> d_stream_;    // [rows, D], gradient of the residual stream (blocks run in place)
  matrix<Scalar> d_ln_f_out_;  // [rows, D]
  matrix<Scalar> d_logits_;    // [rows, V]

  Scalar grad_scale_;
  Scalar loss_ = 0;
  bool have_batch_ = false;
  std::size_t next_forward_ = 0;   // stage that forward expects next
  std::size_t next_backward_ = 0;  // stage + 1 that backward expects next; 0: none
};

// Continues prompt (token ids, each < vocab) by new_tokens ids, one forward of every stage per id
// on the last ≤ seq_len tokens. stage_params(s) supplies stage s's parameters (an FSDP engine
// gathers them there). Throws std::invalid_argument for an empty prompt or a bad id.
template <class Scalar>
std::vector<int> generate(const gpt_config& config,
                          const std::function<gpt_stage_tensors<const Scalar>(std::size_t)>& stage_params,
                          std::vector<int> prompt, std::size_t new_tokens, sampling how);

// The same on bytes (vocab 256) from a full parameter set:
//   std::string text = kfsdp::nn::generate<double>(config, params, "ROMEO:", 64, {.temperature = 0});
template <class Scalar>
std::string generate(const gpt_config& config, const gpt_tensors<const Scalar>& params,
                     std::string_view prompt, std::size_t new_bytes, sampling how);

extern template class gpt<float>;
extern template class gpt<double>;
extern template gpt_tensors<float> allocate_gpt_tensors<float>(const gpt_config&);
extern template gpt_tensors<double> allocate_gpt_tensors<double>(const gpt_config&);
extern template void fill_zero<float>(const gpt_tensors<float>&);
extern template void fill_zero<double>(const gpt_tensors<double>&);
extern template void init_gpt2<float>(const gpt_tensors<float>&, const gpt_config&, std::uint64_t);
extern template void init_gpt2<double>(const gpt_tensors<double>&, const gpt_config&, std::uint64_t);
extern template std::vector<int> generate<float>(
    const gpt_config&, const std::function<gpt_stage_tensors<const float>(std::size_t)>&,
    std::vector<int>, std::size_t, sampling);
extern template std::vector<int> generate<double>(
    const gpt_config&, const std::function<gpt_stage_tensors<const double>(std::size_t)>&,
    std::vector<int>, std::size_t, sampling);
extern template std::string generate<float>(const gpt_config&, const gpt_tensors<const float>&,
                                            std::string_view, std::size_t, sampling);
extern template std::string generate<double>(const gpt_config&, const gpt_tensors<const double>&,
                                             std::string_view, std::size_t, sampling);

}  // namespace kfsdp::nn
