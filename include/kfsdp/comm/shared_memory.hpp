#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// Memory the ranks of a communicator share: shared_bytes, the backends that hand it out
// (shares_memory) and allocate_shared on any communicator (empty where a backend has none).
// comm/mpi/shared_memory.hpp is MPI's: its windows and the all-gather that reads them in place.

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>

namespace kfsdp::comm {

// Host memory the other ranks of a communicator read in place: an MPI shared-memory window where all
// its ranks share a node. An all-gather whose sends lie in such memory moves no messages: each rank
// copies its peers' chunks straight out of their memory (mpi::iall_gather_parts). `owner` frees it,
// collectively, when its last copy goes; empty (no bytes) where the backend cannot share memory.
//
//   kfsdp::comm::shared_bytes shards = kfsdp::comm::allocate_shared(world, bytes);   // collective
//   float* shard = shards.empty() ? fallback : reinterpret_cast<float*>(shards.bytes.data());
KFSDP_EXPORT struct shared_bytes {
  std::span<std::byte> bytes;
  std::shared_ptr<void> owner;
  [[nodiscard]] bool empty() const noexcept { return bytes.empty(); }
};

// A backend that hands out such memory: c.allocate_shared(bytes), collective over c, every rank
// asking in the same order (the sizes may differ).
template <class C>
concept shares_memory = requires(C& c, std::size_t bytes) {
  { c.allocate_shared(bytes) } -> std::same_as<shared_bytes>;
};

// `bytes` of memory the communicator's peers read in place, aligned to a cache line; empty where it has
// none to give (a backend without it, ranks on several nodes). Collective where it is not empty.
KFSDP_EXPORT template <class C>
[[nodiscard]] shared_bytes allocate_shared(C& c, std::size_t bytes) {
  if constexpr (shares_memory<C>) return c.allocate_shared(bytes);
  else return {};
}

}  // namespace kfsdp::comm
