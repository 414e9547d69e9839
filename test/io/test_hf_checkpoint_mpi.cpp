// Tests for include/kfsdp/io/checkpoint/hf_checkpoint.hpp under mpirun with 1, 2 and 3 ranks: the tiny Llama
// directories that transformers wrote (test/model/llama: one f32 file; f64 in three shards with
// their index) load by name into an engine with the fixture's parameters, equal to every value;
// save_pretrained's directories load back (F64, and F32 from a double engine); a save changes only
// its own files, loads as the old model or the new one wherever it is killed, and a failed write
// leaves the old files; and bad directories are refused naming the file and the tensor.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/fsdp/engine.hpp>
#include <kfsdp/io/checkpoint/checkpoint.hpp>
#include <kfsdp/io/checkpoint/hf_checkpoint.hpp>

#include "../support/scratch_directory.hpp"

using namespace kfsdp;
using kfsdp::io::format_error;

namespace {

namespace fs = std::filesystem;

const fs::path fixture = KFSDP_LLAMA_FIXTURE;

// The parameters of the fixture (transformers' LlamaForCausalLM names and shapes), each its own
// layer, each decoder layer a block: a model descriptor's table without the model.
std::vector<param_info> llama_table(std::size_t layers = 2) {
  std::vector<param_info> table;
  const auto add = [&](const std::string& name, std::vector<std::size_t> shape, std::size_t block) {
    param_info p;
    p.name = inline_string<max_param_name>(name);
    p.rank = shape.size();
    p.numel = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      p.shape[i] = shape[i];
      p.numel *= shape[i];
    }
    p.layer = table.size();
    p.block = block;
    table.push_back(p);
  };
  add("model.embed_tokens.weight", {256, 64}, no_block);
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    add(prefix + "self_attn.q_proj.weight", {64, 64}, l);
    add(prefix + "self_attn.k_proj.weight", {32, 64}, l);
    add(prefix + "self_attn.v_proj.weight", {32, 64}, l);
    add(prefix + "self_attn.o_proj.weight", {64, 64}, l);
    add(prefix + "mlp.gate_proj.weight", {176, 64}, l);
    add(prefix + "mlp.up_proj.weight", {176, 64}, l);
    add(prefix + "mlp.down_proj.weight", {64, 176}, l);
    add(prefix + "input_layernorm.weight", {64}, l);
    add(prefix + "post_attention_layernorm.weight", {64}, l);
  }
  add("model.norm.weight", {64}, no_block);
  add("lm_head.weight", {256, 64}, no_block);
  return table;
}

// Every value of the one file or the shards of a directory, read by the one-process reader.
state_dict directory_tensors(const fs::path& directory) {
  state_dict all;
  for (const auto& entry : fs::directory_iterator(directory))
    if (entry.path().extension() == ".safetensors")
      for (tensor t : io::load_state_dict_file(entry.path())) all.add(std::move(t));
  return all;
}

// The loaded engine's values equal the directory's (converted to Scalar), tensor by tensor.
template <class Scalar>
void check_equal(fsdp_engine<Scalar>& engine, const state_dict& expected) {
  const state_dict loaded = engine.original_state_dict();
  REQUIRE(loaded.size() == expected.size());
  for (const tensor& t : loaded) {
    CAPTURE(t.name);
    const tensor& want = expected.at(t.name);
    REQUIRE(want.shape == t.shape);
    const auto got = t.values<Scalar>();
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const Scalar value = want.type == dtype::F64 ? Scalar(want.values<double>()[i]) : Scalar(want.values<float>()[i]);
      mismatches += got[i] != value;
    }
    CHECK(mismatches == 0);
  }
}

// Copies the fixture directory `name` into `to` (rank 0), for tests that alter it.
void copy_fixture(comm::mpi& world, const std::string& name, const fs::path& to) {
  if (world.rank() == 0) fs::copy(fixture / name, to, fs::copy_options::recursive);
  world.barrier();
}

template <class Scalar>
std::string load_error(const fs::path& directory, fsdp_engine<Scalar>& engine,
                       const std::vector<std::string>& ignore = {}) {
  try {
    io::load_pretrained(directory, engine, ignore);
  } catch (const format_error& error) {
    return error.what();
  }
  return "(loaded)";
}

