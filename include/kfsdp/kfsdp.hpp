#pragma once
// kfsdp/kfsdp.hpp — the common case in one include: models and their layers, the FSDP engine
// and its options, the trainer, the optimizers and schedules, the datasets, state dicts and one-process
// safetensors files. No backend: it includes neither MPI, NCCL nor HDF5, so a program that uses it
// alone links the kfsdp library only (pkg-config kfsdp, CMake kfsdp::kfsdp) and trains on one rank
// with comm::self. The backends and what needs them are included by name:
//   kfsdp/comm/mpi/mpi.hpp, kfsdp/session.hpp, kfsdp/train/fit.hpp      MPI
//   kfsdp/io/checkpoint/checkpoint.hpp, hf_checkpoint.hpp          MPI-IO checkpoints
//   kfsdp/comm/nccl/nccl.hpp                                            NCCL
//   kfsdp/io/data/hdf5.hpp                                         parallel HDF5
//
//   #include <kfsdp/kfsdp.hpp>
//   using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 4, 64>, kfsdp::gelu<>,
//                                 kfsdp::linear<"fc2", 64, 1>, kfsdp::mse<>>;
//   kfsdp::environment kokkos_up(argc, argv);
//   kfsdp::comm::self one;
//   kfsdp::trainer<mlp, double> t(mlp{}, one, {.sharding_strategy = kfsdp::sharding_strategy::zero3,
//                                             .bucketing_strategy = kfsdp::bucketing::layer});
//   t.initialize(/*seed=*/0);
//   kfsdp::optim::adamw<double> adam(t, {.lr = 1e-3});   // the trainer holds the shard size
//   auto [loss, grad_norm] = t.step({{x, y}}, adam);
// (test/static/umbrella.cpp builds and runs this with nothing but this include.)

#include <kfsdp/environment.hpp>

#include <kfsdp/comm/any_communicator.hpp>
#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/comm/threaded/threaded.hpp>

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/descriptor.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/llama.hpp>
#include <kfsdp/model/llama_config.hpp>
#include <kfsdp/model/param_table.hpp>

#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/fsdp/memory_fit.hpp>
#include <kfsdp/fsdp/options.hpp>
#include <kfsdp/fsdp/policies.hpp>

#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/optim/any_optimizer.hpp>
#include <kfsdp/optim/clip.hpp>
#include <kfsdp/optim/param_groups.hpp>
#include <kfsdp/optim/schedule.hpp>
#include <kfsdp/optim/sgd.hpp>

#include <kfsdp/train/evaluate.hpp>
#include <kfsdp/train/gpt.hpp>
#include <kfsdp/train/llama.hpp>
#include <kfsdp/train/trainer.hpp>

#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/io/data/dataset.hpp>
#include <kfsdp/io/data/distributed_sampler.hpp>
#include <kfsdp/io/data/numpy.hpp>
#include <kfsdp/io/data/text_dataset.hpp>

#include <kfsdp/io/checkpoint/safetensors_file.hpp>  // one process: save_state_dict_file, load_state_dict_file
#include <kfsdp/tensor/state_dict.hpp>

#include <kfsdp/infer/generate.hpp>
#include <kfsdp/infer/predictor.hpp>
