// Hugging Face model directories over MPI-IO (include/kfsdp/io/checkpoint/hf_checkpoint.hpp): load_pretrained
// reads config-less weights by name from model.safetensors or the shards of its index;
// save_pretrained writes config.json and model.safetensors (through save_model) into the directory,
// each file renamed into place on its own, removes its own stale files and nothing else.
#include <kfsdp/io/checkpoint/hf_checkpoint.hpp>

#include <fstream>
#include <iterator>
#include <map>

#include <kfsdp/meta/half.hpp>

#include "checkpoint_transfer.hpp"
#include "hf_directory.hpp"
#include "json_reader.hpp"

namespace kfsdp::io {

using namespace checkpoint_detail;

namespace {


// Every tensor's file, from the index's "weight_map" (tensor name -> file name in the directory).
std::map<std::string, std::string, std::less<>> read_weight_map(std::string_view text, const std::filesystem::path& index,
                                                                std::string_view function) {
  const auto fail = [&](const std::string& what) -> void {
    throw format_error(fmt::format("{}: index '{}': {}", function, index.string(), what));
  };
  json_detail::json_value root;
  try {
    root = json_detail::parse_json(text, index.string());
  } catch (const format_error& error) {
    fail(fmt::format("not valid JSON: {}", error.what()));
  }
  const json_detail::json_value* map = root.kind == json_detail::json_kind::object ? root.find("weight_map") : nullptr;
  if (map == nullptr || map->kind != json_detail::json_kind::object)
    fail("no \"weight_map\" object, expected {\"weight_map\": {\"<tensor>\": \"<file>\", ...}}");
  std::map<std::string, std::string, std::less<>> file_of;
  for (std::size_t i = 0; i < map->keys.size(); ++i) {
    const json_detail::json_value& file = map->values[i];
    if (file.kind != json_detail::json_kind::string)
      fail(fmt::format("tensor '{}': {}, expected a file name", map->keys[i], json_detail::kind_name(file.kind)));
    // Files of the directory only: a name with a separator or ".." could reach anywhere.
    if (file.text.empty() || file.text.find('/') != std::string::npos || file.text == "." || file.text == "..")
      fail(fmt::format("tensor '{}': file '{}', expected the name of a file in the directory", map->keys[i], file.text));
    file_of.emplace(map->keys[i], file.text);
  }
  return file_of;
}

// `count` values stored as `Stored` (little-endian, as safetensors keeps them) into the engine's
// scalar, each through `value` (the identity, or a half format's bits to float).
template <class Stored, class Scalar, class Value>
void widen(const std::byte* raw, std::size_t count, Scalar* out, Value value) {
  for (std::size_t i = 0; i < count; ++i) {
    Stored stored;
    std::memcpy(&stored, raw + i * sizeof(Stored), sizeof(Stored));
    out[i] = static_cast<Scalar>(value(stored));
  }
}

template <class Scalar>
void convert(const std::byte* raw, dtype type, std::size_t count, Scalar* out) {
  const auto same = [](auto stored) { return stored; };
  switch (type) {
    case dtype::F64: return widen<double>(raw, count, out, same);
    case dtype::F32: return widen<float>(raw, count, out, same);
    case dtype::BF16: return widen<std::uint16_t>(raw, count, out, half_detail::bf16_to_float);
    case dtype::F16: return widen<std::uint16_t>(raw, count, out, half_detail::f16_to_float);
    default: break;
  }
  throw std::logic_error("kfsdp::io::load_pretrained: convert called for a dtype it does not read");
}

bool convertible(dtype type) {
  return type == dtype::F64 || type == dtype::F32 || type == dtype::BF16 || type == dtype::F16;
}

std::string names_list(const std::vector<std::string>& names) {
  constexpr std::size_t shown = 8;  // enough to see which layers; the count says the rest
  std::string text;
  for (std::size_t i = 0; i < std::min(names.size(), shown); ++i) text += fmt::format("{}'{}'", i ? ", " : "", names[i]);
  if (names.size() > shown) text += fmt::format(" and {} more", names.size() - shown);
  return text;
}

// One file's share of the load: which tensors it holds for this rank and where their rows are.
template <class Scalar>
struct file_share {
  std::vector<std::size_t> tensors;  // indices into the engine's tensors
  std::vector<dtype> types;          // each one's dtype in the file
  std::vector<file_piece> pieces;    // each one's rows on this rank (length 0: none)
};

}  // namespace

template <class Scalar>
void load_hf_weights(const std::filesystem::path& directory, const hf_files& files, const sharded_view<Scalar>& engine,
                     const std::vector<std::string>& ignore, std::string_view function) {
  const std::string_view single_file = files.weights, index_file = files.index;
  comm::mpi& comm = mpi_of(engine, function);
  const int rank = comm.rank();
  std::vector<sharded_tensor<Scalar>> tensors;
  together(comm, [&] {
    tensors = sharded_tensors<Scalar>(engine, {}, function);
  });
  const auto ignored = [&](std::string_view name) { return std::find(ignore.begin(), ignore.end(), name) != ignore.end(); };

  // Rank 0 looks for the index (its text, or "" for the single file); every rank parses it.
  std::string index_text;
  together(comm, [&] {
    if (rank != 0) return;
    const std::filesystem::path index = directory / index_file;
    if (!index_file.empty() && std::filesystem::exists(index)) {
      if (!std::filesystem::is_regular_file(index))
        throw format_error(
            fmt::format("{}: index '{}' is not a regular file, expected the JSON of a sharded save", function,
                        index.string()));
      std::ifstream in(index, std::ios::binary);
      index_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) throw_errno(function, "read of", index);
      if (index_text.empty()) throw format_error(fmt::format("{}: index '{}' is empty", function, index.string()));
    } else if (!std::filesystem::exists(directory / single_file)) {
      if (index_file.empty())
        throw format_error(fmt::format("{}: directory '{}' holds no {}, expected {}", function, directory.string(),
                                       single_file, files.what));
      throw format_error(fmt::format("{}: directory '{}' holds neither {} nor {}, expected {}", function,
                                     directory.string(), single_file, index_file, files.what));
    }
  });
  index_text = broadcast_string(comm.native(), index_text);
  const bool indexed = !index_text.empty();

