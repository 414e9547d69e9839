#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::predictor — a trained model's forward and nothing else: no communicator, no gradients, no
// optimizer, no MPI (a program links the kfsdp library only). It is what a solver calls inside its time
// loop. The weights come by name from a safetensors file in F64, F32, BF16 or F16, converted to
// Scalar; a model's loss layer, if it has one, is not run. Normalisation statistics in the file's
// metadata (io::stats_metadata's keys) are applied: inputs normalised, predictions mapped back; they
// are refused unless io::stats_from_metadata accepts them for the model's widths.
//
//   kfsdp::environment kokkos_up(argc, argv);
//   kfsdp::predictor<surrogate, double> model(make_surrogate(64, 4), "surrogate.safetensors");
//   kfsdp::nn::matrix<double> u = model.predict(x);               // x [rows, 6], Kokkos' memory
//   std::vector<double> v = model.predict(host_values, rows);      // row-major host arrays
//
// The file may be a whole checkpoint (save_checkpoint, fit): its training state beside the weights
// is ignored. Any other tensor the model lacks, or a parameter the file lacks or holds in another
// shape, is refused naming the file and the tensor.

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kfsdp/io/data/array_dataset.hpp>
#include <kfsdp/io/checkpoint/safetensors_file.hpp>
#include <kfsdp/meta/half.hpp>
#include <kfsdp/meta/host_memory.hpp>  // require_host_memory
#include <kfsdp/model/model_graph.hpp>
#include <kfsdp/model/unit_assignment.hpp>
#include <kfsdp/compute/network.hpp>

namespace kfsdp {

KFSDP_EXPORT template <descriptor Model, class Scalar>
class predictor {
 public:
  using scalar_type = Scalar;
  using input_type = value_t<input_t<Model>, Scalar>;

  predictor(const predictor&) = delete;  // its pass refers back to it: neither copied nor moved
  predictor& operator=(const predictor&) = delete;

  /// Loads `weights` into `model`'s parameters; throws (std::invalid_argument, io::format_error)
  /// naming the file and the tensor that does not fit.
  predictor(const Model& model, const std::filesystem::path& weights)
      : graph_(make_model_graph(model)), network_(model, graph_, assign_units(graph_, {})), context_(*this) {
    // The weights twice, as the file holds them and converted, checked before either is read.
    double numel = 0;
    for (const param_info& param : graph_.params) numel += double(param.numel);
    std::error_code no_size;
    const auto file_bytes = std::filesystem::file_size(weights, no_size);  // a missing file is named by the load
    require_host_memory(double(no_size ? 0 : file_bytes) + numel * double(sizeof(Scalar)),
                        fmt::format("the model's weights for {}", weights.string()));
    const state_dict file = io::load_state_dict_file(weights, &metadata_);
    std::size_t found = 0;
    for (const param_info& param : graph_.params) {
      const tensor* t = file.find(param.name.view());
      const std::vector<std::size_t> shape(param.shape.begin(), param.shape.begin() + param.rank);
      if (t == nullptr) refuse(weights, fmt::format("has no tensor '{}', a parameter of the model", param.name.view()));
      if (t->shape != shape)
        refuse(weights, fmt::format("tensor '{}' has shape [{}], the model's is [{}]", t->name, fmt::join(t->shape, ", "),
                                    fmt::join(shape, ", ")));
      params_.push_back(converted(*t));
      ++found;
    }
    // A kfsdp file says how many of its tensors are weights: the rest is training state.
    const auto weights_in_file = metadata_.find(io::parameters_key);
    const bool only_state_beside = weights_in_file != metadata_.end() && weights_in_file->second == std::to_string(found);
    if (!only_state_beside)
      for (const tensor& t : file)
        if (index_of(t.name) == graph_.params.size())
          refuse(weights, fmt::format("holds tensor '{}', which the model does not have", t.name));
    // The statistics checked against the model's widths (io::stats_from_metadata): as many finite means and
    // stddevs > 0 as it has input and output columns.
    if (metadata_.contains("normalization.features.mean")) try {
        constexpr bool takes_features = std::is_same_v<input_type, nn::const_matrix<Scalar>>;
        stats_ = io::stats_from_metadata(metadata_, takes_features ? std::optional(in_features()) : std::nullopt,
                                         out_features());
      } catch (const std::invalid_argument& bad) {
        refuse(weights, fmt::format("has normalisation statistics that do not fit the model: {}", bad.what()));
      }
  }

