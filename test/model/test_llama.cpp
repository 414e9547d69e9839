// Tests of include/kfsdp/model/llama.hpp: transformers' LlamaForCausalLM parameter names and shapes,
// decoder layers as blocks, tied heads, configurations refused.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include <kfsdp/model/llama.hpp>
#include <kfsdp/model/param_table.hpp>

using namespace kfsdp;

// dim 64, hidden 176, heads 4, kv_heads 2 (head_dim 16, k/v width 32), seq 32, vocab 256.
constexpr auto& t = param_table<llama<2, 64, 176, 4, 2, 32>>;
static_assert(t.size() == 2 + 9 * 2 + 1);
static_assert(t[0].name.view() == "model.embed_tokens.weight" && t[0].shape[0] == 256 && t[0].shape[1] == 64);
static_assert(t[1].name.view() == "model.layers.0.input_layernorm.weight" && t[1].shape[0] == 64 && t[1].block == 0);
static_assert(t[2].name.view() == "model.layers.0.self_attn.q_proj.weight" && t[2].shape[0] == 64 && t[2].shape[1] == 64);
static_assert(t[3].name.view() == "model.layers.0.self_attn.k_proj.weight" && t[3].shape[0] == 32 && t[3].shape[1] == 64);
static_assert(t[4].name.view() == "model.layers.0.self_attn.v_proj.weight" && t[4].shape[0] == 32);
static_assert(t[5].name.view() == "model.layers.0.self_attn.o_proj.weight" && t[5].shape[0] == 64 && t[5].shape[1] == 64);
static_assert(t[6].name.view() == "model.layers.0.post_attention_layernorm.weight" && t[6].block == 0);
static_assert(t[7].name.view() == "model.layers.0.mlp.gate_proj.weight" && t[7].shape[0] == 176 && t[7].shape[1] == 64);
static_assert(t[8].name.view() == "model.layers.0.mlp.up_proj.weight" && t[8].shape[0] == 176);
static_assert(t[9].name.view() == "model.layers.0.mlp.down_proj.weight" && t[9].shape[0] == 64 && t[9].shape[1] == 176);
static_assert(t[10].name.view() == "model.layers.1.input_layernorm.weight" && t[10].block == 1);
static_assert(t[19].name.view() == "model.norm.weight" && t[19].block == no_block);
static_assert(t[20].name.view() == "lm_head.weight" && t[20].shape[0] == 256 && t[20].shape[1] == 64 && t[20].block == no_block);
static_assert(t[1].init.kind == init_rule::ones && t[19].init.kind == init_rule::ones);

constexpr llama_config small{.vocab = 256, .dim = 64, .hidden = 176, .layers = 2, .heads = 4, .kv_heads = 2, .seq = 32};

TEST_CASE("make_llama builds the static form's table from a llama_config") {
  const auto runtime = make_param_table(make_llama(small));
  REQUIRE(runtime.size() == t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    CAPTURE(std::string(t[i].name.view()));
    CHECK(runtime[i].name == t[i].name);
    CHECK(runtime[i].shape == t[i].shape);
    CHECK(runtime[i].block == t[i].block);
  }
}

TEST_CASE("the attention and RoPE take the configuration's sizes, window and theta") {
  llama_config c = small;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  const auto m = make_llama(c, 16);
  const auto& layer = std::get<1>(std::get<0>(m.children).children).element;
  const auto& attention = std::get<1>(std::get<0>(layer.children).children);
  const auto& rope = std::get<1>(attention.children);
  const auto& core = std::get<2>(attention.children);
  CHECK(rope.theta == 500000.0);
  CHECK(rope.seq == 16);
  CHECK(rope.head_dim == 16);
  CHECK(core.heads == 4);
  CHECK(core.kv_heads == 2);
  CHECK(core.expected_in_features() == 64 + 2 * 32);
  CHECK(std::get<0>(std::get<0>(layer.children).children).eps == 1e-5);
  CHECK(std::get<1>(std::get<1>(std::get<0>(std::get<1>(std::get<0>(make_llama(c).children).children).element.children).children).children).seq == 32);
  CHECK_THROWS_WITH_AS(make_llama(c, 33), "kfsdp::make_llama: window is 33, expected at most seq (max_position_embeddings) = 32",
                       std::invalid_argument);
}