  // Every parameter's file; the index's tensors that the model lacks are refused up front.
  std::map<std::string, std::vector<std::size_t>, std::less<>> tensors_of_file;
  together(comm, [&] {
    const std::filesystem::path index = directory / index_file;
    if (!indexed) {
      for (std::size_t t = 0; t < tensors.size(); ++t) tensors_of_file[std::string(single_file)].push_back(t);
      return;
    }
    const auto file_of = read_weight_map(index_text, index, function);
    std::vector<std::string> missing, unexpected;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const auto found = file_of.find(tensors[t].name);
      if (found == file_of.end()) missing.push_back(tensors[t].name);
      else tensors_of_file[found->second].push_back(t);
    }
    for (const auto& [name, file] : file_of) {
      const bool known = std::any_of(tensors.begin(), tensors.end(), [&](const auto& tensor) { return tensor.name == name; });
      if (!known && !ignored(name)) unexpected.push_back(name);
    }
    if (!missing.empty())
      throw format_error(fmt::format("{}: index '{}': tensor {}: missing from its weight_map, expected {} (the model has {})",
                                     function, index.string(), names_list(missing), missing.size() == 1 ? "it" : "them",
                                     missing.size() == 1 ? "it" : "them"));
    if (!unexpected.empty())
      throw format_error(fmt::format("{}: index '{}': names {} tensor{} that the model does not have: {}; expected the "
                                     "model's tensors only",
                                     function, index.string(), unexpected.size(), unexpected.size() == 1 ? "" : "s",
                                     names_list(unexpected)));
  });

  // File by file: the header (read by rank 0), the checks, this rank's rows, their checksums.
  std::vector<std::vector<Scalar>> values(tensors.size());  // this rank's rows of each tensor
  for (const auto& [file_name, assigned] : tensors_of_file) {
    const std::filesystem::path path = directory / file_name;
    std::uint64_t file_size = 0;
    const std::vector<std::byte> prefix = header_on_every_rank(function, path, comm, file_size);
    header_table table;
    file_share<Scalar> share;
    together(comm, [&] {
      const auto fail = [&](const std::string& tensor, const std::string& what) {
        throw format_error(fmt::format("{}: file {}: tensor '{}': {}", function, quoted(path), tensor, what));
      };
      table = parse_header(prefix, file_size, path.string());
      verify_header_checksum(table, function);
      for (const std::size_t t : assigned) {
        const sharded_tensor<Scalar>& tensor = tensors[t];
        const param_info& param = engine.params[tensor.param];
        const tensor_info* found = table.find(tensor.name);
        if (found == nullptr)
          fail(tensor.name, indexed ? fmt::format("missing from the file, expected it (the index '{}' names this file)", index_file)
                                    : std::string("missing from the file, expected it (the model has it)"));
        if (!convertible(found->type))
          fail(tensor.name, fmt::format("dtype {} in the file, expected F64, F32, BF16 or F16 (converted to the model's {})",
                                        dtype_name(found->type), dtype_name(dtype_of<Scalar>)));
        if (found->shape != shape_of(param))
          fail(tensor.name, fmt::format("shape {} in the file, expected {} for the model", shape_string(found->shape),
                                        shape_string(shape_of(param))));
        const std::uint64_t count = tensor.local_bytes / sizeof(Scalar);
        share.tensors.push_back(t);
        share.types.push_back(found->type);
        share.pieces.push_back({first_row_offset(*found, engine.mapping, tensor.param, static_cast<std::size_t>(rank)),
                                count * dtype_size(found->type)});
      }
      std::vector<std::string> unexpected;
      for (const tensor_info& in_file : table.tensors) {
        const bool known = std::any_of(tensors.begin(), tensors.end(), [&](const auto& tensor) { return tensor.name == in_file.name; });
        if (!known && !ignored(in_file.name)) unexpected.push_back(in_file.name);
      }
      if (!unexpected.empty())
        throw format_error(fmt::format("{}: file {}: holds {} tensor{} that the model does not have: {}; expected the "
                                       "model's tensors only (or name them in `ignore`)",
                                       function, quoted(path), unexpected.size(), unexpected.size() == 1 ? "" : "s",
                                       names_list(unexpected)));
    });

    // The pieces in file order, back to back in one buffer; MPI-IO reads them collectively.
    std::vector<std::size_t> order(share.pieces.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return share.pieces[a].offset < share.pieces[b].offset; });
    std::vector<file_piece> sorted;
    std::vector<std::uint64_t> staged_at(share.pieces.size());
    std::uint64_t bytes = 0;
    for (const std::size_t i : order) {
      if (share.pieces[i].length > 0) sorted.push_back(share.pieces[i]);
      staged_at[i] = bytes;
      bytes += share.pieces[i].length;
    }
    std::vector<std::byte> staging;
    together(comm, [&] { staging.resize(bytes); });
    MPI_File file = MPI_FILE_NULL;
    together(comm, [&] {
      check_mpi(MPI_File_open(comm.native(), path.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &file), function,
                "MPI_File_open", path);
    });
    std::optional<failure> read_error = transfer_pieces(file, comm.native(), sorted, staging.data(), false, function, path);
    MPI_File_close(&file);
    agree(comm, read_error);

    std::vector<checksum_state> local_checksums;
    for (std::size_t i = 0; i < share.tensors.size(); ++i)
      local_checksums.push_back(checksum_of(std::span(staging).subspan(staged_at[i], share.pieces[i].length)));
    const std::vector<checksum_state> checksums = combine_checksums(comm, local_checksums, function, path);
    together(comm, [&] {
      for (std::size_t i = 0; i < share.tensors.size(); ++i) {
        const std::size_t t = share.tensors[i];
        verify_tensor_checksum(table, tensors[t].name, checksums[i], function);
        values[t].resize(tensors[t].local_bytes / sizeof(Scalar));
        convert(staging.data() + staged_at[i], share.types[i], values[t].size(), values[t].data());
        check_loaded_finite(std::span<const Scalar>(values[t]), tensors[t].name, function,
                            path);  // F64 beyond float: inf
      }
    });
  }

  // Every file verified on every rank: commit, padding rows zero.
  together(comm, [&] {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const index_range chunk{tensors[t].flat_first, engine.mapping.chunk(tensors[t].param).count};
      const std::size_t valid = values[t].size();
      Kokkos::deep_copy(Kokkos::subview(tensors[t].flat, std::make_pair(chunk.first, chunk.first + valid)),
                        Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            values[t].data(), valid));
      Kokkos::deep_copy(Kokkos::subview(tensors[t].flat, std::make_pair(chunk.first + valid, chunk.last())), Scalar{0});
    }
  });
}

