#pragma once
// HSDP over MPI for the tests: two shard groups of half the world's ranks each, and the replica
// groups across them (rank r's replica holds the same shard in the other group).
//   at 4 ranks: shard groups {0, 1} {2, 3}, replica groups {0, 2} {1, 3}
#include <optional>

#include <kfsdp/comm/mpi/mpi.hpp>

namespace kfsdp::test {

struct hsdp_groups {
  comm::mpi shards;
  comm::mpi replicas;
};

// None at an odd world size (no two groups of equal size).
inline std::optional<hsdp_groups> halves_replicated(comm::mpi& world) {
  if (world.size() % 2 != 0) return std::nullopt;
  const int group = world.size() / 2;
  return hsdp_groups{world.split(world.rank() / group, world.rank()),
                     world.split(world.rank() % group, world.rank())};
}

}  // namespace kfsdp::test
