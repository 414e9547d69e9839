#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::io::hdf5_dataset — samples from a shared HDF5 file, read per batch with parallel HDF5 over
// MPI: each rank reads only its rows of a step's batch (one selection of those rows: a point list,
// or row blocks for wide rows; collective MPI-IO), so a dataset larger than a rank's memory trains without being
// loaded. Opt-in backend: this header includes hdf5.h and mpi.h (Debian: libhdf5-openmpi-dev;
// pkg-config kfsdp-hdf5); no core header includes it.
//
//   h5py: f.create_dataset("x", data=features.astype("f4")); f.create_dataset("y", data=targets)
//   kfsdp::io::hdf5_dataset data("heat.h5", "x", "y", job.world().native());   // x [N, F], y [N, T] or [N]
//   const auto stats = data.normalize();           // a streaming pass, collective, in chunks of rows
//   kfsdp::fit(model, adam, schedule, data, {.steps = 4000, .global_batch = 256});
//
// Features and targets are datasets of the file (paths such as "train/x" too) of shape (N, width)
// or (N,), the same N, of any floating-point type (16, 32 or 64-bit, either byte order), converted
// to double on read. Anything else is refused with std::invalid_argument naming the file, the
// dataset, what it is and what was expected, on every rank alike (a file one rank cannot see stops
// every rank, none waits for it). With hdf5_options::collective (the default), rank_slice, rows,
// the statistics and the destructor are collective: every rank of the communicator calls them, in
// the same order, as fit does.

#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kfsdp/io/data/array_dataset.hpp>  // column_stats, normalization
#include <kfsdp/io/data/dataset.hpp>
#include <kfsdp/meta/host_memory.hpp>  // require_host_memory
#include <kfsdp/nn/views.hpp>

#ifndef H5_HAVE_PARALLEL
#error "kfsdp/io/data/hdf5.hpp needs a parallel HDF5 (Debian: libhdf5-openmpi-dev, pkg-config hdf5-openmpi)"
#endif

namespace kfsdp::io {

struct hdf5_options {
  // Collective MPI-IO reads (H5FD_MPIO_COLLECTIVE): the ranks' rows in one MPI-IO operation. Then
  // every rank calls rank_slice and rows together; false reads each rank on its own (independent).
  bool collective = true;
  std::size_t stats_chunk_rows = 65536;  // rows a rank reads at a time in the statistics pass
};

/// What a rank has read from the file so far: rows and bytes as stored (before conversion).
struct hdf5_reads {
  std::size_t rows = 0;   // feature rows and target rows, each counted once per dataset
  std::size_t bytes = 0;  // rows · width · the dtype's size, over both datasets
};

namespace hdf5_detail {

// An HDF5 identifier closed by its close function at the end of its scope; movable, not copyable.
class handle {
 public:
  handle() = default;
  handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  handle(handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), close_(other.close_) {}
  handle& operator=(handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      close_ = other.close_;
    }
    return *this;
  }
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;
  ~handle() { reset(); }