namespace {

std::function<bool(const std::filesystem::path&)>& stop_before_change_hook() {
  static std::function<bool(const std::filesystem::path&)> hook;
  return hook;
}

// "model-00001-of-00003.safetensors": a shard of a sharded save (transformers' name), which a
// single-file save makes stale.
bool is_shard_name(std::string_view name) {
  constexpr std::string_view prefix = "model-", suffix = ".safetensors", of = "-of-";
  if (!name.starts_with(prefix) || !name.ends_with(suffix)) return false;
  const std::string_view numbers = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  const std::size_t middle = numbers.find(of);
  const auto digits = [](std::string_view text) {
    return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
  };
  return middle != std::string_view::npos && digits(numbers.substr(0, middle)) &&
         digits(numbers.substr(middle + of.size()));
}

// A file (or a link) of save_pretrained's that stands in the way: never a folder.
bool is_file_entry(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, error);
  return !error && (std::filesystem::is_regular_file(status) || std::filesystem::is_symlink(status));
}

// Removes "<name>.tmp.<16 hex digits>" directories beside `target`: the staging directories that
// a killed save of an earlier kfsdp (which assembled the directory whole beside it) left behind.
void remove_leftover_staging(const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code error;
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  for (fs::directory_iterator it(parent, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() == prefix.size() + 16 && name.starts_with(prefix) &&
        name.find_first_not_of("0123456789abcdef", prefix.size()) == std::string::npos && it->is_directory(error)) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
}

}  // namespace

