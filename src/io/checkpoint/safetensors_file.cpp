// save_state_dict_file and load_state_dict_file: one safetensors file from one process, with the
// checkpoints' format checks (checksums, temporary name + fsync + rename) and no MPI.
#include <kfsdp/io/checkpoint/safetensors_file.hpp>

#include "checkpoint_files.hpp"

namespace kfsdp::io {

using namespace checkpoint_detail;

void save_state_dict_file(const std::filesystem::path& requested, const state_dict& full,
                          const metadata_map& metadata) {
  constexpr std::string_view function = "kfsdp::io::save_state_dict_file";
  const std::filesystem::path path = save_target(requested, function);
  check_user_metadata(metadata, function);
  std::vector<tensor_entry> entries;
  std::vector<checksum_state> checksums;
  std::uint64_t numel = 0;
  std::string weight_dtype;
  for (const tensor& t : full) {
    if (t.bytes.size() != t.numel() * dtype_size(t.type))
      throw std::invalid_argument(fmt::format("{}: tensor '{}' of shape {} holds {} bytes, expected {}",
                                              function, t.name, shape_string(t.shape), t.bytes.size(),
                                              t.numel() * dtype_size(t.type)));
    if (t.type == dtype::F32) check_finite(t.values<float>(), t.name, function, requested);
    if (t.type == dtype::F64) check_finite(t.values<double>(), t.name, function, requested);
    entries.push_back({t.name, t.type, {t.shape.begin(), t.shape.end()}});
    checksums.push_back(checksum_of(t.bytes));
    numel += t.numel();
    const std::string name(dtype_name(t.type));
    weight_dtype = weight_dtype.empty() || weight_dtype == name ? name : "mixed";
  }
  const file_layout layout = checkpoint_layout(entries, checksums, metadata, full.size(), numel, weight_dtype);

  remove_leftover_temporaries(path);
  const std::filesystem::path temporary = temporary_name(path);
  file_descriptor file{::open(temporary.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644)};
  if (file.value < 0) throw_errno(function, "open of", temporary);
  try {
    write_fully(file.value, layout.prefix, function, temporary);
    if (stop_after_header_hook() && stop_after_header_hook()(temporary))
      throw simulated_kill(fmt::format("{}: stopped by the test hook after the header of {} (a simulated kill)",
                                       function, quoted(temporary)));
    for (const tensor& t : full) write_fully(file.value, t.bytes, function, temporary);
    if (::fsync(file.value) != 0) throw_errno(function, "fsync of", temporary);
    const int descriptor = std::exchange(file.value, -1);
    if (::close(descriptor) != 0) throw_errno(function, "close of", temporary);
    rename_over(temporary, path, function);
  } catch (const simulated_kill& stopped) {
    throw std::runtime_error(stopped.what());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
}

state_dict load_state_dict_file(const std::filesystem::path& path, metadata_map* metadata) {
  constexpr std::string_view function = "kfsdp::io::load_state_dict_file";
  std::uint64_t file_size = 0;
  const std::vector<std::byte> prefix = read_header_bytes(path, file_size, function);
  const header_table table = parse_header(prefix, file_size, path.string());
  verify_header_checksum(table, function);
  file_descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.value < 0) throw_errno(function, "open of", path);
  state_dict full;
  for (const tensor_info& info : table.tensors) {
    if (info.type != dtype::F64 && info.type != dtype::F32 && info.type != dtype::BF16 && info.type != dtype::F16)
      throw format_error(fmt::format("{}: file {}: tensor '{}': dtype {}, expected F64, F32, BF16 or F16",
                                     function, quoted(path), info.name, dtype_name(info.type)));
    tensor t{info.name, {info.shape.begin(), info.shape.end()},
             info.type, {}};
    t.bytes.resize(info.size_bytes());
    if (read_fully(file.value, t.bytes, info.begin, function, path) != info.size_bytes())
      throw format_error(fmt::format("{}: file {}: tensor '{}': the file ended inside it",
                                     function, quoted(path), info.name));
    verify_tensor_checksum(table, info.name, checksum_of(t.bytes), function);
    full.add(std::move(t));
  }
  if (metadata != nullptr) *metadata = table.metadata;
  return full;
}

metadata_map read_file_metadata(const std::filesystem::path& path) {
  constexpr std::string_view function = "kfsdp::io::read_file_metadata";
  std::uint64_t file_size = 0;
  const std::vector<std::byte> prefix = read_header_bytes(path, file_size, function);
  const header_table table = parse_header(prefix, file_size, path.string());
  verify_header_checksum(table, function);
  return table.metadata;
}

}  // namespace kfsdp::io