  [[nodiscard]] hid_t get() const noexcept { return id_; }
  [[nodiscard]] bool valid() const noexcept { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0 && close_ != nullptr) (void)close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// A duplicate of the user's communicator, for kfsdp's agreements apart from the user's messages;
// freed unless MPI is finalized already.
class owned_comm {
 public:
  explicit owned_comm(MPI_Comm user) { MPI_Comm_dup(user, &comm_); }
  owned_comm(owned_comm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  owned_comm& operator=(owned_comm&&) = delete;
  owned_comm(const owned_comm&) = delete;
  owned_comm& operator=(const owned_comm&) = delete;
  ~owned_comm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && finalized == 0) MPI_Comm_free(&comm_);
  }
  [[nodiscard]] MPI_Comm get() const noexcept { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// HDF5 prints its error stack by default; kfsdp reports its own message, so printing is off while
// kfsdp calls HDF5 and the program's setting comes back after.
class quiet_errors {
 public:
  quiet_errors() {
    (void)H5Eget_auto2(H5E_DEFAULT, &function_, &data_);
    (void)H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~quiet_errors() { (void)H5Eset_auto2(H5E_DEFAULT, function_, data_); }
  quiet_errors(const quiet_errors&) = delete;
  quiet_errors& operator=(const quiet_errors&) = delete;

 private:
  H5E_auto2_t function_ = nullptr;
  void* data_ = nullptr;
};

// Every rank throws Error with the message of the lowest rank whose `error` is not empty, or none
// throws: a failure on one rank never leaves the others waiting in a collective read.
template <class Error = std::invalid_argument>
void agree(MPI_Comm comm, const std::string& error) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int failing = error.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &failing, 1, MPI_INT, MPI_MIN, comm);
  if (failing == size) return;
  unsigned long long length = error.size();
  MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, failing, comm);
  std::string message = rank == failing ? error : std::string(length, ' ');
  MPI_Bcast(message.data(), int(length), MPI_CHAR, failing, comm);
  throw Error(message);
}

// The names of the root group's links, for an error to list what the file holds.
inline std::vector<std::string> root_names(hid_t file) {
  std::vector<std::string> names;
  H5G_info_t info{};
  if (H5Gget_info(file, &info) < 0) return names;
  for (hsize_t k = 0; k < info.nlinks; ++k) {
    const ssize_t length = H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, k, nullptr, 0, H5P_DEFAULT);
    if (length < 0) continue;
    std::string name(std::size_t(length) + 1, '\0');
    (void)H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, k, name.data(), name.size(), H5P_DEFAULT);
    name.resize(std::size_t(length));
    names.push_back(std::move(name));
  }
  return names;
}

// "an integer type (8 bytes)": what a dataset's type is, for an error.
inline std::string type_text(hid_t type) {
  const std::size_t bytes = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return fmt::format("an integer type ({} bytes)", bytes);
    case H5T_FLOAT: return fmt::format("a {}-bit floating-point type", 8 * bytes);
    case H5T_STRING: return "a string type";
    case H5T_COMPOUND: return "a compound type";
    case H5T_ENUM: return "an enum type";
    case H5T_BITFIELD: return "a bitfield type";
    default: return fmt::format("a type of class {} ({} bytes)", int(H5Tget_class(type)), bytes);
  }
}

// What HDF5's own error stack says went wrong in the call that just failed: its innermost entry
// (where the error arose, "unable to decode ... message" rather than the API's "unable to open
// object"), as "H5Ocache.c H5O__chunk_deserialize: bad layout message version"; "" when the stack is
// empty. Call it right after the failing call: the next HDF5 call clears the stack. (H5Ewalk2 does not.)
inline std::string error_cause() {
  std::string cause;
  const H5E_walk2_t innermost = [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
    if (n == 0 && e != nullptr)
      *static_cast<std::string*>(out) = fmt::format("{}{}", e->func_name != nullptr ? std::string(e->func_name) + ": " : "",
                                                     e->desc != nullptr ? e->desc : "(no description)");
    return 0;
  };
  (void)H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &cause);
  return cause;
}
// ", HDF5 1.10.8 says: <cause>" for an error message; "" when HDF5 said nothing.
inline std::string library_says(const std::string& cause) {
  return cause.empty() ? std::string() : fmt::format(" (HDF5 {}.{}.{} says: {})", H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE, cause);
}

// The first filter of dataset `dataset`'s pipeline that this HDF5 library lacks, as "filter 32000
// ('lzf')"; "" when it has them all. Optional ones too (h5py adds lzf as optional): a chunk the
// writer filtered cannot be read without the filter.
inline std::string missing_filter(hid_t dataset) {
  const handle plist(H5Dget_create_plist(dataset), H5Pclose);
  if (!plist.valid()) return {};
  const int filters = H5Pget_nfilters(plist.get());
  for (int k = 0; k < filters; ++k) {
    unsigned flags = 0, config = 0;
    std::size_t values = 0;
    char name[256] = {};
    const H5Z_filter_t id = H5Pget_filter2(plist.get(), unsigned(k), &flags, &values, nullptr, sizeof name, name, &config);
    if (id >= 0 && H5Zfilter_avail(id) <= 0) return fmt::format("filter {} ('{}')", int(id), name);
  }
  return {};
}

