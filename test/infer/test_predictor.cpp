// kfsdp::predictor (include/kfsdp/infer/predictor.hpp): the weights a trainer saved predict as the
// trainer does (f64 bit for bit, an f32 file in a double model to 1e-6, BF16 converted), the
// normalisation saved with them applied, and the files that do not fit refused, naming the tensor.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/infer/predictor.hpp>
#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/optim/adamw.hpp>
#include <kfsdp/train/trainer.hpp>

#include "../support/messages.hpp"

namespace {

using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 3, 16>, kfsdp::gelu<>, kfsdp::layer_norm<"ln", 16>,
                              kfsdp::linear<"fc2", 16, 2>, kfsdp::mse<>>;
using narrow = kfsdp::sequential<"", kfsdp::linear<"fc1", 3, 8>, kfsdp::gelu<>, kfsdp::layer_norm<"ln", 8>,
                                 kfsdp::linear<"fc2", 8, 2>, kfsdp::mse<>>;

kfsdp::io::array_dataset samples() {
  std::vector<double> x(40 * 3), y(40 * 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7 * double(i)) * 3 + 1;
  for (std::size_t i = 0; i < 40; ++i) {
    y[2 * i] = 10 + x[3 * i] * x[3 * i + 1];
    y[2 * i + 1] = std::cos(x[3 * i + 2]);
  }
  return kfsdp::io::array_dataset(x, 3, y, 2);
}

std::filesystem::path scratch(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("kfsdp-test-predictor-" + std::to_string(::getpid()) + "-" + name);
}

// A few AdamW steps of an mlp at Scalar, saved (with the data's normalisation) to `path`; returns
// the trainer's predictions for the first 8 samples, in the data's units.
template <class Scalar>
std::vector<double> train_and_save(const std::filesystem::path& path, bool with_stats) {
  kfsdp::comm::self one;
  kfsdp::io::array_dataset data = samples();
  kfsdp::io::metadata_map metadata;
  kfsdp::io::array_dataset::normalization stats{data.feature_stats(), data.target_stats()};
  if (with_stats) {
    data.normalize(stats.features, stats.targets);
    metadata = kfsdp::io::stats_metadata(stats);
  }
  kfsdp::trainer<mlp, Scalar> trainer(mlp{}, one);
  trainer.initialize(3);
  kfsdp::optim::adamw<Scalar> adam(trainer, {.lr = 1e-2});
  for (std::size_t step = 0; step < 5; ++step) {
    auto [x, y] = data.rank_slice<Scalar>(data.micro_batch(1, step, 8), 0, 1);
    trainer.step({{x, y}}, adam);
  }
  kfsdp::io::save_state_dict_file(path, trainer.engine().original_state_dict(), metadata);
  const auto predicted = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), trainer.predict(data.rows<Scalar>(0, 8).first));
  std::vector<double> out;
  for (std::size_t r = 0; r < 8; ++r)
    for (std::size_t c = 0; c < 2; ++c)
      out.push_back(double(predicted(r, c)) * (with_stats ? stats.targets.stddev[c] : 1.0) +
                    (with_stats ? stats.targets.mean[c] : 0.0));
  return out;
}

std::vector<double> first_inputs() {
  const kfsdp::io::array_dataset data = samples();
  auto [x, y] = data.rows<double>(0, 8);
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  std::vector<double> out;
  for (std::size_t r = 0; r < 8; ++r)
    for (std::size_t c = 0; c < 3; ++c) out.push_back(host(r, c));
  return out;
}

}  // namespace

TEST_CASE("predictor: an f64 file predicts as the trainer did, bit for bit, its normalisation applied") {
  for (const bool with_stats : {false, true}) {
    CAPTURE(with_stats);
    const auto path = scratch("f64.safetensors");
    const std::vector<double> expected = train_and_save<double>(path, with_stats);
    kfsdp::predictor<mlp, double> model(mlp{}, path);
    CHECK(model.normalizes() == with_stats);
    CHECK(model.in_features() == 3);  // the model's widths, for callers that check theirs (the C API)
    CHECK(model.out_features() == 2);
    const std::vector<double> got = model.predict(first_inputs(), 8);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
    if (!with_stats)
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == expected[i]);
    std::filesystem::remove(path);
  }
}