namespace testing {
void set_stop_before_change(std::function<bool(const std::filesystem::path&)> hook) {
  stop_before_change_hook() = std::move(hook);
}
}  // namespace testing

template <class Scalar>
void save_hf_weights(const std::filesystem::path& directory, const hf_files& files, const sharded_view<Scalar>& engine,
                     std::string_view config_json, dtype stored, std::string_view function) {
  const std::string_view single_file = files.weights, index_file = files.index;
  comm::mpi& comm = mpi_of(engine, function);
  namespace fs = std::filesystem;
  const int rank = comm.rank();
  // Under HSDP the first shard group writes (as save_model); the others take part in its collectives.
  const bool writer = !engine.replica_group || engine.replica_group->rank() == 0;
  const bool writes = rank == 0 && writer;  // the rank that touches the directory
  fs::path target = directory.filename().empty() ? directory.parent_path() : directory;  // "out/" is "out"
  together(comm, [&] {
    if (target.empty()) throw std::invalid_argument(fmt::format("{}: the directory is empty, expected a path", function));
    if (fs::exists(target) && !fs::is_directory(target))
      throw std::invalid_argument(fmt::format("{}: {} exists and is not a directory (nothing was written)", function,
                                              quoted(target)));
    if (stored != dtype_of<Scalar> && stored != dtype::F32)
      throw std::invalid_argument(fmt::format("{}: stored dtype {}, expected F32 or {} (the engine's)", function,
                                              dtype_name(stored), dtype_name(dtype_of<Scalar>)));
  });
  const fs::path index = target / index_file;
  // config.json (or the file its link names) gets its new text under a temporary name beside it,
  // written and synced before anything changes, and is renamed into place last.
  fs::path config, config_temporary;
  bool created = false;  // the directory is this save's: an empty one is removed if the save fails
  const auto discard_config = [&] {
    std::error_code ignored;
    if (!config_temporary.empty()) fs::remove(config_temporary, ignored);
    if (created) fs::remove(target, ignored);  // only while empty: a folder of the caller's is never removed
  };
  together(comm, [&] {
    if (!writes) return;
    config = save_target(target / files.config, function);  // a folder there is refused: nothing written
    remove_leftover_staging(target);
    std::error_code error;
    created = fs::create_directories(target, error);
    if (error)
      throw std::runtime_error(
          fmt::format("{}: creating the directory {} failed: {}", function, quoted(target), error.message()));
    remove_leftover_temporaries(config);
    config_temporary = temporary_name(config);
    try {
      file_descriptor out{::open(config_temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
      if (out.value < 0) throw_errno(function, "open of", config_temporary);
      write_fully(out.value, bytes_of(config_json), function, config_temporary);
      if (::fsync(out.value) != 0) throw_errno(function, "fsync of", config_temporary);
      const int descriptor = std::exchange(out.value, -1);
      if (::close(descriptor) != 0) throw_errno(function, "close of", config_temporary);
    } catch (...) {
      discard_config();
      throw;
    }
  });
  bool killed = false;  // by the test hook: what a killed job leaves stays
  try {
    // Order (the directory loads as the old model or the new one throughout): model.safetensors, stale index,
    // stale shards, config.json. transformers refuses a safetensors file whose metadata lacks {"format":
    // "pt"}.
    save_model(target / single_file, engine, {{"format", "pt"}}, stored);
    together(comm, [&] {
      if (!writes) return;
      const auto stop_before = [&](const fs::path& path) {
        killed = killed || (stop_before_change_hook() && stop_before_change_hook()(path));
        return killed;
      };
      if (index_file.empty()) {  // a file of its own (an adapter's): nothing of an earlier save goes stale
        if (!stop_before(config)) rename_over(config_temporary, config, function);
        return;
      }
      if (is_file_entry(index)) {
        if (stop_before(index)) return;
        if (::unlink(index.c_str()) != 0 && errno != ENOENT)
          throw_errno(function, "removal of the stale index", index);
        sync_directory(index, function);
      }
      std::vector<fs::path> shards;
      std::error_code error;
      for (fs::directory_iterator it(target, error), end; !error && it != end; it.increment(error))
        if (is_shard_name(it->path().filename().string()) && is_file_entry(it->path()))
          shards.push_back(it->path());
      if (error)
        throw std::runtime_error(fmt::format("{}: listing the directory {} failed: {}", function,
                                             quoted(target), error.message()));
      std::sort(shards.begin(), shards.end());
      for (const fs::path& shard : shards) {
        if (stop_before(shard)) return;
        if (::unlink(shard.c_str()) != 0 && errno != ENOENT)
          throw_errno(function, "removal of the stale shard", shard);
      }
      if (!shards.empty()) sync_directory(shards.front(), function);
      if (stop_before(config)) return;
      rename_over(config_temporary, config, function);
    });
    if (comm::any_rank(comm, killed))
      throw std::runtime_error(
          fmt::format("{}: stopped by the test hook before a change to {} (a simulated kill: "
                      "what was done stays)",
                      function, quoted(target)));
  } catch (...) {  // every rank is here (the failure was agreed): none returns before the cleanup
    if (writes && !killed) discard_config();
    MPI_Barrier(comm.native());
    throw;
  }
}

template <class Scalar>
void load_pretrained(const std::filesystem::path& directory, const sharded_view<Scalar>& engine,
                     const std::vector<std::string>& ignore) {
  // A model with LoRA adapters loads its base: the adapters are no part of a model directory.
  load_hf_weights(directory, model_files, lora_part(engine, false), ignore, "kfsdp::io::load_pretrained");
}

template <class Scalar>
void save_pretrained(const std::filesystem::path& directory, const sharded_view<Scalar>& engine,
                     std::string_view config_json, dtype stored) {
  constexpr std::string_view function = "kfsdp::io::save_pretrained";
  for (const std::size_t p : engine.selected())
    if (is_lora_adapter(engine.params[p].name.view()))
      throw std::invalid_argument(fmt::format("{}: parameter '{}' is a LoRA adapter, which transformers' model directory "
                                              "cannot hold; expected save_adapter (peft's files) or save_merged (the "
                                              "adapters merged into the base)",
                                              function, engine.params[p].name.view()));
  save_hf_weights(directory, model_files, engine, config_json, stored, function);
}

#define KFSDP_HF_CHECKPOINT_INSTANTIATE(Scalar)                                                                  \
  template void load_hf_weights<Scalar>(const std::filesystem::path&, const hf_files&, const sharded_view<Scalar>&, \
                                        const std::vector<std::string>&, std::string_view);                     \
  template void save_hf_weights<Scalar>(const std::filesystem::path&, const hf_files&, const sharded_view<Scalar>&, \
                                        std::string_view, dtype, std::string_view);                             \
  template void load_pretrained<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&,                  \
                                        const std::vector<std::string>&);                                      \
  template void save_pretrained<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&,                  \
                                        std::string_view, dtype);
KFSDP_HF_CHECKPOINT_INSTANTIATE(float)
KFSDP_HF_CHECKPOINT_INSTANTIATE(double)
#undef KFSDP_HF_CHECKPOINT_INSTANTIATE

}  // namespace kfsdp::io