void write_text(comm::mpi& world, const fs::path& path, const std::string& text) {
  if (world.rank() == 0) std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  world.barrier();
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every file and folder under `directory`: its path there and its bytes ("(folder)" for a folder).
std::map<std::string, std::string> tree(const fs::path& directory) {
  std::map<std::string, std::string> entries;
  for (const auto& entry : fs::recursive_directory_iterator(directory))
    entries[fs::relative(entry.path(), directory).string()] =
        entry.is_directory() ? "(folder)" : read_text(entry.path());
  return entries;
}

// Whether every tensor of `a` has `b`'s values (converted to double).
bool same_values(const state_dict& a, const state_dict& b) {
  if (a.size() != b.size()) return false;
  for (const tensor& t : a) {
    const tensor& u = b.at(t.name);
    const auto value = [](const tensor& x, std::size_t i) {
      return x.type == dtype::F64 ? x.values<double>()[i] : double(x.values<float>()[i]);
    };
    if (t.shape != u.shape) return false;
    for (std::size_t i = 0; i < t.numel(); ++i)
      if (value(t, i) != value(u, i)) return false;
  }
  return true;
}

// Writes `value` over element `element` of tensor `name` in the safetensors file `path` (rank 0),
// as the file's dtype (F32 or F64).
void poke(comm::mpi& world, const fs::path& path, const std::string& name, std::size_t element,
          double value) {
  if (world.rank() == 0) {
    const std::string bytes = read_text(path);
    const io::header_table table =
        io::parse_header(std::as_bytes(std::span(bytes.data(), bytes.size())), bytes.size(), path.string());
    const io::tensor_info& info = table.at(name);
    std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(static_cast<std::streamoff>(info.begin + element * io::dtype_size(info.type)));
    if (info.type == dtype::F64) {
      file.write(reinterpret_cast<const char*>(&value), sizeof value);
    } else {
      const float narrow = static_cast<float>(value);
      file.write(reinterpret_cast<const char*>(&narrow), sizeof narrow);
    }
  }
  world.barrier();
}

}  // namespace

TEST_CASE("transformers' f32 single file and f64 shards load by name at every world size, every value equal") {
  comm::mpi world;
  const state_dict f32 = directory_tensors(fixture / "tiny-f32");
  const state_dict f64 = directory_tensors(fixture / "tiny-f64-sharded");
  for (const bucketing b : {bucketing::none, bucketing::block}) {
    fsdp_engine<float> single(llama_table(), world, {.bucketing_strategy = b});
    io::load_pretrained(fixture / "tiny-f32", single);
    check_equal(single, f32);

    fsdp_engine<double> sharded(llama_table(), world, {.bucketing_strategy = b});
    io::load_pretrained(fixture / "tiny-f64-sharded", sharded);
    check_equal(sharded, f64);

    // Converted: the f32 file into a double engine gives the f64 model (its values are f32's).
    fsdp_engine<double> widened(llama_table(), world, {.bucketing_strategy = b});
    io::load_pretrained(fixture / "tiny-f32", widened);
    check_equal(widened, f64);
  }
}

TEST_CASE("save_pretrained writes config.json and model.safetensors that load back, F64 and F32") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const std::string config = io::llama_config_json({.vocab = 256, .dim = 64, .hidden = 176, .layers = 2, .heads = 4,
                                                    .kv_heads = 2, .seq = 64, .rope_theta = 5000.0});
  fsdp_engine<double> source(llama_table(), world, {.bucketing_strategy = bucketing::block});
  source.initialize(7);
  const state_dict original = source.original_state_dict();

  io::save_pretrained(scratch.path / "f64", source, config);
  CHECK(read_text(scratch.path / "f64" / "config.json") == config);
  io::metadata_map metadata;
  const state_dict written = io::load_state_dict_file(scratch.path / "f64" / "model.safetensors", &metadata);
  CHECK(metadata.at("format") == "pt");  // transformers refuses a file without it
  CHECK(written.at("lm_head.weight").type == dtype::F64);
  fsdp_engine<double> back(llama_table(), world, {.bucketing_strategy = bucketing::none});
  io::load_pretrained(scratch.path / "f64", back);
  check_equal(back, original);

  io::save_pretrained(scratch.path / "f32/", source, io::llama_config_json(io::read_llama_config(scratch.path / "f64")),
                      dtype::F32);
  const state_dict narrowed = io::load_state_dict_file(scratch.path / "f32" / "model.safetensors");
  CHECK(narrowed.at("lm_head.weight").type == dtype::F32);
  fsdp_engine<float> back32(llama_table(), world, {});
  io::load_pretrained(scratch.path / "f32", back32);
  check_equal(back32, original);  // each double rounded to float
  CHECK_THROWS_AS(io::save_pretrained(scratch.path / "bf16", source, config, dtype::BF16), std::invalid_argument);
  CHECK_FALSE(fs::exists(scratch.path / "bf16"));
}

