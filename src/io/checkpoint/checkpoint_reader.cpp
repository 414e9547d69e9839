// Parallel safetensors checkpoints over MPI-IO, the reader (include/kfsdp/io/checkpoint/checkpoint.hpp):
// load_model, import_weights, load_checkpoint (load_state_dict_file is in safetensors_file.cpp).
#include "checkpoint_transfer.hpp"

namespace kfsdp::io {

using namespace checkpoint_detail;

namespace {

// ------------------------------------------------------------------ the parallel reader

// The tensors a load refuses (strict): a standard safetensors file (no kfsdp keys) holds weights
// only, so each tensor of it that the model does not have is one; a kfsdp file's weights are
// counted by parameters_key instead, and its other tensors are a checkpoint's optimizer state.
template <class Scalar>
void refuse_unexpected(std::string_view function, const std::filesystem::path& path, const header_table& table,
                       std::span<const sharded_tensor<Scalar>> tensors) {
  if (table.metadata.contains(std::string(parameters_key))) return;
  std::set<std::string_view> known;
  for (const sharded_tensor<Scalar>& tensor : tensors) known.insert(tensor.name);
  std::vector<std::string> unexpected;
  for (const tensor_info& in_file : table.tensors)
    if (!known.contains(in_file.name)) unexpected.push_back(fmt::format("'{}'", in_file.name));
  if (unexpected.empty()) return;
  constexpr std::size_t named = 8;  // enough to see which layers; the count says the rest
  const std::size_t shown = std::min(unexpected.size(), named);
  throw format_error(fmt::format(
      "{}: file {}: holds {} tensor{} that the model does not have: {}{}; expected the model's tensors only "
      "(kfsdp::io::import_weights loads those it has and reports the others)",
      function, quoted(path), unexpected.size(), unexpected.size() == 1 ? "" : "s",
      fmt::join(unexpected.begin(), unexpected.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      unexpected.size() > shown ? fmt::format(" and {} more", unexpected.size() - shown) : std::string()));
}

// With `lenient`, tensors missing from the file are skipped and named there, with the file's
// tensors the model lacks, instead of being an error.
template <class Scalar>
metadata_map read_sharded_file(std::string_view function, const std::filesystem::path& path,
                               const sharded_view<Scalar>& engine, comm::mpi& comm,
                               std::span<const named_shard<Scalar>> shards,
                               import_report* lenient = nullptr) {
  const MPI_Comm native = comm.native();
  const int rank = comm.rank();
  std::vector<sharded_tensor<Scalar>> tensors;
  together(comm, [&] {
    tensors = sharded_tensors(engine, shards, function);
  });

  std::uint64_t file_size = 0;
  std::vector<std::byte> prefix = header_on_every_rank(function, path, comm, file_size);

  header_table table;
  std::vector<file_piece> pieces;
  together(comm, [&] {
    const auto fail = [&](const std::string& tensor, const std::string& what) {
      throw format_error(fmt::format("{}: file {}: tensor '{}': {}", function, quoted(path), tensor, what));
    };
    try {
      table = parse_header(prefix, file_size, path.string());
    } catch (const format_error& invalid) {
      // A tensor deleted from the header leaves its bytes as a hole: name what the model misses first.
      const std::string_view text(reinterpret_cast<const char*>(prefix.data()), prefix.size());
      if (lenient == nullptr)
        for (const sharded_tensor<Scalar>& tensor : tensors)
          if (text.find('"' + tensor.name + '"') == std::string_view::npos)
            fail(tensor.name, fmt::format("missing from the file, expected it (the model has it); {}", invalid.what()));
      throw;
    }
    std::vector<sharded_tensor<Scalar>> present;
    for (const sharded_tensor<Scalar>& tensor : tensors) {
      const param_info& param = engine.params[tensor.param];
      const tensor_info* found = table.find(tensor.name);
      if (found == nullptr && lenient != nullptr) {
        lenient->missing.push_back(tensor.name);
        continue;
      }
      if (found == nullptr) fail(tensor.name, "missing from the file, expected it (the model has it)");
      if (found->type != dtype_of<Scalar>)
        fail(tensor.name, fmt::format("dtype {} in the file, expected {} (the model's)",
                                      dtype_name(found->type), dtype_name(dtype_of<Scalar>)));
      if (found->shape != shape_of(param))
        fail(tensor.name, fmt::format("shape {} in the file, expected {} for the model",
                                      shape_string(found->shape), shape_string(shape_of(param))));
      if (has_checksums(table) && !table.metadata.contains(std::string(checksum_key_prefix) + tensor.name))
        fail(tensor.name, fmt::format("no '{}{}' in __metadata__, expected its checksum",
                                      checksum_key_prefix, tensor.name));
      if (tensor.local_bytes > 0)
        pieces.push_back({first_row_offset(*found, engine.mapping, tensor.param, static_cast<std::size_t>(rank)),
                          tensor.local_bytes});
      present.push_back(tensor);
    }
    if (lenient != nullptr) {
      std::set<std::string_view> known;
      for (const sharded_tensor<Scalar>& tensor : tensors) known.insert(tensor.name);
      for (const tensor_info& in_file : table.tensors)
        if (!known.contains(in_file.name)) lenient->unexpected.push_back(in_file.name);
      for (const sharded_tensor<Scalar>& tensor : present) lenient->loaded.push_back(tensor.name);
    }
    if (lenient == nullptr) refuse_unexpected<Scalar>(function, path, table, tensors);
    tensors = std::move(present);
    const auto count = table.metadata.find(parameters_key);
    if (lenient == nullptr && count != table.metadata.end() &&
        count->second != std::to_string(engine.selected().size()))
      throw format_error(fmt::format("{}: file {}: holds {} weight tensors ('{}'), expected {} for the model",
                                     function, quoted(path), count->second, parameters_key,
                                     engine.selected().size()));
    verify_header_checksum(table, function);
  });
  // The pieces were pushed in the order of `tensors`; the file view needs them in file order.
  std::vector<std::size_t> order(pieces.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return pieces[a].offset < pieces[b].offset; });
  std::vector<file_piece> sorted_pieces;
  std::vector<std::uint64_t> staged_at(pieces.size());  // piece i's place in the read buffer
  std::uint64_t read_offset = 0;
  for (const std::size_t i : order) {
    sorted_pieces.push_back(pieces[i]);
    staged_at[i] = read_offset;
    read_offset += pieces[i].length;
  }

  std::vector<std::byte> staging;
  together(comm, [&] { staging.resize(read_offset); });
  MPI_File file = MPI_FILE_NULL;
  together(comm, [&] {
    check_mpi(MPI_File_open(native, path.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &file), function,
              "MPI_File_open", path);
  });
  std::optional<failure> read_error =
      transfer_pieces(file, native, sorted_pieces, staging.data(), false, function, path);
  MPI_File_close(&file);
  agree(comm, read_error);

  // Checksums over every rank's rows, combined in rank order, against __metadata__.
  std::vector<checksum_state> local_checksums;
  std::vector<std::uint64_t> piece_of_tensor(tensors.size());  // offset in `staging`
  for (std::size_t t = 0, piece = 0; t < tensors.size(); ++t) {
    piece_of_tensor[t] = tensors[t].local_bytes > 0 ? staged_at[piece++] : 0;
    local_checksums.push_back(
        checksum_of(std::span(staging).subspan(piece_of_tensor[t], tensors[t].local_bytes)));
  }
  const std::vector<checksum_state> checksums = combine_checksums(comm, local_checksums, function, path);
  together(comm, [&] {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      verify_tensor_checksum(table, tensors[t].name, checksums[t], function);
      check_loaded_finite(
          std::span<const Scalar>(reinterpret_cast<const Scalar*>(staging.data() + piece_of_tensor[t]),
                                  tensors[t].local_bytes / sizeof(Scalar)),
          tensors[t].name, function, path);
    }
  });

