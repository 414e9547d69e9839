#include <doctest/doctest.h>

#include <stdexcept>

#include <kfsdp/model/layers.hpp>

using kfsdp::dyn;

static_assert(kfsdp::layer_descriptor<kfsdp::linear<"fc", 4, 13>>);
static_assert(kfsdp::linear<"fc", 4, 13>{}.params()[0].shape[0] == 13);  // PyTorch: [out, in]
static_assert(kfsdp::linear<"fc", 4, 13>{}.params()[0].shape[1] == 4);
static_assert(kfsdp::linear<"fc", 4, 13>{}.params().size() == 2);
static_assert(kfsdp::linear<"head", 4, 256, false>{}.params().size() == 1);
static_assert(kfsdp::layer_norm<"ln", 7>{}.params()[1].name == "bias");
static_assert(kfsdp::embedding<"wte", 256, 8>{}.params()[0].shape[0] == 256);
static_assert(kfsdp::linear<"fc", dyn, dyn>(3, 5).params()[0].shape[0] == 5);
static_assert(!std::is_default_constructible_v<kfsdp::linear<"fc", dyn, 5>>);

TEST_CASE("run-time sizes are checked by the same code as static ones") {
  CHECK_THROWS_WITH_AS((kfsdp::linear<"fc", dyn, dyn>(0, 5)),
                       "kfsdp: linear 'fc': in_features is 0, expected at least 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((kfsdp::linear<"fc", 4, dyn>(5, 5)),
                       "kfsdp: linear 'fc': in_features is 5, expected the static size 4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(kfsdp::layer_norm<"ln_f">(0),
                       "kfsdp: layer_norm 'ln_f': dim is 0, expected at least 1", std::invalid_argument);
  CHECK_THROWS_WITH_AS((kfsdp::embedding<"wpe">(0, 3)),
                       "kfsdp: embedding 'wpe': num_embeddings is 0, expected at least 1",
                       std::invalid_argument);
  CHECK(kfsdp::linear<"fc", dyn, dyn>(3, 5).out_features == 5);
}