// A dataset as kfsdp reads it: open, its rows, its width and the bytes of one stored value.
struct checked_dataset {
  handle dataset;
  std::size_t count = 0, width = 0, dtype_bytes = 0;
  bool vector = false;  // shape (N,): width 1
};

// Opens dataset `name` of the open file `file` (named `file_name` in messages) into `c` and checks
// what HDF5 reports of it (the links to it, its object type, filters, datatype and dims), or returns
// why not. No MPI: hdf5_dataset calls it on every rank, fuzz_hdf5 on a file image.
inline std::string open_dataset(hid_t file, const std::string& file_name, std::string_view name, checked_dataset& c) {
  const std::string path(name);
  const auto refuse = [&](const std::string& what) {
    return fmt::format("kfsdp::io::hdf5_dataset: {}: dataset '{}' {}", file_name, name, what);
  };
  // Each level of a path exists before the next is asked (HDF5 fails on a missing group).
  for (std::size_t slash = 0; slash != std::string::npos;) {
    slash = path.find('/', slash + 1);
    const std::string prefix = path.substr(0, slash);
    if (prefix.empty() || prefix == "/") continue;
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0)
      return fmt::format("kfsdp::io::hdf5_dataset: {}: no dataset '{}', expected one of: {}", file_name, name,
                         fmt::join(root_names(file), ", "));
  }
  // An object HDF5 cannot open is not a group: it says why (a newer file format's message, say).
  const handle object(H5Oopen(file, path.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid())
    return refuse(fmt::format("could not be opened, expected a dataset this HDF5 library can read{}",
                              library_says(error_cause())));
  if (H5Iget_type(object.get()) != H5I_DATASET) return refuse("is a group or a named type, expected a dataset");
  c.dataset = handle(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!c.dataset.valid())
    return refuse(fmt::format("could not be opened{}", library_says(error_cause())));
  if (const std::string filter = missing_filter(c.dataset.get()); !filter.empty())
    return refuse(fmt::format("is compressed with {}, which this HDF5 library ({}.{}.{}) does not have, expected a "
                              "filter it has (gzip, shuffle, ...) or none: rewrite the dataset with one (h5py: "
                              "compression='gzip'), or make the filter's plugin available (HDF5_PLUGIN_PATH)",
                              filter, H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE));
  const handle type(H5Dget_type(c.dataset.get()), H5Tclose);
  c.dtype_bytes = H5Tget_size(type.get());
  if (H5Tget_class(type.get()) != H5T_FLOAT || (c.dtype_bytes != 2 && c.dtype_bytes != 4 && c.dtype_bytes != 8))
    return refuse(fmt::format("has {}, expected floating point (16, 32 or 64-bit)", type_text(type.get())));
  const handle space(H5Dget_space(c.dataset.get()), H5Sclose);
  const int dims = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> shape(std::size_t(std::max(dims, 0)));
  if (dims > 0) (void)H5Sget_simple_extent_dims(space.get(), shape.data(), nullptr);
  if (dims < 1 || dims > 2 || shape[0] == 0 || (dims == 2 && shape[1] == 0))
    return refuse(fmt::format("has shape ({}), expected (N, width) or (N,), N and width > 0", fmt::join(shape, ", ")));
  c.count = std::size_t(shape[0]);
  c.width = dims == 2 ? std::size_t(shape[1]) : 1;
  c.vector = dims == 1;
  return {};
}

}  // namespace hdf5_detail

