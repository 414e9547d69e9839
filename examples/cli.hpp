#pragma once
// A small --flag value parser shared by the examples: every flag is declared with a default and a
// help line; an unknown flag, a missing value or a value that does not parse is an error that
// names the flag and the value seen.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#ifdef KFSDP_IMPORT_MODULE  // the module build (-Dmodules=enabled) compiles the same program through the module
import kfsdp;
#else
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/meta/parse.hpp>
#include <kfsdp/model/gpt.hpp>
#endif

namespace kfsdp::examples {

class cli {
 public:
  cli(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}
  [[nodiscard]] const std::string& program() const noexcept { return program_; }

  cli& flag(const std::string& name, std::string default_value, std::string help) {
    order_.push_back(name);
    flags_[name] = {std::move(default_value), std::move(help)};
    return *this;
  }

  // Parses argv; returns false when --help was asked (the help text is printed).
  bool parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        fmt::print("{}", help());
        return false;
      }
      if (!arg.starts_with("--"))
        throw std::invalid_argument(fmt::format("{}: unexpected argument '{}', expected --flag value", program_, arg));
      std::string name(arg.substr(2));
      std::string value;
      const auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      auto it = flags_.find(name);  // an unknown flag is named as such wherever it stands
      if (it == flags_.end())
        throw std::invalid_argument(fmt::format("{}: unknown flag --{}{} (see --help)", program_, name, close_matches(name)));
      if (eq == std::string::npos) {
        if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{}: --{} needs a value", program_, name));
        value = argv[++i];
      }
      it->second.value = value;
      it->second.given = true;
    }
    return true;
  }

  // Whether the command line gave the flag (its default does not count).
  [[nodiscard]] bool given(const std::string& name) const { return entry(name).given; }

  [[nodiscard]] std::string str(const std::string& name) const { return entry(name).value; }

  // Strict, as every number kfsdp reads (kfsdp::parse_count): digits only, no sign, no overflow.
  // `most` bounds a run-time size the flag's help documents (--sample: bytes, each one forward pass).
  [[nodiscard]] std::size_t size(const std::string& name, std::uint64_t most = std::uint64_t(-1)) const {
    return static_cast<std::size_t>(kfsdp::parse_count(str(name), fmt::format("{}: --{}", program_, name), 0, most));
  }

  // A size that must be at least 1 (a zero names the flag, not the object it would size).
  [[nodiscard]] std::size_t positive(const std::string& name) const {
    const std::size_t n = size(name);
    if (n == 0) throw std::invalid_argument(fmt::format("{}: --{} is 0, expected at least 1", program_, name));
    return n;
  }

  // A number that must be at least `least`.
  [[nodiscard]] double real_at_least(const std::string& name, double least) const {
    const double x = real(name);
    if (!(x >= least)) throw std::invalid_argument(fmt::format("{}: --{} is {}, expected at least {}", program_, name, str(name), least));
    return x;
  }

  // A finite number, the whole text (kfsdp::parse_real).
  [[nodiscard]] double real(const std::string& name) const {
    return kfsdp::parse_real(str(name), fmt::format("{}: --{}", program_, name));
  }

  // The value of a flag that must be one of `allowed`; anything else is an error naming them.
  [[nodiscard]] std::string choice(const std::string& name, std::initializer_list<std::string_view> allowed) const {
    const std::string v = str(name);
    for (std::string_view a : allowed)
      if (v == a) return v;
    std::string list;
    for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    throw std::invalid_argument(fmt::format("{}: --{} is '{}', expected one of {}", program_, name, v, list));
  }

  [[nodiscard]] std::string help() const {
    std::string out = fmt::format("{} — {}\n\nflags:\n", program_, summary_);
    for (const auto& name : order_) {
      const auto& f = flags_.at(name);
      out += fmt::format("  --{:<16} {} (default: {})\n", name, f.help, f.value.empty() ? "none" : f.value);
    }
    return out;
  }

 private:
  // " (did you mean --width?)" for the declared flags within two edits of `name`.
  std::string close_matches(const std::string& name) const {
    auto distance = [](std::string_view a, std::string_view b) {
      std::vector<std::size_t> row(b.size() + 1);
      for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
      for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
          const std::size_t above = row[j];
          row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
          diagonal = above;
        }
      }
      return row[b.size()];
    };
    std::string out;
    for (const auto& candidate : order_)
      if (distance(name, candidate) <= 2) out += (out.empty() ? " (did you mean --" : ", --") + candidate;
    return out.empty() ? out : out + "?)";
  }
  struct entry_t {
    std::string value;
    std::string help;
    bool given = false;
  };
  const entry_t& entry(const std::string& name) const {
    auto it = flags_.find(name);
    if (it == flags_.end()) throw std::logic_error(program_ + ": flag --" + name + " was never declared");
    return it->second;
  }
  std::string program_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, entry_t> flags_;
};

// The example GPT's flags, shared by train_gpt and the benches: data, model sizes, batch, dtype, seed.
inline cli& add_gpt_flags(cli& c) {
  return c.flag("data", "data/kjv-genesis-exodus.txt",
                "training data: token shards (.bin: llm.c's or nanoGPT's raw uint16; 1-D .npy; a quoted glob of them) or text (bytes)")
      .flag("vocab", "256", "vocabulary; every token id must be below it (256: text as bytes)")
      .flag("layers", "4", "transformer blocks")
      .flag("dim", "128", "embedding width")
      .flag("heads", "4", "attention heads")
      .flag("seq", "64", "context length T (a window is T+1 tokens)")
      .flag("batch", "16", "global batch in windows, split evenly over the ranks")
      .flag("dtype", "f32", "f32 | f64")
      .flag("seed", "1337", "initialisation and sampling seed")
      .flag("tie-weights", "off", "on: lm_head.weight is transformer.wte.weight (nanoGPT's tying) | off");
}

