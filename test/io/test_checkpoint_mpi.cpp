// Tests for include/kfsdp/io/checkpoint/checkpoint.hpp under mpirun with 1, 2, 3 and 4 ranks: the parallel
// file equals the gathered one byte for byte, a file written at world size 3 loads at 1, 2 and 4,
// optimizer moments and metadata round-trip, a kill mid-write leaves the old file, and every
// malformed file raises format_error naming the file and the tensor on every rank, shards untouched.
#include <doctest/doctest.h>

#include <csignal>
#include <cstring>
#include <sys/resource.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/self/self.hpp>
#include <kfsdp/comm/threaded/threaded.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/optim/adamw.hpp>

#include "../support/scratch_directory.hpp"

#include "../fsdp/engine_checks.hpp"

using namespace kfsdp;
using namespace kfsdp::testing;
using kfsdp::io::format_error;
using kfsdp::io::metadata_map;

namespace {

namespace fs = std::filesystem;

// The ranks of `world` with the same colour as a communicator of their own (none for no colour).
std::optional<comm::mpi> split(comm::mpi& world, std::optional<int> colour) {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(world.native(), colour ? *colour : MPI_UNDEFINED, world.rank(), &sub);
  if (sub == MPI_COMM_NULL) return std::nullopt;
  std::optional<comm::mpi> wrapped(std::in_place, sub);
  MPI_Comm_free(&sub);
  return wrapped;
}

std::vector<char> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool same_tensors(const state_dict& a, const state_dict& b) {
  if (a.size() != b.size()) return false;
  for (const tensor& t : a) {
    const tensor* other = b.find(t.name);
    if (other == nullptr || other->shape != t.shape || other->type != t.type || other->bytes != t.bytes)
      return false;
  }
  return true;
}

// A moment value that depends only on (group, parameter, global element): the same at every world size.
template <class Scalar>
Scalar moment_value(int group, std::size_t param, std::size_t element) {
  return Scalar(group * 1000 + static_cast<int>(param)) + Scalar(element) / Scalar(1024);
}

// Fills `view` (the flat shard layout) with moment_value in the real rows, zero in the padding.
template <class Scalar>
void fill_moments(const fsdp_engine<Scalar>& engine, const Kokkos::View<Scalar*>& view, int group) {
  std::vector<Scalar> host(view.extent(0), Scalar{0});
  const auto rank = static_cast<std::size_t>(engine.rank());
  for (std::size_t p = 0; p < engine.plan().params.size(); ++p) {
    const index_range mine = engine.mapping().elements(p, rank);
    for (std::size_t j = 0; j < mine.count; ++j)
      host[engine.mapping().chunk(p).first + j] = moment_value<Scalar>(group, p, mine.first + j);
  }
  Kokkos::deep_copy(view, Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                              host.data(), host.size()));
}

// The positions where `view` differs from what fill_moments writes (padding must be zero).
template <class Scalar>
std::size_t moment_mismatches(const fsdp_engine<Scalar>& engine, const Kokkos::View<Scalar*>& view, int group) {
  const std::vector<Scalar> host = to_host(view);
  const auto rank = static_cast<std::size_t>(engine.rank());
  std::size_t wrong = 0;
  for (std::size_t p = 0; p < engine.plan().params.size(); ++p) {
    const index_range chunk = engine.mapping().chunk(p), mine = engine.mapping().elements(p, rank);
    for (std::size_t j = 0; j < chunk.count; ++j) {
      const Scalar expected = j < mine.count ? moment_value<Scalar>(group, p, mine.first + j) : Scalar{0};
      wrong += host[chunk.first + j] != expected;
    }
  }
  return wrong;
}

// Padding elements of the engine's weight shards that are not zero.
template <class Scalar>
std::size_t nonzero_padding(fsdp_engine<Scalar>& engine) {
  const std::vector<Scalar> host = to_host(engine.shards().flat());
  const auto rank = static_cast<std::size_t>(engine.rank());
  std::size_t nonzero = 0;
  for (std::size_t p = 0; p < engine.plan().params.size(); ++p) {
    const index_range chunk = engine.mapping().chunk(p);
    for (std::size_t j = engine.mapping().elements(p, rank).count; j < chunk.count; ++j)
      nonzero += host[chunk.first + j] != Scalar{0};
  }
  return nonzero;
}

// True when every rank holds the same `text`.
bool same_on_every_rank(comm::mpi& world, const std::string& text) {
  const std::uint64_t digest = io::checksum_digest(io::checksum_of(std::as_bytes(std::span(text.data(), text.size()))));
  std::uint64_t extremes[2] = {digest, ~digest};
  MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_UINT64_T, MPI_MAX, world.native());
  return extremes[0] == ~extremes[1];
}

// "format_error: <what>", "other: <what>", or "no error".
template <class Scalar>
std::string load_error(const fs::path& path, fsdp_engine<Scalar>& engine) {
  try {
    (void)io::load_model(path, engine);
  } catch (const format_error& error) {
    return std::string("format_error: ") + error.what();
  } catch (const std::exception& error) {
    return std::string("other: ") + error.what();
  }
  return "no error";
}

const metadata_map sample_metadata{{"step", "7"}, {"data.position", "3584"}, {"note", "grüße"}};