KFSDP_EXPORT class hdf5_dataset {
 public:
  /// Opens `file` on every rank of `comm` (collective) and checks `features` and `targets`: each
  /// a dataset of shape (N, width) or (N,), floating point, the same N > 0. Throws
  /// std::invalid_argument on every rank, naming the file, the dataset and what was expected.
  hdf5_dataset(const std::filesystem::path& file, std::string_view features, std::string_view targets, MPI_Comm comm,
               hdf5_options options = {})
      : comm_(comm), file_name_(file.string()), options_(options) {
    const hdf5_detail::quiet_errors quiet;
    const MPI_Comm own = comm_.get();
    MPI_Comm_rank(own, &rank_);
    MPI_Comm_size(own, &ranks_);
    if (options_.stats_chunk_rows == 0)
      throw std::invalid_argument(fmt::format(
          "kfsdp::io::hdf5_dataset: {}: options.stats_chunk_rows is 0, expected at least 1", file_name_));

    // Every rank sees the file before any opens it: MPI-IO's open is collective.
    std::string error;
    std::error_code ignored;
    if (!std::filesystem::is_regular_file(file, ignored))
      error = fmt::format("kfsdp::io::hdf5_dataset: '{}' is not a regular file on rank {}, expected an HDF5 file that "
                          "every rank can read",
                          file_name_, rank_);
    else if (H5Fis_hdf5(file_name_.c_str()) <= 0)
      error = fmt::format("kfsdp::io::hdf5_dataset: '{}' is not an HDF5 file (no HDF5 signature), expected one "
                          "written by h5py or the HDF5 library",
                          file_name_);
    hdf5_detail::agree(own, error);

    hdf5_detail::handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_fapl_mpio(access.get(), own, MPI_INFO_NULL);
    file_ = hdf5_detail::handle(H5Fopen(file_name_.c_str(), H5F_ACC_RDONLY, access.get()), H5Fclose);
    if (!file_.valid())
      error = fmt::format("kfsdp::io::hdf5_dataset: '{}' could not be opened with parallel HDF5 on rank {}{}", file_name_,
                          rank_, hdf5_detail::library_says(hdf5_detail::error_cause()));
    hdf5_detail::agree(own, error);

    transfer_ = hdf5_detail::handle(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    if (options_.collective) H5Pset_dxpl_mpio(transfer_.get(), H5FD_MPIO_COLLECTIVE);

    error = open_column(features_, features);
    if (error.empty()) error = open_column(targets_, targets);
    if (error.empty() && targets_.count != features_.count)
      error = fmt::format("kfsdp::io::hdf5_dataset: {}: dataset '{}' has {} rows, expected {}, as '{}' has", file_name_,
                          targets_.name, targets_.count, features_.count, features_.name);
    hdf5_detail::agree(own, error);
  }

  hdf5_dataset(hdf5_dataset&&) = default;
  hdf5_dataset& operator=(hdf5_dataset&&) = delete;
  hdf5_dataset(const hdf5_dataset&) = delete;
  hdf5_dataset& operator=(const hdf5_dataset&) = delete;
  /// Collective: HDF5 closes a file opened with MPI-IO on every rank together.
  ~hdf5_dataset() {
    const hdf5_detail::quiet_errors quiet;
    features_.dataset.reset();
    targets_.dataset.reset();
    transfer_.reset();
    file_.reset();
  }

  [[nodiscard]] std::size_t count() const noexcept { return features_.count; }
  [[nodiscard]] std::size_t in_features() const noexcept { return features_.width; }
  [[nodiscard]] std::size_t out_features() const noexcept { return targets_.width; }
  [[nodiscard]] const std::string& file() const noexcept { return file_name_; }
  /// The bytes of one value as the file stores it (2, 4 or 8), of the features and of the targets.
  [[nodiscard]] std::size_t feature_dtype_bytes() const noexcept { return features_.dtype_bytes; }
  [[nodiscard]] std::size_t target_dtype_bytes() const noexcept { return targets_.dtype_bytes; }
  /// What this rank has read so far (every read: batches, rows and the statistics passes).
  [[nodiscard]] hdf5_reads reads() const noexcept { return reads_; }

  /// The samples of global micro-batch `index`: io::shuffled_micro_batch, as array_dataset's.
  [[nodiscard]] std::vector<std::size_t> micro_batch(std::uint64_t seed, std::size_t index,
                                                     std::size_t global_batch) const {
    if (global_batch == 0)
      throw std::invalid_argument(
          fmt::format("kfsdp::io::hdf5_dataset::micro_batch: {}: global_batch is 0, expected at least 1", file_name_));
    return shuffled_micro_batch(count(), seed, index, global_batch);
  }

  /// Rank `rank`'s contiguous slice (global_batch / world_size samples) of a micro-batch, read from
  /// the file (only those rows), normalised if normalize was called, as device matrices.
  template <class Scalar>
  [[nodiscard]] std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> rank_slice(const std::vector<std::size_t>& samples,
                                                                             std::size_t rank,
                                                                             std::size_t world_size) const {
    const auto mine = rank_share(samples, rank, world_size, "kfsdp::io::hdf5_dataset::rank_slice");
    return read_samples<Scalar>(mine, "rank_slice");
  }

  /// Samples [first, first + count) in order (evaluation), as device matrices; collective, each
  /// rank its own range.
  template <class Scalar>
  [[nodiscard]] std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> rows(std::size_t first, std::size_t count) const {
    std::string error;
    if (first > this->count() || count > this->count() - first)
      error = fmt::format("kfsdp::io::hdf5_dataset::rows: {}: first + count is {} + {} on rank {}, expected at most the "
                          "{} samples",
                          file_name_, first, count, rank_, this->count());
    if (options_.collective) hdf5_detail::agree<std::out_of_range>(comm_.get(), error);
    else if (!error.empty()) throw std::out_of_range(error);
    std::vector<std::size_t> samples(count);
    for (std::size_t r = 0; r < count; ++r) samples[r] = first + r;
    return read_samples<Scalar>(samples, "rows");
  }

  /// Per-column mean and standard deviation (population) of the values in the file, in a streaming
  /// pass: collective, each rank reading chunks of stats_chunk_rows rows, the chunks' sums added in
  /// chunk order, so the result is the same at any world size.
  [[nodiscard]] array_dataset::column_stats feature_stats() const { return stats(features_); }
  [[nodiscard]] array_dataset::column_stats target_stats() const { return stats(targets_); }

  /// Values read from now on become (value − mean) / stddev (a zero stddev only centres), as
  /// array_dataset::normalize does; the file is not changed.
  void normalize(const array_dataset::column_stats& features, const array_dataset::column_stats& targets) {
    check_stats(features_, features);
    check_stats(targets_, targets);
    features_.stats = features;
    targets_.stats = targets;
    normalized_ = true;
  }
  void normalize(const array_dataset::normalization& stats) { normalize(stats.features, stats.targets); }
  /// Normalises by this file's own statistics (collective) and returns them as applied (a zero stddev
  /// as 1: array_dataset::as_applied), for a test set to take.
  array_dataset::normalization normalize() {
    array_dataset::normalization stats = array_dataset::as_applied({feature_stats(), target_stats()});
    normalize(stats);
    return stats;
  }

 private:
  struct column : hdf5_detail::checked_dataset {
    std::string name;
    array_dataset::column_stats stats{};
  };

  // Opens dataset `name` into `c`, or returns why not.
  std::string open_column(column& c, std::string_view name) {
    c.name = std::string(name);
    if (std::string bad = hdf5_detail::open_dataset(file_.get(), file_name_, name, c); !bad.empty()) return bad;
    // What the reader sizes from the shape before reading a row (the statistics' sums of each chunk of
    // rows; a shuffle's sample indices), in doubles: a product past 2^64 cannot wrap into a small one.
    const double rows = double(c.count), width = double(c.width);
    try {
      require_host_memory((rows / double(options_.stats_chunk_rows) + 1) * width * 8 + rows * 8,
                          fmt::format("a dataset of shape ({}{})", c.count, c.vector ? "" : fmt::format(", {}", c.width)));
    } catch (const std::invalid_argument& too_big) {
      return fmt::format("kfsdp::io::hdf5_dataset: {}: dataset '{}' is too large: {}", file_name_, name, too_big.what());
    }
    return {};
  }

  // The rows `runs` ([first, first + length) each, ascending, disjoint) of `c`, as doubles, row-major,
  // in file order: one selection, one read (collective: an empty selection is still a call).
  std::vector<double> read_runs(const column& c, const std::vector<std::pair<std::size_t, std::size_t>>& runs,
                                std::size_t total) const {
    std::vector<double> values(total * c.width);
    const hdf5_detail::handle file_space(H5Dget_space(c.dataset.get()), H5Sclose);
    const hsize_t memory_extent[1] = {hsize_t(std::max<std::size_t>(values.size(), 1))};
    const hdf5_detail::handle memory_space(H5Screate_simple(1, memory_extent, nullptr), H5Sclose);
    herr_t status = H5Sselect_none(file_space.get());
    // HDF5 1.10 builds a union of many row blocks in time growing with the blocks (7 ms for a
    // shuffled 1,024 rows of 16); the same values as a point list select and read several times
    // faster (bench_hdf5). Wide rows keep the blocks: points cost 16 bytes a value.
    const bool as_points = runs.size() > 1 && c.width <= 256;
    if (as_points && status >= 0) {
      const std::size_t per_point = c.vector ? 1 : 2;
      std::vector<hsize_t> points;
      points.reserve(total * c.width * per_point);
      for (const auto& [first, length] : runs)
        for (std::size_t r = first; r < first + length; ++r)
          for (std::size_t k = 0; k < c.width; ++k) {
            points.push_back(hsize_t(r));
            if (!c.vector) points.push_back(hsize_t(k));
          }
      status = H5Sselect_elements(file_space.get(), H5S_SELECT_SET, points.size() / per_point, points.data());
    }
    for (std::size_t k = 0; !as_points && k < runs.size() && status >= 0; ++k) {
      const hsize_t start[2] = {hsize_t(runs[k].first), 0}, block[2] = {hsize_t(runs[k].second), hsize_t(c.width)};
      status = H5Sselect_hyperslab(file_space.get(), k == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, block,
                                   nullptr);
    }
    if (total == 0 && status >= 0) status = H5Sselect_none(memory_space.get());
    if (status >= 0)
      status = H5Dread(c.dataset.get(), H5T_NATIVE_DOUBLE, memory_space.get(), file_space.get(), transfer_.get(),
                       values.empty() ? nullptr : values.data());
    const std::string error =
        status < 0 ? fmt::format("kfsdp::io::hdf5_dataset: {}: reading {} rows of dataset '{}' failed on rank {}{}",
                                 file_name_, total, c.name, rank_, hdf5_detail::library_says(hdf5_detail::error_cause()))
                   : std::string();
    if (options_.collective) hdf5_detail::agree<std::runtime_error>(comm_.get(), error);
    else if (!error.empty()) throw std::runtime_error(error);
    reads_.rows += total;
    reads_.bytes += total * c.width * c.dtype_bytes;
    return values;
  }

  // Features and targets of `samples` (any order, repeats allowed), each distinct row read once.
  template <class Scalar>
  std::pair<nn::matrix<Scalar>, nn::matrix<Scalar>> read_samples(const std::vector<std::size_t>& samples,
                                                                  std::string_view who) const {
    const hdf5_detail::quiet_errors quiet;
    std::string error;
    for (const std::size_t s : samples)
      if (s >= count()) {
        error = fmt::format("kfsdp::io::hdf5_dataset::{}: {}: sample {} on rank {}, expected less than the {} samples",
                            who, file_name_, s, rank_, count());
        break;
      }
    if (options_.collective) hdf5_detail::agree<std::out_of_range>(comm_.get(), error);
    else if (!error.empty()) throw std::out_of_range(error);
    std::vector<std::size_t> sorted = samples;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    std::vector<std::pair<std::size_t, std::size_t>> runs;  // consecutive rows, one block each
    for (const std::size_t s : sorted)
      if (!runs.empty() && runs.back().first + runs.back().second == s) ++runs.back().second;
      else runs.emplace_back(s, 1);
    const std::vector<double> x = read_runs(features_, runs, sorted.size()), y = read_runs(targets_, runs, sorted.size());
    return {to_device<Scalar>(features_, x, sorted, samples, "hdf5_dataset::features"),
            to_device<Scalar>(targets_, y, sorted, samples, "hdf5_dataset::targets")};
  }

  // Row r of the result is sample samples[r], found among `sorted` (the order read), normalised.
  template <class Scalar>
  nn::matrix<Scalar> to_device(const column& c, const std::vector<double>& values, const std::vector<std::size_t>& sorted,
                               const std::vector<std::size_t>& samples, const char* label) const {
    nn::matrix<Scalar> result(std::string(label), samples.size(), c.width);
    auto host = Kokkos::create_mirror_view(result);
    for (std::size_t r = 0; r < samples.size(); ++r) {
      const std::size_t at = std::size_t(std::lower_bound(sorted.begin(), sorted.end(), samples[r]) - sorted.begin());
      for (std::size_t k = 0; k < c.width; ++k) {
        double value = values[at * c.width + k];
        if (normalized_) {  // as array_dataset::normalize computes it
          const double stddev = c.stats.stddev[k];
          value = (value - c.stats.mean[k]) / (stddev > 0.0 ? stddev : 1.0);
        }
        host(r, k) = static_cast<Scalar>(value);
      }
    }
    Kokkos::deep_copy(result, host);
    return result;
  }

  // Two passes (mean, then squared deviations: no cancellation for large means) over chunks of
  // rows, chunk k read by rank k mod ranks; per-chunk sums all-reduced (one rank's value and zeros:
  // exact) and added in chunk order.
  array_dataset::column_stats stats(const column& c) const {
    const hdf5_detail::quiet_errors quiet;
    const std::size_t chunk = options_.stats_chunk_rows, chunks = (c.count + chunk - 1) / chunk,
                      ranks = std::size_t(ranks_), rounds = (chunks + ranks - 1) / ranks;
    array_dataset::column_stats s{std::vector<double>(c.width, 0.0), std::vector<double>(c.width, 0.0)};
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<double> sums(chunks * c.width, 0.0);
      for (std::size_t round = 0; round < rounds; ++round) {
        const std::size_t k = round * ranks + std::size_t(rank_);
        const std::size_t first = std::min(k * chunk, c.count), rows = std::min(first + chunk, c.count) - first;
        const std::vector<double> values =
            read_runs(c, rows > 0 ? std::vector<std::pair<std::size_t, std::size_t>>{{first, rows}}
                                  : std::vector<std::pair<std::size_t, std::size_t>>{},
                      rows);
        for (std::size_t v = 0; v < values.size(); ++v) {
          const std::size_t column_index = v % c.width;
          const double d = pass == 0 ? values[v] : values[v] - s.mean[column_index];
          sums[k * c.width + column_index] += pass == 0 ? d : d * d;
        }
      }
      if (!sums.empty())
        MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_DOUBLE, MPI_SUM, comm_.get());
      std::vector<double>& out = pass == 0 ? s.mean : s.stddev;
      for (std::size_t k = 0; k < chunks; ++k)
        for (std::size_t w = 0; w < c.width; ++w) out[w] += sums[k * c.width + w];
      for (double& value : out)
        value = pass == 0 ? value / double(c.count) : std::sqrt(value / double(c.count));
    }
    return s;
  }

  void check_stats(const column& c, const array_dataset::column_stats& s) const {
    if (s.mean.size() != c.width || s.stddev.size() != c.width)
      throw std::invalid_argument(fmt::format(
          "kfsdp::io::hdf5_dataset::normalize: {}: statistics of '{}' have {} means and {} stddevs, expected its width "
          "{} each",
          file_name_, c.name, s.mean.size(), s.stddev.size(), c.width));
    for (std::size_t k = 0; k < c.width; ++k)
      if (!(s.stddev[k] >= 0.0) || !std::isfinite(s.stddev[k]) || !std::isfinite(s.mean[k]))
        throw std::invalid_argument(fmt::format(
            "kfsdp::io::hdf5_dataset::normalize: {}: '{}' column {} has mean {} and stddev {}, expected finite and "
            "stddev >= 0",
            file_name_, c.name, k, s.mean[k], s.stddev[k]));
  }

  hdf5_detail::owned_comm comm_;  // first: freed after the file is closed
  std::string file_name_;
  hdf5_options options_;
  int rank_ = 0, ranks_ = 1;
  hdf5_detail::handle file_, transfer_;
  column features_, targets_;
  bool normalized_ = false;
  mutable hdf5_reads reads_{};
};

static_assert(dataset<hdf5_dataset>);

}  // namespace kfsdp::io
