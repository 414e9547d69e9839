#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io::stateful — the checkpoint protocol: whatever holds training state (an optimizer, a
// sampler, the progress of a fit) lists it in a checkpoint_state, and reads it back from the
// file's metadata after a load. A checkpoint is then the union of its parts, and no caller names
// a tensor or a key by hand (TorchTitan's Stateful, Lightning's state_dict()).
//
//   struct counter {
//     std::size_t value = 0;
//     void add_state(kfsdp::io::checkpoint_state<double>& state) const {
//       state.metadata["counter.value"] = std::to_string(value);
//     }
//     void restore_state(const kfsdp::io::metadata_map& metadata) {
//       value = kfsdp::io::metadata_count(metadata, "counter.value");
//     }
//   };
//   static_assert(kfsdp::io::stateful<counter, double>);
//
// A part's flat views (optimizer moments: the layout of the engine's flat shard) are saved with
// the weights and restored IN PLACE by the load, so add_state is called before saving and before
// loading alike; restore_state then sees the file's metadata. Core header: no MPI.

#include <fmt/format.h>
#include <Kokkos_Core.hpp>

#include <charconv>
#include <span>
#include <utility>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/meta/parse.hpp>
#include <kfsdp/tensor/metadata.hpp>

namespace kfsdp::io {

/// A flat view with the layout of the engine's flat shard (optimizer moments, say), saved as one
/// full tensor per parameter named "<name>.<parameter name>".
///
///   kfsdp::io::named_shard<float>{"optimizer.exp_avg", optimizer.exp_avg()}
///   // -> tensors "optimizer.exp_avg.transformer.wte.weight", ...
///
/// A view may leave parameters out (frozen ones: an optimizer keeps no state for them): `absent`
/// lists them, `flat` then holds the other parameters' chunks back to back in shard order, and the
/// file has no tensor for them.
template <class Scalar>
struct named_shard {
  std::string name{};
  Kokkos::View<Scalar*> flat{};          // plan().shard_numel elements less absent ones', padding rows zero
  std::vector<std::size_t> absent{};     // parameter indices without elements here, ascending
};

/// What a checkpoint holds beside the weights: progress as strings in `__metadata__` (step, data
/// position, RNG state, optimizer kind and hyper-parameters: the caller chooses the keys) and the
/// flat views to save, and to restore in place on load.
///
///   checkpoint_state<double> state{.metadata = {{"step", "20"}},
///                                  .shards = {{"optimizer.momentum_buffer", sgd.momentum_buffer()}}};
template <class Scalar>
struct checkpoint_state {
  metadata_map metadata{};
  std::vector<named_shard<Scalar>> shards{};
};

/// 1. add_state(state) const adds the object's views and metadata keys to `state`;
/// 2. restore_state(metadata) reads them back after the views were restored in place.
template <class T, class Scalar>
concept stateful = requires(T& object, const T& saved, checkpoint_state<Scalar>& state,
                            const metadata_map& metadata) {
  saved.add_state(state);
  object.restore_state(metadata);
};

/// The value of `key`; throws std::invalid_argument naming the key when the file lacks it.
///
///   const std::string& kind = kfsdp::io::metadata_text(metadata, "optimizer");
inline const std::string& metadata_text(const metadata_map& metadata, std::string_view key) {
  const auto found = metadata.find(key);
  if (found == metadata.end())
    throw std::invalid_argument(
        fmt::format("checkpoint metadata: no '{}', expected it (a checkpoint of another program?)", key));
  return found->second;
}

/// The value of `key` as a count, read strictly as every number kfsdp reads (kfsdp::parse_count:
/// digits only; "64abc", "-1" and overflow refused); throws std::invalid_argument naming the key,
/// the value seen and what is expected.
///
///   const std::size_t step = kfsdp::io::metadata_count(metadata, "fit.step");
KFSDP_EXPORT inline std::uint64_t metadata_count(const metadata_map& metadata, std::string_view key) {
  return parse_count(metadata_text(metadata, key), fmt::format("checkpoint metadata: '{}'", key));
}

/// Throws std::invalid_argument unless the file's `key` equals `expected`: a checkpoint of another
/// configuration is refused, naming the key, not silently continued.
///
///   kfsdp::io::check_metadata(metadata, "optimizer", "adamw");
KFSDP_EXPORT inline void check_metadata(const metadata_map& metadata, std::string_view key, std::string_view expected) {
  const std::string& found = metadata_text(metadata, key);
  if (found != expected)
    throw std::invalid_argument(
        fmt::format("checkpoint metadata: '{}' is '{}', expected '{}' (this run's)", key, found, expected));
}

/// Refuses a file saved for another model configuration, naming the field: each (field, value) of
/// `config` must be the file's. A field the file lacks is refused when `required`, and passes
/// otherwise (a plain safetensors file records no configuration). `context` starts the message.
///
///   kfsdp::io::check_config(metadata, kfsdp::gpt_metadata(config), /*required=*/true, "checkpoint F ");
///   // throws "checkpoint F was saved with heads = 4, this model has heads = 2"
KFSDP_EXPORT inline void check_config(const metadata_map& metadata, std::span<const std::pair<std::string, std::string>> config,
                         bool required, std::string_view context = {}) {
  for (const auto& [field, value] : config) {
    const auto saved = metadata.find(field);
    if (saved == metadata.end() && !required) continue;
    if (saved == metadata.end())
      throw std::invalid_argument(
          fmt::format("{}no '{}' in its metadata, expected this model's {} = {}", context, field, field, value));
    if (saved->second != value)
      throw std::invalid_argument(
          fmt::format("{}was saved with {} = {}, this model has {} = {}", context, field, saved->second, field, value));
  }
}

}  // namespace kfsdp::io