template <class Model, class Scalar>
void check_parallel_file_equals_gathered(comm::mpi& world, const fs::path& directory,
                                         const std::string& tag, param_init (*choose)(const param_info&)) {
  CAPTURE(tag);
  for (bucketing b : {bucketing::none, bucketing::block}) {
    fsdp_engine<Scalar> engine(make_param_table(Model{}), world, {.bucketing_strategy = b});
    engine.initialize(5, choose);
    const fs::path parallel = directory / (tag + ".parallel.safetensors");
    const fs::path gathered = directory / (tag + ".gathered.safetensors");
    io::save_model(parallel, engine, sample_metadata);
    const state_dict full = engine.original_state_dict(/*rank0_only=*/true);
    if (world.rank() == 0) io::save_state_dict_file(gathered, full, sample_metadata);
    world.barrier();
    if (world.rank() == 0) {
      const std::vector<char> parallel_bytes = file_bytes(parallel);
      CHECK(!parallel_bytes.empty());
      CHECK(parallel_bytes == file_bytes(gathered));
      metadata_map metadata;
      CHECK(same_tensors(io::load_state_dict_file(parallel, &metadata), full));
      CHECK(metadata.at("step") == "7");
      CHECK(metadata.at("kfsdp.parameters") == std::to_string(engine.params().size()));
    }
  }
}

}  // namespace

TEST_CASE("the parallel file is byte-identical to the gathered-to-rank-0 file") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  check_parallel_file_equals_gathered<tiny_gpt, float>(world, scratch.path, "gpt_float", gpt_like_init);
  check_parallel_file_equals_gathered<tiny_gpt, double>(world, scratch.path, "gpt_double", gpt_like_init);
  check_parallel_file_equals_gathered<thunder_padding, float>(world, scratch.path, "padding", all_normal);
}

// A standard safetensors file as the format's specification has it (what the safetensors library
// and PyTorch write): an 8-byte little-endian header length, the JSON header padded with spaces to
// a multiple of 8, the tensors' bytes; no __metadata__, so none of kfsdp's checksum keys.
void write_standard_safetensors(const fs::path& path, const state_dict& full) {
  std::string json = "{";
  std::uint64_t offset = 0;
  std::string data;
  for (const tensor& t : full) {  // state_dict keeps the names sorted
    const auto values = t.values<double>();
    const std::uint64_t bytes = values.size() * sizeof(double);
    json += fmt::format("{}\"{}\":{{\"dtype\":\"F64\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                        json.size() > 1 ? "," : "", t.name, fmt::join(t.shape, ","), offset, offset + bytes);
    data.append(reinterpret_cast<const char*>(values.data()), bytes);
    offset += bytes;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  for (int byte = 0; byte < 8; ++byte) out.put(static_cast<char>((std::uint64_t{json.size()} >> (8 * byte)) & 0xff));
  out << json << data;
}

TEST_CASE("a standard safetensors file (no kfsdp checksums) loads after the layout checks, at every world size") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const fs::path file = scratch.path / "standard.safetensors";
  fsdp_engine<double> source(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = bucketing::layer});
  source.initialize(3, all_normal);
  const state_dict full = source.original_state_dict();
  if (world.rank() == 0) write_standard_safetensors(file, full);
  world.barrier();

  fsdp_engine<double> loaded(make_param_table(tiny_gpt{}), world, {.bucketing_strategy = bucketing::block});
  (void)io::load_model(file, loaded);
  const state_dict back = loaded.original_state_dict();
  for (const tensor& t : full) {
    CAPTURE(t.name);
    const auto a = back.at(t.name).values<double>(), b = t.values<double>();
    CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  }
  CHECK(io::load_state_dict_file(file).size() == full.size());
  // Its layout is still checked: a model it does not fit is refused, naming the tensor.
  fsdp_engine<double> other(make_param_table(thunder_padding{}), world, {});
  CHECK_THROWS_AS((void)io::load_model(file, other), format_error);
}

TEST_CASE("a NaN or an infinity in a file without checksums is refused by load_model, naming the tensor") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  fsdp_engine<double> source(make_param_table(tiny_gpt{}), world, {});
  source.initialize(3, all_normal);
  const state_dict full = source.original_state_dict();
  for (const double bad :
       {std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::infinity()}) {
    const fs::path file = scratch.path / "diverged.safetensors";
    if (world.rank() == 0) {  // the last value of lm_head.weight: the last rank's rows
      state_dict poisoned;
      for (const tensor& t : full) {
        tensor copy = t;
        if (copy.name == "lm_head.weight")
          std::memcpy(copy.bytes.data() + copy.bytes.size() - sizeof bad, &bad, sizeof bad);
        poisoned.add(std::move(copy));
      }
      write_standard_safetensors(file, poisoned);
    }
    world.barrier();
    fsdp_engine<double> loaded(make_param_table(tiny_gpt{}), world, {});
    loaded.initialize(5, all_normal);
    const state_dict before = loaded.original_state_dict();
    const std::string error = load_error(file, loaded);
    CAPTURE(error);
    CHECK(error ==
          fmt::format("format_error: kfsdp::io::load_model: file '{}': tensor 'lm_head.weight': holds {}, "
                      "expected finite values (a diverged or corrupted model); nothing was loaded",
                      file.string(), bad));
    CHECK(same_on_every_rank(world, error));
    CHECK(same_tensors(loaded.original_state_dict(), before));
  }
}