  // Every rank verified everything: commit, padding rows zero.
  together(comm, [&] {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const index_range chunk{tensors[t].flat_first, engine.mapping.chunk(tensors[t].param).count};
      const std::size_t valid = tensors[t].local_bytes / sizeof(Scalar);
      Kokkos::deep_copy(Kokkos::subview(tensors[t].flat, std::make_pair(chunk.first, chunk.first + valid)),
                        Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            reinterpret_cast<const Scalar*>(staging.data() + piece_of_tensor[t]), valid));
      Kokkos::deep_copy(Kokkos::subview(tensors[t].flat, std::make_pair(chunk.first + valid, chunk.last())), Scalar{0});
    }
  });
  return table.metadata;
}

}  // namespace

metadata_map read_metadata(const std::filesystem::path& path, comm::mpi& comm) {
  constexpr std::string_view function = "kfsdp::io::read_metadata";
  std::uint64_t file_size = 0;
  const std::vector<std::byte> prefix = header_on_every_rank(function, path, comm, file_size);
  header_table table;
  together(comm, [&] {
    table = parse_header(prefix, file_size, path.string());
    verify_header_checksum(table, function);
  });
  return table.metadata;
}

template <class Scalar>
metadata_map load_model(const std::filesystem::path& path, const sharded_view<Scalar>& engine) {
  constexpr std::string_view function = "kfsdp::io::load_model";
  return read_sharded_file<Scalar>(function, path, engine, mpi_of(engine, function), {});
}

template <class Scalar>
metadata_map read_metadata(const std::filesystem::path& path, const sharded_view<Scalar>& engine) {
  return read_metadata(path, mpi_of(engine, "kfsdp::io::read_metadata"));
}

template <class Scalar>
import_report import_weights(const std::filesystem::path& path, const sharded_view<Scalar>& engine) {
  constexpr std::string_view function = "kfsdp::io::import_weights";
  import_report report;
  report.metadata = read_sharded_file<Scalar>(function, path, engine, mpi_of(engine, function), {}, &report);
  return report;
}

std::string describe(const import_report& report) {
  const auto names = [](const std::vector<std::string>& list) {
    std::string text;
    for (const std::string& name : list) text += fmt::format("{}'{}'", text.empty() ? "" : ", ", name);
    return text;
  };
  std::string text = fmt::format("loaded {} of {} tensors", report.loaded.size(),
                                 report.loaded.size() + report.missing.size());
  if (!report.missing.empty()) text += "; missing (kept as they were): " + names(report.missing);
  if (!report.unexpected.empty()) text += "; unexpected (ignored): " + names(report.unexpected);
  return text;
}

template <class Scalar>
void load_checkpoint(const std::filesystem::path& path, const sharded_view<Scalar>& engine,
                     checkpoint_state<Scalar>& state) {
  constexpr std::string_view function = "kfsdp::io::load_checkpoint";
  state.metadata = read_sharded_file<Scalar>(function, path, engine, mpi_of(engine, function), state.shards);
}


#define KFSDP_CHECKPOINT_INSTANTIATE(Scalar)                                                      \
  template metadata_map load_model<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&);  \
  template metadata_map read_metadata<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&); \
  template import_report import_weights<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&); \
  template void load_checkpoint<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&,      \
                                        checkpoint_state<Scalar>&);
KFSDP_CHECKPOINT_INSTANTIATE(float)
KFSDP_CHECKPOINT_INSTANTIATE(double)
#undef KFSDP_CHECKPOINT_INSTANTIATE

}  // namespace kfsdp::io
