// The header build of the MLP the module test trains, compiled without `import` (and a second TU
// that both imports kfsdp and includes its headers: one entity either way).
#include <Kokkos_Core.hpp>

#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/trainer.hpp>

#include "mlp.hpp"

std::vector<double> header_mlp_losses() { return kfsdp_module_test::train_mlp(); }