TEST_CASE("a load is strict: a standard file's tensors that the model lacks are refused, naming them") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const fs::path file = scratch.path / "three_blocks.safetensors";
  fsdp_engine<double> source(make_param_table(gpt<3, 8, 5>{}), world, {});
  source.initialize(3, all_normal);
  const state_dict full = source.original_state_dict();
  if (world.rank() == 0) write_standard_safetensors(file, full);
  world.barrier();

  fsdp_engine<double> shallower(make_param_table(gpt<2, 8, 5>{}), world, {});
  shallower.initialize(5, all_normal);
  const state_dict before = shallower.original_state_dict();
  const std::string error = load_error(file, shallower);
  CAPTURE(error);
  CHECK(error.starts_with(fmt::format("format_error: kfsdp::io::load_model: file '{}': holds 12 tensors that the model "
                                      "does not have: 'transformer.h.2.",
                                      file.string())));
  CHECK(error.ends_with(" and 4 more; expected the model's tensors only (kfsdp::io::import_weights loads those it has "
                        "and reports the others)"));
  CHECK(same_on_every_rank(world, error));
  CHECK(same_tensors(shallower.original_state_dict(), before));
  // The lenient load is the explicit one: it loads what matches and names the rest.
  const io::import_report report = io::import_weights(file, shallower);
  CHECK(report.missing.empty());
  REQUIRE(report.unexpected.size() == 12);
  for (const std::string& name : report.unexpected) CHECK(name.starts_with("transformer.h.2."));
}

TEST_CASE("import_weights loads by name for fine-tuning and names what is missing and unexpected") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const fs::path two_blocks = scratch.path / "two_blocks.safetensors";
  fsdp_engine<double> pretrained(make_param_table(gpt<2, 8, 5>{}), world, {});
  pretrained.initialize(3, all_normal);
  io::save_model(two_blocks, pretrained, {{"step", "9"}});
  const state_dict source = pretrained.original_state_dict();

  // A deeper model: the shared layers and the first two blocks come from the file, the third
  // block keeps its own initialisation.
  fsdp_engine<double> deeper(make_param_table(gpt<3, 8, 5>{}), world, {.bucketing_strategy = bucketing::block});
  deeper.initialize(11, all_normal);
  const state_dict before = deeper.original_state_dict();
  const io::import_report report = io::import_weights(two_blocks, deeper);
  CHECK(report.metadata.at("step") == "9");
  CHECK(report.unexpected.empty());
  CHECK(report.loaded.size() == source.size());
  CHECK(report.missing.size() == deeper.params().size() - source.size());
  for (const std::string& name : report.missing) CHECK(name.starts_with("transformer.h.2."));
  const state_dict after = deeper.original_state_dict();
  for (const tensor& t : after) {
    CAPTURE(t.name);
    const tensor* from_file = source.find(t.name);
    CHECK(t.bytes == (from_file != nullptr ? from_file->bytes : before.at(t.name).bytes));
  }
  CHECK(nonzero_padding(deeper) == 0);
  CHECK(io::describe(report).starts_with(fmt::format(
      "loaded {} of {} tensors; missing (kept as they were): 'transformer.h.2.", source.size(),
      deeper.params().size())));

  // The other way: the third block's tensors are unexpected and ignored.
  const fs::path three_blocks = scratch.path / "three_blocks.safetensors";
  io::save_model(three_blocks, deeper);
  fsdp_engine<double> shallower(make_param_table(gpt<2, 8, 5>{}), world, {});
  const io::import_report back = io::import_weights(three_blocks, shallower);
  CHECK(back.missing.empty());
  CHECK(back.unexpected == report.missing);
  CHECK(io::describe(back).find("; unexpected (ignored): 'transformer.h.2.") != std::string::npos);
  CHECK(same_tensors(shallower.original_state_dict(), source));
  // load_model stays strict: the same file is refused there, naming the count.
  CHECK(load_error(three_blocks, shallower).find("weight tensors") != std::string::npos);

  // A name in both with another shape is an error on every rank, the shards unchanged.
  fsdp_engine<double> wider(make_param_table(gpt<2, 16, 5>{}), world, {});
  wider.initialize(5, all_normal);
  const state_dict wider_before = wider.original_state_dict();
  CHECK_THROWS_WITH_AS((void)io::import_weights(two_blocks, wider),
                       doctest::Contains("tensor 'transformer.wte.weight': shape [256, 8] in the file, expected [256, 16] for the model"), format_error);
  CHECK(same_tensors(wider.original_state_dict(), wider_before));
}

