// Tests for include/kfsdp/tensor/stateful.hpp: metadata read back as text and counts, and a file of
// another model configuration refused, naming the field (the example GPT's configuration).
#include <doctest/doctest.h>

#include <stdexcept>

#include <kfsdp/tensor/stateful.hpp>
#include <kfsdp/model/gpt.hpp>

using kfsdp::io::metadata_map;

TEST_CASE("metadata_count and check_metadata name the key, the value and the expectation") {
  const metadata_map saved{{"fit.step", "12"}, {"optimizer", "adamw"}, {"bad", "1x"}};
  CHECK(kfsdp::io::metadata_count(saved, "fit.step") == 12);
  CHECK_THROWS_WITH_AS(kfsdp::io::metadata_count(saved, "bad"),
                       "checkpoint metadata: 'bad' is '1x', expected a whole number >= 0", std::invalid_argument);
  CHECK_THROWS_WITH_AS(kfsdp::io::metadata_text(saved, "step"),
                       "checkpoint metadata: no 'step', expected it (a checkpoint of another program?)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(kfsdp::io::check_metadata(saved, "optimizer", "sgd"),
                       "checkpoint metadata: 'optimizer' is 'adamw', expected 'sgd' (this run's)",
                       std::invalid_argument);
}

TEST_CASE("check_config: a file of another configuration is refused, naming the field; a plain file passes unless required") {
  const kfsdp::gpt_config config{.layers = 2, .dim = 32, .heads = 2, .seq = 16};
  const auto fields = kfsdp::gpt_metadata(config);
  metadata_map saved(fields.begin(), fields.end());
  CHECK(saved.at("tie_weights") == "off");
  CHECK_NOTHROW(kfsdp::io::check_config(saved, fields, /*required=*/true));
  saved.insert_or_assign("heads", std::string("4"));  // no shape changes: only the metadata tells
  CHECK_THROWS_WITH_AS(kfsdp::io::check_config(saved, fields, true), "was saved with heads = 4, this model has heads = 2",
                       std::invalid_argument);
  const metadata_map plain{{"format", "pt"}};  // a standard safetensors file
  CHECK_NOTHROW(kfsdp::io::check_config(plain, fields, /*required=*/false));
  CHECK_THROWS_WITH_AS(kfsdp::io::check_config(plain, fields, true),
                       "no 'layers' in its metadata, expected this model's layers = 2", std::invalid_argument);
  CHECK_THROWS_WITH_AS(kfsdp::io::check_config(saved, fields, true, "checkpoint f.st (--resume) "),
                       "checkpoint f.st (--resume) was saved with heads = 4, this model has heads = 2", std::invalid_argument);
}