// The sizes those flags give (the heads must split the width evenly).
inline kfsdp::gpt_config gpt_config_of(const cli& c) {
  const kfsdp::gpt_config config{.layers = c.positive("layers"), .dim = c.positive("dim"), .heads = c.positive("heads"),
                                 .seq = c.positive("seq"), .vocab = c.positive("vocab"), .tie_weights = c.choice("tie-weights", {"on", "off"}) == "on"};
  if (config.dim % config.heads != 0)
    throw std::invalid_argument(
        fmt::format("{}: --heads is {}, expected a divisor of --dim {}", c.program(), config.heads, config.dim));
  return config;
}

// How the engine schedules its collectives, shared by train_gpt and the benches.
inline cli& add_schedule_flags(cli& c, const char* overlap_default) {
  return c.flag("overlap", overlap_default,
                "how collectives overlap compute: auto (or on): a communication thread where every rank has a core to "
                "spare for it (session::has_spare_core), polls from the compute thread between kernels elsewhere | "
                "thread | poll | off: they move on only while a rank waits for them")
      .flag("limit-all-gathers", "2", "at most this many bucket all-gathers in flight (0: no limit)")
      .flag("overlap-reduce-scatter", "on",
            "on: a unit's reduce-scatters run behind the next backward | off: at once (less memory)");
}

// --overlap, and what it resolves to on this node (overlap_of).
enum class overlap_choice { automatic, thread, poll, off };
enum class overlap_mode { thread, poll, off };
inline const char* to_string(overlap_mode mode) {
  return mode == overlap_mode::thread ? "thread" : mode == overlap_mode::poll ? "polls" : "off";
}

// Puts those flags into `options`; returns the --overlap choice (overlap_of resolves auto).
inline overlap_choice read_schedule_flags(const cli& c, kfsdp::fsdp_options& options) {
  options.limit_all_gathers = c.size("limit-all-gathers");
  options.overlap_reduce_scatter = c.choice("overlap-reduce-scatter", {"on", "off"}) == "on";
  const std::string overlap = c.choice("overlap", {"auto", "on", "thread", "poll", "off"});
  return overlap == "thread" ? overlap_choice::thread
         : overlap == "poll" ? overlap_choice::poll
         : overlap == "off"  ? overlap_choice::off
                             : overlap_choice::automatic;
}

// How a run overlaps: auto takes the thread where a core is free for it and polls elsewhere (a
// thread without a core of its own slows the compute it shares the core with).
template <class Session>
overlap_mode overlap_of(overlap_choice choice, Session& job) {
  switch (choice) {
    case overlap_choice::thread: return overlap_mode::thread;
    case overlap_choice::poll: return overlap_mode::poll;
    case overlap_choice::off: return overlap_mode::off;
    case overlap_choice::automatic: break;
  }
  return job.has_spare_core() ? overlap_mode::thread : overlap_mode::poll;
}

// How the model is sharded and how its collectives run, shared by the training examples.
inline cli& add_fsdp_flags(cli& c, const char* sharding, const char* bucketing) {
  return add_schedule_flags(c.flag("sharding", sharding, "zero2 | zero3")
                                .flag("bucketing", bucketing, "none | layer | block")
                                .flag("checkpointing", "off", "on: activation checkpointing per unit (recomputed in backward) | off")
                                .flag("broadcast-from", "", "rank whose initial weights everyone starts from")
                                .flag("param-dtype", "scalar", "what the all-gathered parameters travel in: scalar (--dtype) | bf16 | f16 | int8 (block-quantized)")
                                .flag("reduce-dtype", "scalar", "what the gradient reduce-scatters travel in: scalar (--dtype) | bf16 | f16 | int8 (block-quantized, one all-to-all a bucket)")
                                .flag("gradient-division", "after",
                                      "where gradients are divided by the ranks around the SUM: after | before | split (FSDP1)"),
                            "auto");
}

// What those flags set: the engine's options, activation checkpointing (the trainer's), and how
// collectives overlap compute.
struct fsdp_flags {
  kfsdp::fsdp_options fsdp;
  bool checkpointing = false;
  overlap_choice overlap = overlap_choice::automatic;  // overlap_of(overlap, job): thread, polls or neither
};
inline fsdp_flags fsdp_flags_of(const cli& c) {
  fsdp_flags f{.fsdp = {.sharding_strategy = kfsdp::parse_sharding(c.choice("sharding", {"zero2", "zero3"})),
                        .bucketing_strategy = kfsdp::parse_bucketing(c.choice("bucketing", {"none", "layer", "block"})),
                        .gradient_division = kfsdp::parse_gradient_division(c.str("gradient-division")),
                        .param_dtype = kfsdp::parse_wire_precision(c.str("param-dtype")),
                        .reduce_dtype = kfsdp::parse_wire_precision(c.str("reduce-dtype"))},
               .checkpointing = c.choice("checkpointing", {"on", "off"}) == "on"};
  if (!c.str("broadcast-from").empty()) f.fsdp.broadcast_from = static_cast<int>(c.size("broadcast-from"));
  f.overlap = read_schedule_flags(c, f.fsdp);
  return f;
}

}  // namespace kfsdp::examples