TEST_CASE("written at world size 3, loaded at 1, 2 and 4: identical state dicts and moments, padding zero") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const fs::path file = scratch.path / "ckpt.safetensors";
  const fs::path file_at_1 = scratch.path / "ckpt_at_1.safetensors";
  const int writers = std::min(3, world.size());
  const auto table = make_param_table(tiny_gpt{});

  // The reference: the same initialisation on one rank alone.
  std::optional<comm::mpi> alone = split(world, world.rank());
  fsdp_engine<float> reference(table, *alone, {});
  reference.initialize(21, all_normal);
  const state_dict expected = reference.original_state_dict();

  // One file written by `writers` ranks, one by rank 0 alone: the same bytes.
  const auto save_with = [&](comm::mpi& comm, const fs::path& path) {
    fsdp_engine<float> engine(table, comm, {.bucketing_strategy = bucketing::layer});
    engine.initialize(21, all_normal);
    Kokkos::View<float*> exp_avg("exp_avg", engine.plan().shard_numel);
    Kokkos::View<float*> exp_avg_sq("exp_avg_sq", engine.plan().shard_numel);
    fill_moments(engine, exp_avg, 1);
    fill_moments(engine, exp_avg_sq, 2);
    io::save_checkpoint(path, engine,
                        io::checkpoint_state<float>{.metadata = {{"step", "300"}},
                                                    .shards = {{"optimizer.exp_avg", exp_avg},
                                                               {"optimizer.exp_avg_sq", exp_avg_sq}}});
  };
  if (std::optional<comm::mpi> writing = split(world, world.rank() < writers ? std::optional(0) : std::nullopt))
    save_with(*writing, file);
  if (world.rank() == 0) save_with(*alone, file_at_1);
  world.barrier();
  if (world.rank() == 0) CHECK(file_bytes(file) == file_bytes(file_at_1));

  for (int loaders : {1, 2, 4, world.size()}) {
    if (loaders > world.size()) continue;
    CAPTURE(loaders);
    const int group = world.rank() / loaders;
    const bool member = (group + 1) * loaders <= world.size();
    std::optional<comm::mpi> loading = split(world, member ? std::optional(group) : std::nullopt);
    if (!loading) continue;
    fsdp_engine<float> engine(table, *loading, {.bucketing_strategy = bucketing::block});
    Kokkos::deep_copy(engine.shards().flat(), 99.0f);  // garbage everywhere, padding included
    Kokkos::View<float*> exp_avg("exp_avg", engine.plan().shard_numel);
    Kokkos::View<float*> exp_avg_sq("exp_avg_sq", engine.plan().shard_numel);
    Kokkos::deep_copy(exp_avg, 99.0f);
    Kokkos::deep_copy(exp_avg_sq, 99.0f);
    io::checkpoint_state<float> state{.metadata = {},
                                      .shards = {{"optimizer.exp_avg", exp_avg},
                                                 {"optimizer.exp_avg_sq", exp_avg_sq}}};
    io::load_checkpoint(file, engine, state);
    CHECK(nonzero_padding(engine) == 0);
    CHECK(moment_mismatches(engine, exp_avg, 1) == 0);
    CHECK(moment_mismatches(engine, exp_avg_sq, 2) == 0);
    CHECK(state.metadata.at("step") == "300");
    CHECK(same_tensors(engine.original_state_dict(), expected));
  }
}

TEST_CASE("under HSDP the first shard group writes the flat file; a failed write throws on every rank") {
  comm::mpi world;
  if (world.size() < 2 || world.size() % 2 != 0) return;  // two shard groups of half the ranks
  test::scratch_directory scratch(world, "checkpoint");
  const auto table = make_param_table(tiny_gpt{});
  const int group_size = world.size() / 2;
  comm::mpi shard_group = world.split(world.rank() / group_size, world.rank());
  comm::mpi replicas = world.split(shard_group.rank(), world.rank());
  fsdp_engine<float> engine(table, shard_group,
                            {.bucketing_strategy = bucketing::layer, .replica_group = comm::any_communicator(replicas)});
  engine.initialize(21, all_normal);
  const fs::path hybrid = scratch.path / "hybrid.safetensors", flat = scratch.path / "flat.safetensors";
  io::save_model(hybrid, engine, {{"step", "7"}});
  std::optional<comm::mpi> alone = split(world, world.rank());
  if (world.rank() == 0) {
    fsdp_engine<float> one(table, *alone, {});
    one.initialize(21, all_normal);
    io::save_model(flat, one, {{"step", "7"}});
  }
  world.barrier();
  if (world.rank() == 0) CHECK(file_bytes(hybrid) == file_bytes(flat));  // what flat FSDP writes, byte for byte

  const fs::path nowhere = scratch.path / "missing-directory" / "ckpt.safetensors";
  std::string message;
  try {
    io::save_model(nowhere, engine);
  } catch (const std::exception& error) {
    message = error.what();
  }
  CAPTURE(message);
  CHECK(!message.empty());  // every rank threw
  if (replicas.rank() != 0)
    CHECK(message.find("the first shard group could not write it (its ranks say why)") != std::string::npos);
  CHECK(!fs::exists(nowhere));
}