TEST_CASE("a save killed while writing the weights leaves the old model; the next save cleans up after it") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const fs::path target = scratch.path / "model";
  copy_fixture(world, "tiny-f64-sharded", target);
  fsdp_engine<double> engine(llama_table(), world, {});
  engine.initialize(11);

  io::testing::set_stop_after_header([](const fs::path&) { return true; });
  CHECK_THROWS_AS(io::save_pretrained(target, engine, "{}"), std::runtime_error);
  io::testing::set_stop_after_header({});
  fsdp_engine<double> old(llama_table(), world, {});
  io::load_pretrained(target, old);  // still the fixture's shards
  check_equal(old, directory_tensors(fixture / "tiny-f64-sharded"));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(scratch.path)) ++entries;
  CHECK(entries == 1);  // no staging directory left beside it
  world.barrier();      // every rank counted before rank 0 adds one

  // A staging directory that a killed save left is removed by the next save.
  const fs::path leftover = scratch.path / "model.tmp.0123456789abcdef";
  if (world.rank() == 0) fs::create_directory(leftover);
  world.barrier();

  io::save_pretrained(target, engine, "{}");
  CHECK_FALSE(fs::exists(target / "model.safetensors.index.json"));  // the old shards went with it
  CHECK_FALSE(fs::exists(leftover));
  if (world.rank() == 0)
    for (const auto& [name, bytes] : tree(target))
      CHECK_MESSAGE(name.find(".tmp.") == std::string::npos, name);
  fsdp_engine<double> saved(llama_table(), world, {});
  io::load_pretrained(target, saved);
  check_equal(saved, engine.original_state_dict());
}

TEST_CASE("BF16 and F16 files load into float and double engines, converted exactly") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const std::vector<param_info> embedding{llama_table().front()};  // model.embed_tokens.weight [256, 64]
  // 1.5 and -0.25 in each format, alternating: bf16 0x3FC0 0xBE80, f16 0x3E00 0xB400.
  for (const auto& [type, plus, minus] : {std::tuple{dtype::BF16, 0x3FC0, 0xBE80}, std::tuple{dtype::F16, 0x3E00, 0xB400}}) {
    CAPTURE(io::dtype_name(type));
    const fs::path directory = scratch.path / std::string(io::dtype_name(type));
    if (world.rank() == 0) {
      fs::create_directory(directory);
      const io::file_layout layout = io::make_header({{"model.embed_tokens.weight", type, {256, 64}}});
      std::ofstream out(directory / "model.safetensors", std::ios::binary);
      out.write(reinterpret_cast<const char*>(layout.prefix.data()), static_cast<std::streamsize>(layout.prefix.size()));
      for (int i = 0; i < 256 * 64; ++i) {
        const int bits = i % 2 == 0 ? plus : minus;
        out.put(static_cast<char>(bits & 0xff)).put(static_cast<char>(bits >> 8));
      }
    }
    world.barrier();
    fsdp_engine<float> single(embedding, world, {});
    io::load_pretrained(directory, single);
    fsdp_engine<double> wide(embedding, world, {});
    io::load_pretrained(directory, wide);
    const state_dict single_sd = single.original_state_dict(), wide_sd = wide.original_state_dict();
    const auto f = single_sd.at("model.embed_tokens.weight").values<float>();
    const auto d = wide_sd.at("model.embed_tokens.weight").values<double>();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < f.size(); ++i) wrong += f[i] != (i % 2 == 0 ? 1.5f : -0.25f) || d[i] != double(f[i]);
    CHECK(wrong == 0);
  }
}