TEST_CASE("tied embeddings: lm_head.weight is model.embed_tokens.weight, declared once") {
  llama_config c = small;
  c.tie_weights = true;
  const auto tied = make_param_table(make_llama(c));
  CHECK(tied.size() == t.size() - 1);
  CHECK(tied.back().name.view() == "model.norm.weight");
}

TEST_CASE("the families' attention: q/k/v and o biases under transformers' names, a head_dim of its own, scaled RoPE") {
  llama_config qwen = small;  // Qwen2: q, k, v biased, o_proj not
  qwen.qkv_bias = true;
  const auto biased = make_param_table(make_llama(qwen));
  REQUIRE(biased.size() == t.size() + 2 * 3);
  CHECK(biased[3].name.view() == "model.layers.0.self_attn.q_proj.bias");
  CHECK(biased[3].shape[0] == 64);
  CHECK(biased[7].name.view() == "model.layers.0.self_attn.v_proj.bias");
  CHECK(biased[7].shape[0] == 32);
  CHECK(biased[8].name.view() == "model.layers.0.self_attn.o_proj.weight");
  llama_config llama = qwen;  // Llama's attention_bias: o_proj's too
  llama.o_bias = true;
  CHECK(make_param_table(make_llama(llama))[9].name.view() == "model.layers.0.self_attn.o_proj.bias");
  const auto counted = [](const llama_config& c) {  // the count before building is the table's
    double count = 0;
    for (const auto& p : make_param_table(make_llama(c))) count += double(p.numel);
    return count == c.parameters();
  };
  CHECK(counted(llama));

  llama_config mistral = small;  // head_dim 32 with 4 heads of a 64-wide model: the attention is 128 wide
  mistral.head_width = 32;
  mistral.rope = {.type = rope_type::llama3, .factor = 8, .original_max_position_embeddings = 16};
  const auto wide = make_param_table(make_llama(mistral));
  CHECK(wide[2].shape[0] == 128);  // q_proj [heads · head_dim, dim]
  CHECK(wide[3].shape[0] == 64);   // k_proj [kv_heads · head_dim, dim]
  CHECK(wide[5].shape[0] == 64);   // o_proj [dim, heads · head_dim]
  CHECK(wide[5].shape[1] == 128);
  const auto m = make_llama(mistral);
  const auto& attention = std::get<1>(std::get<0>(std::get<1>(std::get<0>(m.children).children).element.children).children);
  CHECK(std::get<1>(attention.children).head_dim == 32);
  CHECK(std::get<1>(attention.children).scaling == mistral.rope);
  CHECK(std::get<2>(attention.children).expected_in_features() == 128 + 2 * 64);
  CHECK(counted(mistral));
}

TEST_CASE("a configuration the model cannot take is refused, naming the size") {
  llama_config c = small;
  c.kv_heads = 3;
  CHECK_THROWS_WITH_AS(make_llama(c), "kfsdp::llama_config: kv_heads is 3, expected a divisor of heads = 4", std::invalid_argument);
  CHECK_THROWS_WITH_AS((causal_self_attention<"a">(64, 4, 8, 3)),
                       "kfsdp: causal_self_attention 'a': kv_heads is 3, expected a divisor of heads = 4", std::invalid_argument);
  CHECK_THROWS_WITH_AS((rotary_embedding<"r">(4, 2, 15, 8)),
                       "kfsdp: rotary_embedding 'r': head_dim is 15, expected an even number (RoPE turns pairs)",
                       std::invalid_argument);
}

// A concat's children read one input; their parameters keep their own names.
using two_heads = sequential<"", concat<"proj", linear<"a", 4, 3>, linear<"b", 4, 5, false>>, linear<"out", 8, 1>, mse<>>;
static_assert(param_table<two_heads>.size() == 5);
static_assert(param_table<two_heads>[1].name.view() == "proj.a.bias" && param_table<two_heads>[2].name.view() == "proj.b.weight");
static_assert(param_table<two_heads>[3].name.view() == "out.weight" && param_table<two_heads>[3].shape[1] == 8);