TEST_CASE("AdamW moments and progress round-trip; the resumed optimizer steps exactly as the original") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const fs::path file = scratch.path / "train.safetensors";
  const optim::adamw_options options{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1};

  fsdp_engine<double> engine(make_param_table(thunder_padding{}), world, {.bucketing_strategy = bucketing::layer});
  engine.initialize(8, all_normal);
  optim::adamw<double> optimizer(engine.plan().shard_numel, options);
  fill_moments(engine, engine.grads().flat(), 3);  // a gradient with zero padding
  optimizer.step(engine.shards().flat(), engine.grads().flat());
  optimizer.step(engine.shards().flat(), engine.grads().flat());
  const metadata_map progress{{"step", std::to_string(optimizer.step_count())},
                              {"data.position", "123456"},
                              {"rng", "9e3779b97f4a7c15"},
                              {"optimizer", "adamw"},
                              {"optimizer.lr", fmt::format("{}", options.lr)},
                              {"optimizer.betas", fmt::format("{},{}", options.beta1, options.beta2)}};
  io::save_checkpoint(file, engine,
                      {.metadata = progress,
                       .shards = {{"optimizer.exp_avg", optimizer.exp_avg()},
                                  {"optimizer.exp_avg_sq", optimizer.exp_avg_sq()}}});

  fsdp_engine<double> resumed(make_param_table(thunder_padding{}), world, {.bucketing_strategy = bucketing::none});
  optim::adamw<double> resumed_optimizer(resumed.plan().shard_numel, options);
  io::checkpoint_state<double> state{.metadata = {},
                                     .shards = {{"optimizer.exp_avg", resumed_optimizer.exp_avg()},
                                                {"optimizer.exp_avg_sq", resumed_optimizer.exp_avg_sq()}}};
  io::load_checkpoint(file, resumed, state);
  for (const auto& [key, value] : progress) CHECK(state.metadata.at(key) == value);
  resumed_optimizer.set_step_count(std::stoll(state.metadata.at("step")));
  CHECK(to_host(resumed.shards().flat()) == to_host(engine.shards().flat()));
  CHECK(to_host(resumed_optimizer.exp_avg()) == to_host(optimizer.exp_avg()));
  CHECK(to_host(resumed_optimizer.exp_avg_sq()) == to_host(optimizer.exp_avg_sq()));

  fill_moments(resumed, resumed.grads().flat(), 3);
  optimizer.step(engine.shards().flat(), engine.grads().flat());
  resumed_optimizer.step(resumed.shards().flat(), resumed.grads().flat());
  CHECK(to_host(resumed.shards().flat()) == to_host(engine.shards().flat()));

  // load_model reads the weights of a checkpoint file and ignores the optimizer's tensors.
  fsdp_engine<double> weights_only(make_param_table(thunder_padding{}), world, {});
  (void)io::load_model(file, weights_only);
  CHECK(same_tensors(weights_only.original_state_dict(), resumed.original_state_dict()) ==
        false);  // `resumed` stepped once more since the save
  fsdp_engine<double> saved_weights(make_param_table(thunder_padding{}), world, {});
  io::checkpoint_state<double> nothing_else{};
  io::load_checkpoint(file, saved_weights, nothing_else);
  CHECK(same_tensors(weights_only.original_state_dict(), saved_weights.original_state_dict()));
}

TEST_CASE("a job killed mid-write leaves the previous checkpoint intact and loadable") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const fs::path file = scratch.path / "model.safetensors";
  const auto table = make_param_table(tiny_gpt{});
  fsdp_engine<float> engine(table, world, {});
  engine.initialize(1, gpt_like_init);
  io::save_model(file, engine);
  const std::vector<float> old_shard = to_host(engine.shards().flat());

  for (const bool only_last_rank : {false, true}) {
    CAPTURE(only_last_rank);
    engine.initialize(2, all_normal);
    io::testing::set_stop_after_header([&](const fs::path&) {
      return !only_last_rank || world.rank() == world.size() - 1;
    });
    CHECK_THROWS_AS(io::save_model(file, engine), std::runtime_error);
    io::testing::set_stop_after_header({});

    fsdp_engine<float> restarted(table, world, {});
    (void)io::load_model(file, restarted);
    CHECK(to_host(restarted.shards().flat()) == old_shard);

    // The partial temporary file is left behind, as a kill would leave it, and does not load.
    std::string leftover;
    if (world.rank() == 0)
      for (const auto& entry : fs::directory_iterator(scratch.path))
        if (entry.path().filename().string().starts_with("model.safetensors.tmp.")) leftover = entry.path().string();
    leftover = test::broadcast_from_rank0(world, leftover);
    CHECK(!leftover.empty());
    if (leftover.empty()) continue;
    const std::string error = load_error(leftover, restarted);
    CHECK(error.starts_with("format_error"));
    CHECK(to_host(restarted.shards().flat()) == old_shard);
    // The next save finds it and removes it (a killed job's full-size file does not pile up).
    world.barrier();
    io::save_model(scratch.path / "model.safetensors", restarted);
    world.barrier();
    CHECK(!fs::exists(leftover));
  }

  // The sequential writer too.
  const fs::path gathered = scratch.path / "gathered.safetensors";
  const state_dict old_full = engine.original_state_dict(true);
  engine.initialize(3, all_normal);
  const state_dict new_full = engine.original_state_dict(true);
  if (world.rank() == 0) {
    io::save_state_dict_file(gathered, old_full);
    io::testing::set_stop_after_header([](const fs::path&) { return true; });
    CHECK_THROWS_AS(io::save_state_dict_file(gathered, new_full), std::runtime_error);
    io::testing::set_stop_after_header({});
    CHECK(same_tensors(io::load_state_dict_file(gathered), old_full));
  }

  // The next save goes through and replaces the old file.
  io::save_model(file, engine);
  fsdp_engine<float> restarted(table, world, {});
  (void)io::load_model(file, restarted);
  CHECK(to_host(restarted.shards().flat()) == to_host(engine.shards().flat()));
}