  /// The model's output (the loss layer's input: predictions, logits) for `inputs`, in the units
  /// of the training data. Reuses its buffers: a copy is returned.
  nn::matrix<Scalar> predict(input_type inputs) {
    if constexpr (std::is_same_v<input_type, nn::const_matrix<Scalar>>)
      if (stats_) inputs = normalized(inputs);
    nn::matrix<Scalar> result = copied(output(inputs));
    if (stats_) unnormalize(result);
    return result;
  }

  /// A generation step with a key/value cache (compute/kv_cache.hpp): the logits [rows, vocab] of
  /// `ids` as the tokens at positions cache.positions() onward, each attending to the cached
  /// positions and to the rows before it; their keys and values join the cache. The prompt can come
  /// whole (prefill), then one token a step: each layer then runs on that one row.
  ///
  ///   kfsdp::kv_cache<float> cache(config.seq);
  ///   auto logits = model.predict_cached(prompt_ids, cache);   // [P, vocab]
  ///   auto next = model.predict_cached(one_id, cache);         // [1, vocab], position P
  ///
  /// Throws std::invalid_argument when the step passes cache.max_positions() or the positions the
  /// model's RoPE holds (make_llama's window), or for a model with learned positions; the cache's
  /// positions are then unchanged.
  nn::matrix<Scalar> predict_cached(nn::const_index_vector ids, kv_cache<Scalar>& cache)
    requires std::is_same_v<input_type, nn::const_index_vector>
  {
    cache.begin_step(ids.extent(0));
    struct step_end {  // the context leaves the cached step however the forward ends
      forward_only& context;
      ~step_end() { context.cache = nullptr; }
    } uncached{context_};
    context_.cache = &cache;
    nn::matrix<Scalar> result = copied(output(ids));
    cache.end_step();
    return result;
  }