TEST_CASE("predictor: an f32 file in a double model to 1e-6; a BF16 copy converts") {
  const auto path = scratch("f32.safetensors");
  const std::vector<double> expected = train_and_save<float>(path, true);
  kfsdp::predictor<mlp, double> model(mlp{}, path);
  const std::vector<double> got = model.predict(first_inputs(), 8);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-6));
  // The same weights rounded to BF16: about 3 significant digits.
  kfsdp::io::metadata_map metadata;
  kfsdp::state_dict full = kfsdp::io::load_state_dict_file(path, &metadata);
  std::vector<kfsdp::tensor> halves;
  for (const kfsdp::tensor& t : full) {
    kfsdp::tensor h{t.name, t.shape, kfsdp::dtype::BF16, {}};
    for (const float v : t.values<float>()) {
      const std::uint16_t bits = kfsdp::bf16(v).bits;
      h.bytes.push_back(std::byte(bits & 0xFF));
      h.bytes.push_back(std::byte(bits >> 8));
    }
    halves.push_back(std::move(h));
  }
  const auto bf16_path = scratch("bf16.safetensors");
  kfsdp::io::metadata_map user;  // the statistics stay with the weights
  for (const auto& [key, value] : metadata)
    if (key.starts_with("normalization.")) user[key] = value;
  kfsdp::io::save_state_dict_file(bf16_path, kfsdp::state_dict(std::move(halves)), user);
  kfsdp::predictor<mlp, double> rounded(mlp{}, bf16_path);
  const std::vector<double> approx = rounded.predict(first_inputs(), 8);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(approx[i] == doctest::Approx(expected[i]).epsilon(0.05));
  std::filesystem::remove(path);
  std::filesystem::remove(bf16_path);
}

TEST_CASE("predictor: a file that does not fit the model is refused, naming the tensor") {
  const auto path = scratch("refused.safetensors");
  (void)train_and_save<double>(path, false);
  CHECK(kfsdp::test::error_message([&] { kfsdp::predictor<narrow, double> wrong(narrow{}, path); }) ==
        "kfsdp::predictor: " + path.string() + " tensor 'fc1.weight' has shape [16, 3], the model's is [8, 3]");
  kfsdp::state_dict full = kfsdp::io::load_state_dict_file(path);
  std::vector<kfsdp::tensor> fewer, more;
  for (const kfsdp::tensor& t : full) {
    if (t.name != "ln.bias") fewer.push_back(t);
    more.push_back(t);
  }
  more.push_back(kfsdp::tensor::zeros("head.weight", {2, 2}, kfsdp::dtype::F64));
  kfsdp::io::save_state_dict_file(path, kfsdp::state_dict(std::move(fewer)));
  CHECK(kfsdp::test::error_message([&] { kfsdp::predictor<mlp, double> missing(mlp{}, path); }) ==
        "kfsdp::predictor: " + path.string() + " has no tensor 'ln.bias', a parameter of the model");
  kfsdp::io::save_state_dict_file(path, kfsdp::state_dict(std::move(more)));
  CHECK(kfsdp::test::error_message([&] { kfsdp::predictor<mlp, double> extra(mlp{}, path); }) ==
        "kfsdp::predictor: " + path.string() + " holds tensor 'head.weight', which the model does not have");
  std::filesystem::remove(path);
}

TEST_CASE("predictor: normalisation statistics that do not fit the model are refused, naming the key") {
  // A file without checksums whose statistics are edited: too few stddevs read past the buffer, a NaN stddev gave
  // NaN predictions and a zero one constant predictions, all with no error.
  const auto path = scratch("stats.safetensors");
  (void)train_and_save<double>(path, true);
  kfsdp::io::metadata_map metadata;
  const kfsdp::state_dict weights = kfsdp::io::load_state_dict_file(path, &metadata);
  const auto refused = [&](const std::string& key, const std::string& value) {
    kfsdp::io::metadata_map edited;  // the statistics (the writer sets the checksums)
    for (const auto& [k, v] : metadata)
      if (k.starts_with("normalization.")) edited[k] = v;
    edited.at(key) = value;
    kfsdp::io::save_state_dict_file(path, weights, edited);
    return kfsdp::test::error_message([&] { kfsdp::predictor<mlp, double> model(mlp{}, path); });
  };
  const std::string prefix = "kfsdp::predictor: " + path.string() +
                             " has normalisation statistics that do not fit the model: kfsdp::io::stats_from_metadata: ";
  CHECK(refused("normalization.features.stddev", "1,2") ==
        prefix + "'normalization.features.stddev' has 2 values, expected in_features = 3 (the model's)");
  CHECK(refused("normalization.features.mean", "1,2,3,4") ==
        prefix + "'normalization.features.mean' has 4 values, expected in_features = 3 (the model's)");
  CHECK(refused("normalization.targets.stddev", "1") ==
        prefix + "'normalization.targets.stddev' has 1 values, expected out_features = 2 (the model's)");
  CHECK(refused("normalization.features.stddev", "1,nan,2") ==
        prefix + "'normalization.features.stddev' value 1 is nan, expected a finite number > 0");
  CHECK(refused("normalization.targets.stddev", "0,1") ==
        prefix + "'normalization.targets.stddev' value 0 is 0, expected a finite number > 0");
  CHECK(refused("normalization.features.stddev", "1,1,-2") ==
        prefix + "'normalization.features.stddev' value 2 is -2, expected a finite number > 0");
  CHECK(refused("normalization.targets.mean", "inf,0") ==
        prefix + "'normalization.targets.mean' value 0 is inf, expected a finite number");
  std::filesystem::remove(path);
}