namespace {

// The 8-byte length, the JSON header and the data section of a file.
struct file_parts {
  std::string json;
  std::vector<char> data;
};

file_parts split_file(const std::vector<char>& bytes) {
  std::uint64_t length = 0;
  for (int byte = 7; byte >= 0; --byte) length = (length << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(byte)]);
  return {std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(length)),
          std::vector<char>(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(length), bytes.end())};
}

std::vector<char> join_file(const file_parts& parts) {
  std::vector<char> bytes;
  bytes.reserve(8 + parts.json.size() + parts.data.size());  // one allocation (and GCC 12 sees no overflow in the inserts)
  for (int byte = 0; byte < 8; ++byte) bytes.push_back(static_cast<char>((parts.json.size() >> (8 * byte)) & 0xff));
  bytes.insert(bytes.end(), parts.json.begin(), parts.json.end());
  bytes.insert(bytes.end(), parts.data.begin(), parts.data.end());
  return bytes;
}

// Shifts the data_offsets of `tensor` in the JSON by `shift` bytes (both ends).
std::string shift_offsets(std::string json, const std::string& tensor, std::int64_t shift) {
  const std::size_t at = json.find("\"" + tensor + "\"");
  const std::size_t open = json.find('[', json.find("data_offsets", at));
  const std::size_t close = json.find(']', open);
  const std::string inside = json.substr(open + 1, close - open - 1);
  const std::size_t comma = inside.find(',');
  const std::int64_t begin = std::stoll(inside.substr(0, comma)) + shift;
  const std::int64_t end = std::stoll(inside.substr(comma + 1)) + shift;
  return json.replace(open, close - open + 1, fmt::format("[{},{}]", begin, end));
}

// Replaces the first `from` after `tensor`'s name by `to`.
std::string replace_after(std::string json, const std::string& tensor, const std::string& from, const std::string& to) {
  const std::size_t at = json.find(from, json.find("\"" + tensor + "\""));
  return json.replace(at, from.size(), to);
}

// Deletes `tensor`'s entry ("name": {...} and one comma) from the header JSON; its bytes stay.
std::string remove_entry(std::string json, const std::string& tensor) {
  const std::size_t begin = json.find("\"" + tensor + "\"");
  const std::size_t end = json.find('}', begin) + 1;
  const std::size_t after = json.find_first_not_of(' ', end);
  if (json[after] == ',') return json.erase(begin, after + 1 - begin);
  const std::size_t comma = json.rfind(',', begin);  // the last entry: the comma before it goes
  return json.erase(comma, end - comma);
}

struct malformed_case {
  std::string name;    // the file, under the scratch directory
  std::string tensor;  // the tensor the message must name ("" when none is involved)
};

template <class Model, class Scalar>
void save_other_model(comm::mpi& world, const fs::path& path) {
  fsdp_engine<Scalar> engine(make_param_table(Model{}), world, {});
  engine.initialize(4, gpt_like_init);
  io::save_model(path, engine);
}

}  // namespace