  /// predict on host arrays: `inputs` holds rows × in_features() values, row-major; the result
  /// rows × out_features() values.
  std::vector<double> predict(std::span<const double> inputs, std::size_t rows)
    requires std::is_same_v<input_type, nn::const_matrix<Scalar>>
  {
    if (rows == 0 || inputs.size() % rows != 0)
      throw std::invalid_argument(
          fmt::format("kfsdp::predictor::predict: {} values for {} rows, expected rows · features values", inputs.size(), rows));
    const std::size_t width = inputs.size() / rows;
    nn::matrix<Scalar> x(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::predictor::input"), rows, width);
    const auto host = Kokkos::create_mirror_view(x);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < width; ++c) host(r, c) = Scalar(inputs[r * width + c]);
    Kokkos::deep_copy(x, host);
    const auto y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), predict(nn::const_matrix<Scalar>(x)));
    std::vector<double> out(y.extent(0) * y.extent(1));
    for (std::size_t r = 0; r < y.extent(0); ++r)
      for (std::size_t c = 0; c < y.extent(1); ++c) out[r * y.extent(1) + c] = double(y(r, c));
    return out;
  }

  /// Features a row of the inputs has (0 for a model that takes token ids), and a row of predict's result.
  [[nodiscard]] std::size_t in_features() const noexcept { return network_.in_features(); }
  [[nodiscard]] std::size_t out_features() const noexcept { return network_.out_features(); }
  /// The file's metadata (the training program's keys included).
  [[nodiscard]] const io::metadata_map& metadata() const noexcept { return metadata_; }
  /// Whether the file carried normalisation statistics (then applied by predict).
  [[nodiscard]] bool normalizes() const noexcept { return stats_.has_value(); }

 private:
  // The forward's view of the parameters; a predictor has no units to gather and no gradients.
  struct forward_only final : pass_context<Scalar> {
    explicit forward_only(predictor& p) : owner(p) {}
    layer_params<Scalar> grads(std::span<const std::size_t>, bool) override {
      throw std::logic_error("kfsdp::predictor: a forward-only model has no gradients");
    }
    layer_params<const Scalar> bind_params(std::span<const std::size_t> indices) override {
      layer_params<const Scalar> p;  // bound once: the weights never move
      for (const std::size_t i : indices) p.push(owner.params_[i], owner.graph_.params[i]);
      return p;
    }
    predictor& owner;
  };

  // The model's output (a loss layer's input, without targets) in the network's buffers.
  nn::const_matrix<Scalar> output(input_type inputs) {
    if constexpr (std::is_same_v<output_t<Model>, loss>) {
      (void)network_.forward(context_, inputs);
      return context_.predictions;
    } else {
      return network_.forward(context_, inputs);
    }
  }
  static nn::matrix<Scalar> copied(nn::const_matrix<Scalar> out) {
    nn::matrix<Scalar> result(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::predictor::output"), out.extent(0),
                              out.extent(1));
    Kokkos::deep_copy(result, out);
    return result;
  }

  [[noreturn]] static void refuse(const std::filesystem::path& file, const std::string& what) {
    throw std::invalid_argument(fmt::format("kfsdp::predictor: {} {}", file.string(), what));
  }
  std::size_t index_of(std::string_view name) const {
    for (std::size_t p = 0; p < graph_.params.size(); ++p)
      if (graph_.params[p].name.view() == name) return p;
    return graph_.params.size();
  }

  // The tensor's values as Scalar, on the device.
  static Kokkos::View<Scalar*> converted(const tensor& t) {
    Kokkos::View<Scalar*> flat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kfsdp::predictor::" + t.name), t.numel());
    const auto host = Kokkos::create_mirror_view(flat);
    const std::byte* bytes = t.bytes.data();
    for (std::size_t i = 0; i < t.numel(); ++i) {
      const auto at = [&]<class T>(T) {
        T value;
        std::memcpy(&value, bytes + i * sizeof(T), sizeof(T));
        return value;
      };
      switch (t.type) {
        case dtype::F64: host(i) = Scalar(at(double{})); break;
        case dtype::F32: host(i) = Scalar(at(float{})); break;
        case dtype::BF16: host(i) = Scalar(float(bf16::from_bits(at(std::uint16_t{})))); break;
        case dtype::F16: host(i) = Scalar(float(f16::from_bits(at(std::uint16_t{})))); break;
        default:
          throw std::invalid_argument(fmt::format("kfsdp::predictor: tensor '{}' has dtype {}, expected F64, F32, BF16 or F16",
                                                  t.name, io::dtype_name(t.type)));
      }
    }
    Kokkos::deep_copy(flat, host);
    return flat;
  }

  static Kokkos::View<Scalar*> device_values(const std::vector<double>& values, const std::string& label) {
    Kokkos::View<Scalar*> out(label, values.size());
    const auto host = Kokkos::create_mirror_view(out);
    for (std::size_t i = 0; i < values.size(); ++i) host(i) = Scalar(values[i]);
    Kokkos::deep_copy(out, host);
    return out;
  }

  // (x - mean) / stddev per column, into a buffer of the predictor's.
  nn::const_matrix<Scalar> normalized(nn::const_matrix<Scalar> x) {
    if (x.extent(1) != stats_->features.mean.size())
      throw std::invalid_argument(fmt::format("kfsdp::predictor::predict: inputs have {} columns, the model's "
                                              "normalisation statistics {}",
                                              x.extent(1), stats_->features.mean.size()));
    if (scaled_input_.extent(0) != x.extent(0) || scaled_input_.extent(1) != x.extent(1))
      scaled_input_ = nn::matrix<Scalar>("kfsdp::predictor::normalized", x.extent(0), x.extent(1));
    const auto mean = device_values(stats_->features.mean, "kfsdp::predictor::mean");
    const auto stddev = device_values(stats_->features.stddev, "kfsdp::predictor::stddev");
    const auto y = scaled_input_;
    Kokkos::parallel_for("kfsdp::predictor::normalize", Kokkos::RangePolicy<>(0, x.extent(0)), KOKKOS_LAMBDA(std::size_t r) {
      for (std::size_t c = 0; c < x.extent(1); ++c) y(r, c) = (x(r, c) - mean(c)) / stddev(c);
    });
    return y;
  }
  void unnormalize(nn::matrix<Scalar> y) const {
    if (y.extent(1) != stats_->targets.mean.size())
      throw std::invalid_argument(fmt::format("kfsdp::predictor::predict: the model gives {} columns, its normalisation "
                                              "statistics {}", y.extent(1), stats_->targets.mean.size()));
    const auto mean = device_values(stats_->targets.mean, "kfsdp::predictor::target_mean");
    const auto stddev = device_values(stats_->targets.stddev, "kfsdp::predictor::target_stddev");
    Kokkos::parallel_for("kfsdp::predictor::unnormalize", Kokkos::RangePolicy<>(0, y.extent(0)), KOKKOS_LAMBDA(std::size_t r) {
      for (std::size_t c = 0; c < y.extent(1); ++c) y(r, c) = y(r, c) * stddev(c) + mean(c);
    });
  }

  model_graph graph_;  // the one walk of the model: its parameter table and the network's nodes
  std::vector<Kokkos::View<Scalar*>> params_;
  network<Model, Scalar> network_;
  forward_only context_;
  io::metadata_map metadata_;
  std::optional<io::array_dataset::normalization> stats_;
  nn::matrix<Scalar> scaled_input_;
};

}  // namespace kfsdp
