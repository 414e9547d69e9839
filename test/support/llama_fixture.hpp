#pragma once
// The tiny Llama fixture of test/model/llama (transformers' LlamaForCausalLM, made by
// make_fixture.py) and the comparison of a trainer that holds its weights with transformers'
// logits on window 0 and mean loss over windows 0..3 (reference.safetensors).
//   check_logits_and_loss(t, world, "f32", "tiny-f32", 1e-5, 1e-6);

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/io/data/text_dataset.hpp>
#include <kfsdp/train/gpt.hpp>

namespace kfsdp::test {

inline const std::filesystem::path llama_fixture = std::filesystem::path(KFSDP_SOURCE_ROOT) / "test" / "model" / "llama";

inline const state_dict& llama_reference() {
  static const state_dict r = io::load_state_dict_file(llama_fixture / "reference.safetensors");
  return r;
}

// The shipped text in the fixture's windows (seq 64).
inline io::text_windows llama_fixture_text() {
  return io::text_windows::from_file(std::filesystem::path(KFSDP_SOURCE_ROOT) / "data" / "kjv-genesis-exodus.txt", 64);
}

template <class Scalar>
double max_abs_difference(std::span<const Scalar> got, std::span<const Scalar> want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
  return worst;
}

// The model's logits on window 0 of `text` (the fixture's by default; every rank gets them whole).
template <class Scalar, class Trainer>
std::vector<Scalar> window0_logits(Trainer& t, const io::text_windows& text = llama_fixture_text()) {
  std::vector<int> tokens, targets;
  text.append(0, tokens, targets);
  std::vector<Scalar> logits;
  t.with_full_model([&] {
    const auto view = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.predict(device_ids(tokens)));
    logits.assign(view.data(), view.data() + view.span());
  });
  return logits;
}

// `t` holds the fixture's weights; `suffix` picks the reference's f32 or f64 entries.
template <class Scalar, class Trainer>
void check_logits_and_loss(Trainer& t, comm::mpi& world, const std::string& suffix, const std::string& label,
                           double logits_tolerance, double loss_tolerance) {
  const auto data = llama_fixture_text();
  const std::vector<Scalar> logits = window0_logits<Scalar>(t);
  const double logits_error =
      max_abs_difference<Scalar>(logits, llama_reference().at("logits." + suffix).template values<Scalar>());
  const double want = double(llama_reference().at("loss." + suffix).template values<Scalar>()[0]);
  const double loss = evaluate_windows(t, data, 4, world);
  MESSAGE(label, " at ", world.size(), " ranks: logits within ", logits_error, ", loss ", loss, " against ", want,
          " (relative ", std::abs(loss - want) / want, ")");
  CHECK(logits_error <= logits_tolerance);
  CHECK(std::abs(loss - want) <= loss_tolerance * want);
}

}  // namespace kfsdp::test