TEST_CASE("every malformed file raises format_error naming the file and the tensor on every rank, shards untouched") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const auto table = make_param_table(tiny_gpt{});
  const fs::path good = scratch.path / "good.safetensors";
  {
    fsdp_engine<float> writer(table, world, {});
    writer.initialize(3, gpt_like_init);
    io::save_model(good, writer, {{"step", "42"}});
  }
  const std::string corrupted_tensor = "transformer.h.1.mlp.c_fc.weight";
  const std::string last_tensor = "lm_head.weight";
  const std::string middle_tensor = "transformer.h.0.attn.c_proj.weight";
  if (world.rank() == 0) {
    const std::vector<char> bytes = file_bytes(good);
    const file_parts parts = split_file(bytes);
    const auto write_json = [&](const std::string& name, const std::string& json) {
      write_file(scratch.path / name, join_file({json, parts.data}));
    };
    write_file(scratch.path / "truncated.safetensors", std::vector<char>(bytes.begin(), bytes.end() - 52));
    write_file(scratch.path / "truncated_header.safetensors", std::vector<char>(bytes.begin(), bytes.begin() + 20));
    write_file(scratch.path / "shorter_than_length.safetensors", std::vector<char>(bytes.begin(), bytes.begin() + 6));
    // One byte flipped inside the data of `corrupted_tensor`.
    const auto table_of_good = io::parse_header(std::as_bytes(std::span(bytes.data(), bytes.size())), bytes.size(), "good");
    std::vector<char> corrupted = bytes;
    const io::tensor_info& hit = table_of_good.at(corrupted_tensor);
    corrupted[(hit.begin + hit.end) / 2] ^= 0x10;
    write_file(scratch.path / "corrupted.safetensors", corrupted);
    write_json("past_end.safetensors", shift_offsets(parts.json, last_tensor, 8));
    write_json("overlap.safetensors", shift_offsets(parts.json, middle_tensor, -4));
    write_json("wrong_dtype_text.safetensors", replace_after(parts.json, middle_tensor, "F32", "F64"));
    write_json("wrong_shape_text.safetensors", replace_after(parts.json, middle_tensor, "[8, 8]", "[4, 16]"));
    write_json("bad_json.safetensors", replace_after(parts.json, middle_tensor, ":", ";"));
    write_json("not_json.safetensors", std::string(parts.json.size(), 'x'));
    write_json("metadata_lies.safetensors", replace_after(parts.json, "step", "42", "43"));
    write_json("renamed.safetensors", replace_after(parts.json, middle_tensor, "c_proj", "c_prox"));
    write_json("removed.safetensors", remove_entry(parts.json, middle_tensor));
  }
  save_other_model<tiny_gpt, double>(world, scratch.path / "double.safetensors");
  save_other_model<gpt<2, 16, 5>, float>(world, scratch.path / "wider.safetensors");
  save_other_model<gpt<1, 8, 5>, float>(world, scratch.path / "shallower.safetensors");
  save_other_model<gpt<3, 8, 5>, float>(world, scratch.path / "deeper.safetensors");
  world.barrier();

  const malformed_case cases[] = {
      {"truncated.safetensors", last_tensor},
      {"truncated_header.safetensors", ""},
      {"shorter_than_length.safetensors", ""},
      {"corrupted.safetensors", corrupted_tensor},
      {"past_end.safetensors", last_tensor},
      {"overlap.safetensors", middle_tensor},
      {"wrong_dtype_text.safetensors", middle_tensor},
      {"wrong_shape_text.safetensors", middle_tensor},
      {"bad_json.safetensors", ""},
      {"not_json.safetensors", ""},
      {"metadata_lies.safetensors", ""},
      {"renamed.safetensors", middle_tensor},
      {"removed.safetensors", middle_tensor},  // its bytes left as a hole: named as missing, not as the hole's neighbour
      {"double.safetensors", "transformer.wte.weight"},
      {"wider.safetensors", "transformer.wte.weight"},
      {"shallower.safetensors", "transformer.h.1.ln_1.weight"},
      {"deeper.safetensors", ""},
  };
  fsdp_engine<float> engine(table, world, {.bucketing_strategy = bucketing::layer});
  engine.initialize(99, all_normal);
  const std::vector<float> before = to_host(engine.shards().flat());
  for (const malformed_case& bad : cases) {
    CAPTURE(bad.name);
    const std::string error = load_error(scratch.path / bad.name, engine);
    CAPTURE(error);
    CHECK(error.starts_with("format_error: "));
    CHECK(error.find(bad.name) != std::string::npos);
    if (!bad.tensor.empty()) CHECK(error.find("'" + bad.tensor + "'") != std::string::npos);
    CHECK(same_on_every_rank(world, error));
    CHECK(to_host(engine.shards().flat()) == before);
    if (bad.name == "removed.safetensors") CHECK(error.find("'" + middle_tensor + "': missing from the file") != std::string::npos);
  }
  // A file that is not there: an I/O error, on every rank, shards untouched.
  const std::string missing = load_error(scratch.path / "absent.safetensors", engine);
  CHECK(missing.starts_with("other: "));
  CHECK(missing.find("absent.safetensors") != std::string::npos);
  CHECK(same_on_every_rank(world, missing));
  CHECK(to_host(engine.shards().flat()) == before);
  // The good file still loads into the same engine.
  CHECK(load_error(good, engine) == "no error");
}

TEST_CASE("saving writes regular files only: a device or a directory is refused, a symlink's target is replaced") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  fsdp_engine<float> engine(make_param_table(tiny_gpt{}), world, {});
  engine.initialize(4, all_normal);
  CHECK_THROWS_WITH_AS(io::save_model("/dev/null", engine),
                       "kfsdp::io::save_model: '/dev/null' is a character device, expected a regular file (nothing was written)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(io::save_model(scratch.path, engine), doctest::Contains("is a directory"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(io::save_model("", engine), "kfsdp::io::save_model: the path is empty, expected a file name",
                       std::invalid_argument);
  const fs::path target = scratch.path / "target.safetensors", link = scratch.path / "latest.safetensors";
  if (world.rank() == 0) fs::create_symlink("target.safetensors", link);
  world.barrier();
  io::save_model(link, engine);
  world.barrier();
  CHECK(fs::is_symlink(link));  // the link stays; its target holds the model
  fsdp_engine<float> loaded(make_param_table(tiny_gpt{}), world, {});
  (void)io::load_model(target, loaded);
  CHECK(to_host(loaded.shards().flat()) == to_host(engine.shards().flat()));
  if (world.rank() == 0) {
    CHECK_THROWS_AS(io::save_state_dict_file("/dev/null", engine.original_state_dict()), std::invalid_argument);
  } else {
    (void)engine.original_state_dict();
  }
}

