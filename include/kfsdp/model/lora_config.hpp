#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// A LoRA adapter's settings under the names of peft's LoraConfig (adapter_config.json), for the
// models that take adapters by module name (make_llama). Each targeted linear layer computes
// y = W x + b + (alpha / rank) · B A x, with A [rank, in] and B [out, rank] the only trained tensors.
//
//   kfsdp::lora_config lora{.rank = 8, .alpha = 16, .targets = {"q_proj", "v_proj"}};   // peft's r, lora_alpha, target_modules
//   auto model = kfsdp::make_llama(config, 0, lora);
//   lora.targets = {"all-linear"};   // every projection of every layer; the head is never adapted (peft's rule)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kfsdp {

// peft's adapter names, "<module>.lora_A.weight" and "<module>.lora_B.weight": what a LoRA
// fine-tune trains, saves as an adapter and merges.
KFSDP_EXPORT constexpr bool is_lora_adapter(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

KFSDP_EXPORT struct lora_config {
  std::size_t rank = 0;              // r; 0: no adapter anywhere
  double alpha = 8;                  // lora_alpha: the adapter's output is scaled by alpha / rank
  std::vector<std::string> targets{};  // target_modules: module names ("q_proj"), or "all-linear"
  double dropout = 0;                // lora_dropout, written back as read; kfsdp trains without dropout

  // The scale of the adapter's output, alpha / rank.
  [[nodiscard]] double scale() const { return rank == 0 ? 0.0 : alpha / double(rank); }

  // Whether the module named `module` gets an adapter.
  [[nodiscard]] bool adapts(std::string_view module) const {
    if (rank == 0) return false;
    return std::any_of(targets.begin(), targets.end(), [&](const std::string& t) { return t == module || t == "all-linear"; });
  }

  // Throws std::invalid_argument naming the setting: a rank without targets (or targets without a
  // rank), an alpha that is 0 or not finite, a dropout outside [0, 1).
  void validate_settings() const {
    if (rank == 0 && !targets.empty()) fail("rank is 0 but targets are given, expected a rank of at least 1 to adapt them");
    if (rank == 0) return;
    if (targets.empty()) fail("rank is " + std::to_string(rank) + " but targets is empty, expected the modules to adapt");
    if (!std::isfinite(alpha) || alpha == 0) fail("alpha is " + std::to_string(alpha) + ", expected a finite value other than 0");
    if (!(dropout >= 0 && dropout < 1)) fail("dropout is " + std::to_string(dropout) + ", expected a value in [0, 1)");
  }

  // validate_settings, and a target that is none of `modules` (the model's adaptable names) throws too.
  void validate(std::span<const std::string_view> modules) const {
    validate_settings();
    for (const std::string& target : targets) {
      if (target == "all-linear" || std::find(modules.begin(), modules.end(), target) != modules.end()) continue;
      std::string known;
      for (std::string_view m : modules) known += (known.empty() ? "" : ", ") + std::string(m);
      fail("target '" + target + "' is not a module of the model, expected one of " + known + " or all-linear");
    }
  }

 private:
  [[noreturn]] static void fail(const std::string& what) { throw std::invalid_argument("kfsdp::lora_config: " + what); }
};

}  // namespace kfsdp