TEST_CASE("a directory that does not fit the model is refused on every rank, naming the file and the tensor") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const fs::path sharded = fixture / "tiny-f64-sharded";

  // A model with a tensor the directory lacks: the index has no entry for it.
  fsdp_engine<double> deeper(llama_table(3), world, {});
  const std::string missing = load_error(sharded, deeper);
  CHECK(missing.find("model.safetensors.index.json") != std::string::npos);
  CHECK(missing.find("'model.layers.2.self_attn.q_proj.weight'") != std::string::npos);
  fsdp_engine<double> deeper_single(llama_table(3), world, {});
  CHECK(load_error(fixture / "tiny-f32", deeper_single)
            .find("model.safetensors': tensor 'model.layers.2.self_attn.q_proj.weight': missing from the file") != std::string::npos);

  // A model without a tensor the directory has: refused unless ignored (a tied lm_head).
  std::vector<param_info> tied = llama_table();
  tied.pop_back();
  fsdp_engine<double> untied_file(tied, world, {});
  CHECK(load_error(sharded, untied_file).find("names 1 tensor that the model does not have: 'lm_head.weight'") != std::string::npos);
  CHECK(load_error(fixture / "tiny-f32", untied_file).find("model.safetensors': holds 1 tensor that the model does not have: 'lm_head.weight'") != std::string::npos);
  CHECK(load_error(sharded, untied_file, {"lm_head.weight"}) == "(loaded)");

  // Another shape.
  std::vector<param_info> wide = llama_table();
  wide.back().shape[0] = 300;
  wide.back().numel = 300 * 64;
  fsdp_engine<float> wider(wide, world, {});
  CHECK(load_error(sharded, wider).find("tensor 'lm_head.weight': shape [256, 64] in the file, expected [300, 64]") != std::string::npos);

  // The index names a file that lacks the tensor, or a path outside the directory.
  const fs::path moved = scratch.path / "moved";
  copy_fixture(world, "tiny-f64-sharded", moved);
  const std::string index = read_text(sharded / "model.safetensors.index.json");  // not the copy, which rank 0 rewrites
  const std::string entry = "\"lm_head.weight\": \"model-00003-of-00003.safetensors\"";
  REQUIRE(index.find(entry) != std::string::npos);
  write_text(world, moved / "model.safetensors.index.json",
             std::string(index).replace(index.find(entry), entry.size(), "\"lm_head.weight\": \"model-00001-of-00003.safetensors\""));
  fsdp_engine<double> engine(llama_table(), world, {});
  const std::string wrong_file = load_error(moved, engine);
  CHECK(wrong_file.find("model-00001-of-00003.safetensors': tensor 'lm_head.weight': missing from the file") != std::string::npos);
  write_text(world, moved / "model.safetensors.index.json",
             std::string(index).replace(index.find(entry), entry.size(), "\"lm_head.weight\": \"../x.safetensors\""));
  CHECK(load_error(moved, engine).find("file '../x.safetensors', expected the name of a file in the directory") != std::string::npos);
  write_text(world, moved / "model.safetensors.index.json", "{\"metadata\": {}}");
  CHECK(load_error(moved, engine).find("no \"weight_map\" object") != std::string::npos);

  // No weights at all; a dtype that is not a float.
  CHECK(load_error(scratch.path, engine).find("holds neither model.safetensors nor model.safetensors.index.json") != std::string::npos);
  const fs::path ints = scratch.path / "ints";
  if (world.rank() == 0) {
    fs::create_directory(ints);
    const io::file_layout layout = io::make_header({{"model.embed_tokens.weight", dtype::I32, {256, 64}}});
    std::ofstream out(ints / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(layout.prefix.data()), static_cast<std::streamsize>(layout.prefix.size()));
    out << std::string(layout.file_size - layout.data_offset, '\0');
  }
  world.barrier();
  fsdp_engine<double> embedding(std::vector<param_info>{llama_table().front()}, world, {});
  CHECK(load_error(ints, embedding).find("tensor 'model.embed_tokens.weight': dtype I32 in the file, expected F64, F32, BF16 or F16") != std::string::npos);

  // Nothing was changed by a refused load.
  engine.initialize(5);
  const state_dict before = engine.original_state_dict();
  (void)load_error(moved, engine);
  check_equal(engine, before);
}

