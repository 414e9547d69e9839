// shard_and_gather — shard a model over the MPI ranks, then gather its full state dict.
//
//   mpirun -np 2 build/examples/shard_and_gather
#include <cstdio>

#include <fmt/format.h>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/environment.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/train/gpt.hpp>  // gpt2_init
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/model/param_table.hpp>

int main(int argc, char** argv) {
  kfsdp::comm::mpi::environment mpi_up(argc, argv);
  kfsdp::environment kokkos_up(argc, argv);
  kfsdp::comm::mpi world;

  // The example GPT: 2 blocks, width 64, context 32 (sizes may also be template arguments).
  const auto model = kfsdp::make_gpt({.layers = 2, .dim = 64, .heads = 4, .seq = 32});
  kfsdp::fsdp_engine<float> sharded(kfsdp::make_param_table(model), world,
                                    {.sharding_strategy = kfsdp::sharding_strategy::zero3,
                                     .bucketing_strategy = kfsdp::bucketing::block});
  sharded.initialize(/*seed=*/1337, kfsdp::gpt2_init(2));  // each rank computes its own rows only

  const kfsdp::memory_report m = sharded.memory();
  fmt::print("rank {}/{}: {} of {} parameter elements, {} bytes of shards\n", world.rank(), world.size(),
             sharded.plan().shard_numel, sharded.plan().full_numel, m.sharded_params);

  // The full, unpadded parameters under their nanoGPT names, on rank 0 only.
  const kfsdp::state_dict full = sharded.original_state_dict(/*rank0_only=*/true);
  for (const kfsdp::tensor& t : full)
    fmt::print("{:<36} {:>12}  first value {:+.6f}\n", t.name, kfsdp::shape_string(t.shape), t.values<float>()[0]);
  return 0;
}