TEST_CASE("a write that the file system refuses names the cause and the path; the previous file stays") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const fs::path file = scratch.path / "model.safetensors";
  fsdp_engine<double> engine(make_param_table(tiny_gpt{}), world, {});
  engine.initialize(3, all_normal);
  io::save_model(file, engine);
  const std::vector<char> good = world.rank() == 0 ? file_bytes(file) : std::vector<char>{};
  // A file size limit below the file's size stands in for a full disk: the system refuses the
  // bytes past it (EFBIG) as it would refuse them with ENOSPC.
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  rlimit limited = saved;
  limited.rlim_cur = 4096;
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // an error return, not a signal
  ::setrlimit(RLIMIT_FSIZE, &limited);
  std::string message;
  try {
    io::save_model(file, engine);
  } catch (const std::runtime_error& error) {
    message = error.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  CAPTURE(message);
  CHECK(message.find(std::strerror(EFBIG)) != std::string::npos);
  CHECK(message.find((scratch.path / "model.safetensors.tmp.").string()) != std::string::npos);
  CHECK(same_on_every_rank(world, message));
  if (world.rank() == 0) {
    CHECK(file_bytes(file) == good);
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(scratch.path)) ++files;
    CHECK(files == 1);  // no temporary file left
  }
}

TEST_CASE("bad arguments to the writer raise std::invalid_argument on every rank and leave no file") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  fsdp_engine<float> engine(make_param_table(tiny_gpt{}), world, {});
  engine.initialize(1, gpt_like_init);
  const fs::path file = scratch.path / "never.safetensors";
  CHECK_THROWS_AS(io::save_model(file, engine, {{"checksum.lm_head.weight", "0"}}), std::invalid_argument);
  CHECK_THROWS_AS(io::save_model(file, engine, {{"kfsdp.dtype", "F16"}}), std::invalid_argument);
  if (world.size() > 1)
    CHECK_THROWS_AS(io::save_model(file, engine, {{"rank", std::to_string(world.rank())}}),
                    std::invalid_argument);
  Kokkos::View<float*> too_short("too_short", engine.plan().shard_numel + 1);
  CHECK_THROWS_AS(io::save_checkpoint(file, engine, {.metadata = {}, .shards = {{"optimizer.exp_avg", too_short}}}),
                  std::invalid_argument);
  world.barrier();
  CHECK(!fs::exists(file));
  if (world.rank() == 0)
    for (const auto& entry : fs::directory_iterator(scratch.path)) CHECK(entry.path().string() == "");
}

TEST_CASE("a model holding NaN or an infinity is not saved: the writer names the tensor, the previous file stays") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  fsdp_engine<float> engine(make_param_table(tiny_gpt{}), world, {});
  engine.initialize(1, gpt_like_init);
  const fs::path file = scratch.path / "model.safetensors";
  io::save_model(file, engine);
  const std::vector<char> good = world.rank() == 0 ? file_bytes(file) : std::vector<char>();
  // A NaN in the last rank's first row of lm_head.weight (every rank holds rows of it).
  const std::size_t head = engine.params().size() - 1;
  REQUIRE(engine.params()[head].name.view() == "lm_head.weight");
  if (world.rank() == world.size() - 1)
    Kokkos::deep_copy(Kokkos::subview(engine.shards().flat(), engine.mapping().chunk(head).first),
                      std::numeric_limits<float>::quiet_NaN());
  const std::string expected = fmt::format(
      "tensor 'lm_head.weight' holds nan, expected finite values (a diverged model); '{}' is left as it was", file.string());
  CHECK_THROWS_WITH_AS(io::save_model(file, engine), doctest::Contains(expected.c_str()), std::invalid_argument);
  CHECK_THROWS_WITH_AS(io::save_checkpoint(file, engine, {}), doctest::Contains(expected.c_str()),
                       std::invalid_argument);
  const state_dict full = engine.original_state_dict(/*rank0_only=*/true);
  if (world.rank() == 0)
    CHECK_THROWS_WITH_AS(io::save_state_dict_file(file, full), doctest::Contains(expected.c_str()), std::invalid_argument);
  world.barrier();
  if (world.rank() == 0) CHECK(file_bytes(file) == good);
}

TEST_CASE("the checkpoint functions use the engine's own communicator: through threaded, refused for self") {
  comm::mpi world;
  test::scratch_directory scratch(world, "checkpoint");
  const auto table = make_param_table(tiny_gpt{});
  comm::threaded<comm::mpi> overlapped(world);  // the MPI communicator is found under the worker
  fsdp_engine<float> engine(table, overlapped, {});
  engine.initialize(21, all_normal);
  const fs::path file = scratch.path / "through-threaded.safetensors";
  io::save_model(file, engine, {{"step", "3"}});
  fsdp_engine<float> loaded(table, world, {});
  CHECK(io::load_model(file, loaded).at("step") == "3");
  CHECK(io::read_metadata(file, loaded).at("step") == "3");
  CHECK(same_tensors(loaded.original_state_dict(), engine.original_state_dict()));

  comm::self alone;  // one process without MPI: no MPI-IO, a clear error instead
  fsdp_engine<float> single(table, alone, {});
  CHECK_THROWS_WITH_AS(io::save_model(scratch.path / "self.safetensors", single),
                       doctest::Contains("kfsdp::io::save_model: the engine's communicator is not over MPI"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)io::load_model(file, single), doctest::Contains("expected one over kfsdp::comm::mpi"),
                       std::invalid_argument);
}