TEST_CASE(
    "save_pretrained into a directory holding tokenizer.json, generation_config.json and a subfolder leaves "
    "all three as they were") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const fs::path target = scratch.path / "model";
  copy_fixture(world, "tiny-f32", target);  // config.json, generation_config.json, model.safetensors
  if (world.rank() == 0) {
    std::ofstream(target / "tokenizer.json") << R"({"version": "1.0", "model": {"type": "BPE"}})";
    fs::create_directories(target / "runs" / "1");
    std::ofstream(target / "runs" / "1" / "notes.txt") << "lr 3e-4\n";
  }
  world.barrier();
  const std::map<std::string, std::string> before =
      world.rank() == 0 ? tree(target) : std::map<std::string, std::string>{};
  const std::string config = io::llama_config_json(io::read_llama_config(target), dtype::F64);
  fsdp_engine<double> engine(llama_table(), world, {});
  engine.initialize(5);

  io::save_pretrained(target, engine, config);
  if (world.rank() == 0) {
    const std::map<std::string, std::string> after = tree(target);
    for (const std::string name :
         {"tokenizer.json", "generation_config.json", "runs", "runs/1", "runs/1/notes.txt"}) {
      CAPTURE(name);
      CHECK(after.contains(name));  // not REQUIRE: the other ranks wait in the load below
      if (after.contains(name)) CHECK(after.at(name) == before.at(name));
    }
    CHECK(after.at("config.json") == config);
    CHECK(after.size() == before.size());  // nothing else, no temporary file
  }
  fsdp_engine<double> back(llama_table(), world, {});
  io::load_pretrained(target, back);
  check_equal(back, engine.original_state_dict());
}

TEST_CASE("a single-file save over a sharded model leaves no index behind and loads as the new weights") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const fs::path target = scratch.path / "model";
  copy_fixture(world, "tiny-f64-sharded", target);
  // Not save_pretrained's: a folder named like a shard and a file named like a model.
  if (world.rank() == 0) {
    fs::create_directory(target / "model-00009-of-00009.safetensors");
    std::ofstream(target / "model-card.md") << "# tiny\n";
  }
  world.barrier();
  fsdp_engine<double> engine(llama_table(), world, {});
  engine.initialize(9);

  io::save_pretrained(target, engine, read_text(fixture / "tiny-f64-sharded" / "config.json"));
  CHECK_FALSE(fs::exists(target / "model.safetensors.index.json"));
  for (const char* shard : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors"})
    CHECK_FALSE(fs::exists(target / shard));
  CHECK(fs::is_directory(target / "model-00009-of-00009.safetensors"));
  CHECK(read_text(target / "model-card.md") == "# tiny\n");
  CHECK(read_text(target / "generation_config.json") ==
        read_text(fixture / "tiny-f64-sharded" / "generation_config.json"));
  fsdp_engine<double> back(llama_table(), world, {});
  io::load_pretrained(target, back);
  check_equal(back, engine.original_state_dict());
}

TEST_CASE(
    "a save killed before any change to the directory leaves one that loads as the old model or the new "
    "one") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const state_dict old_model = directory_tensors(fixture / "tiny-f64-sharded");
  fsdp_engine<double> engine(llama_table(), world, {});
  engine.initialize(13);
  const state_dict new_model = engine.original_state_dict();
  // The same model's config in kfsdp's words: either text reads as it.
  const std::string config =
      io::llama_config_json(io::read_llama_config(fixture / "tiny-f64-sharded"), dtype::F64);
  std::size_t stop = 0;
  for (;; ++stop) {  // kill before the stop-th change: the index, each of the three shards, config.json; then
                     // none
    CAPTURE(stop);
    const fs::path target = scratch.path / ("model-" + std::to_string(stop));
    copy_fixture(world, "tiny-f64-sharded", target);
    std::size_t changes = 0;
    io::testing::set_stop_before_change([&](const fs::path&) { return changes++ == stop; });
    bool killed = false;
    try {
      io::save_pretrained(target, engine, config);
    } catch (const std::runtime_error& error) {
      killed = std::string(error.what()).find("a simulated kill") != std::string::npos;
      CHECK(killed);
    }
    io::testing::set_stop_before_change({});
    fsdp_engine<double> loaded(llama_table(), world, {});
    io::load_pretrained(target, loaded);
    const state_dict got = loaded.original_state_dict();
    const bool as_old = same_values(got, old_model), as_new = same_values(got, new_model);
    CHECK(as_old != as_new);
    CHECK(as_new == (stop > 0));  // the index goes first: until then, it is the old model
    CHECK(io::read_llama_config(target).layers == 2);
    if (!killed) break;
    // The next save finishes the job and removes the temporary file the killed one left.
    io::save_pretrained(target, engine, config);
    if (world.rank() == 0) {
      const std::map<std::string, std::string> entries = tree(target);
      CHECK(entries.size() == 3);  // config.json, generation_config.json, model.safetensors
      CHECK(entries.at("config.json") == config);
    }
    fsdp_engine<double> again(llama_table(), world, {});
    io::load_pretrained(target, again);
    check_equal(again, new_model);
  }
  CHECK(stop == 5);
}

