// LoRA adapters as peft keeps them (include/kfsdp/io/checkpoint/peft_adapter.hpp): adapter_config.json
// read and written, adapter_model.safetensors saved and loaded through hf_checkpoint.cpp's directory
// code on the engine's adapters alone, and the merge of the adapters into their base weights.
#include <kfsdp/io/checkpoint/peft_adapter.hpp>

#include <kfsdp/comm/mpi/datatypes.hpp>

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "checkpoint_transfer.hpp"
#include "hf_directory.hpp"
#include "json_reader.hpp"

namespace kfsdp::io {

using namespace checkpoint_detail;
using json_detail::json_kind;
using json_detail::json_value;

namespace {

constexpr std::string_view read_function = "kfsdp::io::read_lora_config";

// A JSON value that holds something: not absent, null, false, an empty list or an empty object.
bool is_set(const json_value* value) {
  if (value == nullptr || value->kind == json_kind::null) return false;
  if (value->kind == json_kind::boolean) return value->text == "true";
  if (value->kind == json_kind::array || value->kind == json_kind::object) return !value->values.empty();
  return true;
}

// The adapters of the engine, or std::invalid_argument naming the function.
template <class Scalar>
sharded_view<Scalar> adapters_of(const sharded_view<Scalar>& engine, std::string_view function) {
  sharded_view<Scalar> adapters = lora_part(engine, true);
  if (adapters.selected().empty())
    throw std::invalid_argument(fmt::format("{}: the model has no LoRA adapter, expected one built with a lora_config "
                                            "of rank 1 or more (make_llama(config, window, lora))",
                                            function));
  adapters.file_prefix = std::string(peft_prefix);
  return adapters;
}

std::string json_string(std::string_view text) {
  std::string quoted;
  json_detail::append_json_string(quoted, text);
  return quoted;
}

}  // namespace

lora_config parse_lora_config(std::string_view json, std::string_view origin) {
  const std::string where = fmt::format("'{}'", origin);
  json_value root;
  try {
    root = json_detail::parse_json(json, origin);
  } catch (const format_error& error) {
    throw format_error(fmt::format("{}: adapter_config.json {} is not valid JSON: {}", read_function, where, error.what()));
  }
  if (root.kind != json_kind::object)
    throw format_error(fmt::format("{}: adapter_config.json {} holds {}, expected a JSON object", read_function, where,
                                   json_detail::kind_name(root.kind)));
  const json_detail::object_keys keys(root, read_function, where);
  if (const std::string type = keys.text("peft_type", ""); type != "LORA")
    keys.fail("peft_type", fmt::format("'{}', expected \"LORA\"", type));
  lora_config lora;
  lora.rank = keys.size("r");
  lora.alpha = keys.real("lora_alpha", 8.0);
  lora.dropout = keys.real("lora_dropout", 0.0);
  const json_value* targets = root.find("target_modules");
  if (targets != nullptr && targets->kind == json_kind::string) {
    // peft reads any other string as a regular expression over module paths.
    if (targets->text != "all-linear")
      keys.fail("target_modules", fmt::format("'{}', expected a list of module names or \"all-linear\" (a regular "
                                              "expression is not read)",
                                              targets->text));
    lora.targets = {targets->text};
  } else if (targets != nullptr && targets->kind == json_kind::array) {
    for (const json_value& item : targets->values) {
      if (item.kind != json_kind::string)
        keys.fail("target_modules", fmt::format("an item is {}, expected module names", json_detail::kind_name(item.kind)));
      lora.targets.push_back(item.text);
    }
    std::sort(lora.targets.begin(), lora.targets.end());  // peft keeps a set: its order means nothing
  } else {
    keys.fail("target_modules", "missing, expected a list of module names (peft's LoraConfig)");
  }
  if (const std::string bias = keys.text("bias", "none"); bias != "none")
    keys.fail("bias", fmt::format("'{}', expected \"none\" (kfsdp's adapters train no bias)", bias));
  // Settings that change what the adapter computes, which kfsdp does not: refused when set.
  for (const std::string_view key : {"use_rslora", "use_dora", "fan_in_fan_out", "modules_to_save", "layers_to_transform",
                                     "layers_pattern", "rank_pattern", "alpha_pattern", "exclude_modules", "lora_bias",
                                     "target_parameters", "layer_replication", "use_qalora", "trainable_token_indices"})
    if (const json_value* value = root.find(key); is_set(value))
      keys.fail(key, fmt::format("{} '{}', expected it unset (false, null or empty: kfsdp does not compute it)",
                                 json_detail::kind_name(value->kind), value->kind == json_kind::array ? "[...]" : value->text));
  try {
    lora.validate_settings();  // the targets are the model's to check (make_llama)
  } catch (const std::invalid_argument& error) {
    throw format_error(fmt::format("{}: adapter_config.json {}: {}", read_function, where, error.what()));
  }
  return lora;
}

lora_config read_lora_config(const std::filesystem::path& path) {
  std::error_code ignored;
  const std::filesystem::path file = std::filesystem::is_directory(path, ignored) ? path / "adapter_config.json" : path;
  return parse_lora_config(json_detail::read_text_file(file, "adapter_config.json", read_function), file.string());
}

std::string lora_config_json(const lora_config& lora, std::string_view base_model) {
  if (lora.rank == 0)
    throw std::invalid_argument("kfsdp::io::lora_config_json: rank is 0, expected the config of an adapter (1 or more)");
  std::vector<std::string> targets = lora.targets;
  std::sort(targets.begin(), targets.end());
  std::string target_list;
  for (const std::string& t : targets) target_list += (target_list.empty() ? "" : ", ") + json_string(t);
  const bool all_linear = targets.size() == 1 && targets[0] == "all-linear";
  return fmt::format(
      "{{\n  \"base_model_name_or_path\": {},\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n"
      "  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n  \"lora_alpha\": {},\n  \"lora_dropout\": {},\n"
      "  \"modules_to_save\": null,\n  \"peft_type\": \"LORA\",\n  \"r\": {},\n  \"target_modules\": {},\n"
      "  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n  \"use_rslora\": false\n}}\n",
      base_model.empty() ? std::string("null") : json_string(base_model), lora.alpha, lora.dropout, lora.rank,
      all_linear ? json_string(targets[0]) : "[" + target_list + "]");
}

template <class Scalar>
void save_adapter(const std::filesystem::path& directory, const sharded_view<Scalar>& engine, const lora_config& lora,
                  std::string_view base_model, dtype stored) {
  constexpr std::string_view function = "kfsdp::io::save_adapter";
  const sharded_view<Scalar> adapters = adapters_of(engine, function);
  std::string json;
  together(mpi_of(engine, function), [&] { json = lora_config_json(lora, base_model); });
  save_hf_weights(directory, adapter_files, adapters, json, stored, function);
}

template <class Scalar>
void load_adapter(const std::filesystem::path& directory, const sharded_view<Scalar>& engine) {
  constexpr std::string_view function = "kfsdp::io::load_adapter";
  load_hf_weights(directory, adapter_files, adapters_of(engine, function), {}, function);
}

template <class Scalar>
void save_merged(const std::filesystem::path& directory, const sharded_view<Scalar>& engine, const lora_config& lora,
                 std::string_view config_json, dtype stored) {
  constexpr std::string_view function = "kfsdp::io::save_merged";
  comm::mpi& comm = mpi_of(engine, function);
  const auto rank = static_cast<std::size_t>(engine.rank);
  const double scale = lora.scale();
  // Each adapted module: its weight, A and B (A [r, in] and B [out, r]; W [out, in] has B's rows on every rank).
  struct module {
    std::size_t weight, a, b;
  };
  std::vector<module> modules;
  together(comm, [&] {
    (void)adapters_of(engine, function);
    if (lora.rank == 0) throw std::invalid_argument(fmt::format("{}: lora's rank is 0, expected the adapters' rank", function));
    std::map<std::string, std::size_t, std::less<>> index_of;
    for (std::size_t p = 0; p < engine.params.size(); ++p) index_of.emplace(std::string(engine.params[p].name.view()), p);
    for (std::size_t p = 0; p < engine.params.size(); ++p) {
      const std::string_view name = engine.params[p].name.view();
      if (!name.ends_with(".lora_A.weight")) continue;
      const std::string owner(name.substr(0, name.size() - std::string_view(".lora_A.weight").size()));
      const auto weight = index_of.find(owner + ".weight"), b = index_of.find(owner + ".lora_B.weight");
      if (weight == index_of.end() || b == index_of.end())
        throw std::invalid_argument(fmt::format("{}: adapter '{}' has no {}, expected '{}.weight' and '{}.lora_B.weight'", function,
                                                name, weight == index_of.end() ? "base weight" : "B", owner, owner));
      const param_info &w = engine.params[weight->second], &a = engine.params[p];
      if (a.shape[0] != lora.rank)
        throw std::invalid_argument(fmt::format("{}: adapter '{}' has rank {}, lora's rank is {}", function, name, a.shape[0], lora.rank));
      if (w.rank != 2 || a.shape[1] != w.shape[1])
        throw std::invalid_argument(fmt::format("{}: adapter '{}' does not fit its base weight '{}.weight'", function, name, owner));
      modules.push_back({weight->second, p, b->second});
    }
  });

  // The rows this rank holds of every adapted weight, kept to be put back bit for bit.
  const auto host_flat = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), engine.flat);
  std::vector<std::vector<Scalar>> kept(modules.size());
  const auto restore = [&] {
    for (std::size_t m = 0; m < modules.size(); ++m) {
      const index_range chunk = engine.mapping.chunk(modules[m].weight);
      std::copy(kept[m].begin(), kept[m].end(), host_flat.data() + chunk.first);
    }
    Kokkos::deep_copy(engine.flat, host_flat);
  };
  // Each module's rows of W on this rank: W += s · B A, with A gathered whole.
  const auto merge_in = [&] {
    for (std::size_t m = 0; m < modules.size(); ++m) {
      const module& mod = modules[m];
      const index_range w_chunk = engine.mapping.chunk(mod.weight), a_chunk = engine.mapping.chunk(mod.a),
                        b_chunk = engine.mapping.chunk(mod.b);
      kept[m].assign(host_flat.data() + w_chunk.first, host_flat.data() + w_chunk.first + w_chunk.count);
      // A whole: every rank's chunk in rank order, its real rows first.
      std::vector<Scalar> a(a_chunk.count * static_cast<std::size_t>(engine.world_size));
      const MPI_Datatype type = comm::detail::mpi_datatype<Scalar>();
      check_mpi(MPI_Allgather(host_flat.data() + a_chunk.first, static_cast<int>(a_chunk.count), type, a.data(),
                              static_cast<int>(a_chunk.count), type, comm.native()),
                function, "MPI_Allgather of a LoRA A", directory);
      const std::size_t in = engine.params[mod.weight].shape[1], r = lora.rank;
      const std::size_t rows = engine.mapping.elements(mod.weight, rank).count / in;  // this rank's real rows of W and B
      Scalar* w = host_flat.data() + w_chunk.first;
      const Scalar* b = host_flat.data() + b_chunk.first;
      // In double, rounded once to Scalar: the merged weight as near W + s·B·A as the scalar holds.
      std::vector<double> row(in);
      for (std::size_t i = 0; i < rows; ++i) {
        std::fill(row.begin(), row.end(), 0.0);
        for (std::size_t k = 0; k < r; ++k) {
          const double factor = double(b[i * r + k]);
          for (std::size_t j = 0; j < in; ++j) row[j] += factor * double(a[k * in + j]);
        }
        for (std::size_t j = 0; j < in; ++j) w[i * in + j] = static_cast<Scalar>(double(w[i * in + j]) + scale * row[j]);
      }
    }
    Kokkos::deep_copy(engine.flat, host_flat);
  };
  try {
    together(comm, merge_in);
    save_hf_weights(directory, model_files, lora_part(engine, false), config_json, stored, function);
  } catch (...) {  // the weights as they were, however far the merge or the save went
    restore();
    throw;
  }
  restore();
}

#define KFSDP_PEFT_ADAPTER_INSTANTIATE(Scalar)                                                                              \
  template void save_adapter<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&, const lora_config&,         \
                                     std::string_view, dtype);                                                           \
  template void load_adapter<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&);                            \
  template void save_merged<Scalar>(const std::filesystem::path&, const sharded_view<Scalar>&, const lora_config&,          \
                                    std::string_view, dtype);
KFSDP_PEFT_ADAPTER_INSTANTIATE(float)
KFSDP_PEFT_ADAPTER_INSTANTIATE(double)
#undef KFSDP_PEFT_ADAPTER_INSTANTIATE

}  // namespace kfsdp::io
