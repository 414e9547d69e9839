#pragma once
// What the checkpoint code needs of an FSDP engine, as a concept, so that io/ does not include
// fsdp/: its plan, its parameters, this rank's flat parameter shard, its communicator (the ranks
// that save and load together) and the HSDP replicas.
// kfsdp::fsdp_engine<Scalar> (fsdp/engine.hpp) and the trainer's engine model it; the checkpoint
// functions take any `sharded_engine` and pass its `sharded_view` to the compiled library.
//
//   static_assert(kfsdp::io::sharded_engine<kfsdp::fsdp_engine<float>>);
//   kfsdp::io::sharded_view<float> view = kfsdp::io::view_of(engine);
//   view.params.size();                  // the model's parameters, in model order
//   view.flat;                           // this rank's shard, read on save and written on load

#include <concepts>
#include <memory>
#include <string>
#include <vector>
#include <optional>
#include <span>

#include <Kokkos_Core.hpp>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/model/param_table.hpp>
#include <kfsdp/plan/shard_mapping.hpp>
#include <kfsdp/plan/shard_plan.hpp>

namespace kfsdp::io {

/// An engine the checkpoint functions can save and load: the members of fsdp_engine they read.
template <class Engine>
concept sharded_engine = requires(Engine& engine) {
  typename Engine::scalar_type;
  { engine.plan() } -> std::convertible_to<const shard_plan&>;
  { engine.mapping() } -> std::convertible_to<const shard_mapping&>;
  { engine.params() } -> std::convertible_to<std::span<const param_info>>;
  { engine.shards().flat() } -> std::convertible_to<Kokkos::View<typename Engine::scalar_type*>>;
  { engine.rank() } -> std::convertible_to<int>;
  { engine.world_size() } -> std::convertible_to<int>;
  { engine.communicator() } -> std::convertible_to<comm::any_communicator&>;
  { engine.options().replica_group } -> std::convertible_to<const std::optional<comm::any_communicator>&>;
};

/// An engine as the checkpoint code sees it; it refers to the engine, which must outlive it.
template <class Scalar>
struct sharded_view {
  const shard_plan& plan;
  const shard_mapping& mapping;
  std::span<const param_info> params;
  Kokkos::View<Scalar*> flat;  // this rank's flat parameter shard (loads write into it)
  int rank = 0;
  int world_size = 1;  // the ranks of the shard group
  comm::any_communicator* communicator = nullptr;  // the shard group's: the checkpoint's MPI ranks
  const comm::any_communicator* replica_group = nullptr;  // HSDP's replicas; null under flat FSDP
  // A part of the model, saved or loaded alone (LoRA's adapters; the base without them): the
  // parameters' indices, ascending; null: every parameter.
  std::shared_ptr<const std::vector<std::size_t>> part = nullptr;
  std::string file_prefix;  // before every parameter's name in the file (peft's "base_model.model.")

  // The parameters saved or loaded, in order: the part's, or all of them.
  [[nodiscard]] std::vector<std::size_t> selected() const {
    if (part) return *part;
    std::vector<std::size_t> all(params.size());
    for (std::size_t p = 0; p < all.size(); ++p) all[p] = p;
    return all;
  }
};

/// The view of an engine: kfsdp::io::view_of(engine).params[0].name
template <sharded_engine Engine>
[[nodiscard]] sharded_view<typename Engine::scalar_type> view_of(Engine& engine) {
  const std::optional<comm::any_communicator>& replicas = engine.options().replica_group;
  return {engine.plan(), engine.mapping(), engine.params(), engine.shards().flat(),
          engine.rank(), engine.world_size(), &engine.communicator(), replicas ? &*replicas : nullptr,
          nullptr, {}};
}

/// The scalar of an engine's parameters.
template <sharded_engine Engine>
using engine_scalar_t = typename Engine::scalar_type;

}  // namespace kfsdp::io