TEST_CASE("a save whose write fails leaves the old files and throws naming the file") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const fs::path target = scratch.path / "model";
  copy_fixture(world, "tiny-f32", target);
  const std::map<std::string, std::string> before =
      world.rank() == 0 ? tree(target) : std::map<std::string, std::string>{};
  fsdp_engine<double> engine(llama_table(), world, {});
  engine.initialize(17);
  const std::string config = io::llama_config_json(io::read_llama_config(target), dtype::F64);
  // A file size limit stands in for a full disk (EFBIG as ENOSPC; root ignores permissions, not
  // this): below config.json's size its write fails, above it the weights' does.
  for (const auto& [limit, file] :
       {std::pair<rlim_t, std::string>{64, "config.json"}, {4096, "model.safetensors"}}) {
    CAPTURE(file);
    rlimit saved{};
    ::getrlimit(RLIMIT_FSIZE, &saved);
    rlimit limited = saved;
    limited.rlim_cur = limit;
    const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // an error return, not a signal
    ::setrlimit(RLIMIT_FSIZE, &limited);
    std::string message;
    try {
      io::save_pretrained(target, engine, config);
    } catch (const std::runtime_error& error) {
      message = error.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, previous_handler);
    CAPTURE(message);
    CHECK(message.starts_with("kfsdp::io::"));
    CHECK(message.find(std::strerror(EFBIG)) != std::string::npos);
    CHECK(message.find("'" + (target / file).string() + ".tmp.") != std::string::npos);
    if (world.rank() == 0) CHECK(tree(target) == before);  // the old files, and no temporary one
    world.barrier();
  }
}

TEST_CASE(
    "a NaN or an infinity in a file without checksums is refused by load_pretrained, naming the tensor") {
  comm::mpi world;
  test::scratch_directory scratch(world, "hf");
  const fs::path single = scratch.path / "single", sharded = scratch.path / "sharded";
  copy_fixture(world, "tiny-f32", single);
  copy_fixture(world, "tiny-f64-sharded", sharded);
  poke(world, single / "model.safetensors", "model.norm.weight", 3, std::numeric_limits<double>::quiet_NaN());
  // Finite in the F64 file, beyond float's range once converted.
  const std::string shard = "model-00003-of-00003.safetensors";
  REQUIRE(read_text(sharded / "model.safetensors.index.json").find("\"lm_head.weight\": \"" + shard) !=
          std::string::npos);
  poke(world, sharded / shard, "lm_head.weight", 256 * 64 - 1, 1e300);

  fsdp_engine<float> engine(llama_table(), world, {});
  engine.initialize(3);
  const state_dict before = engine.original_state_dict();
  CHECK(load_error(single, engine)
            .find("file '" + (single / "model.safetensors").string() +
                  "': tensor 'model.norm.weight': holds nan, expected finite values") != std::string::npos);
  CHECK(load_error(sharded, engine)
            .find("file '" + (sharded / shard).string() +
                  "': tensor 'lm_head.weight': holds inf, expected finite values") != std::string::npos);
  fsdp_engine<double> wide(llama_table(), world, {});
  CHECK(load_error(sharded, wide) == "(loaded)");  // 1e300 is a double
  check_equal(engine, before);                            // nothing was loaded
}
