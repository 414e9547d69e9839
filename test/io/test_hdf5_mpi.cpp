// kfsdp::io::hdf5_dataset (io/data/hdf5.hpp): files written with the HDF5 C API here and by h5py
// (test/io/hdf5/make_fixtures.py) read as the array_dataset of the same values, each rank reading
// only its rows (counted in bytes); fit from either at any world size gives the losses of the
// array_dataset on one rank; the streaming statistics; refusals naming the file and the dataset,
// on every rank alike (a file missing on one rank included). Run with 1, 2 and 3 ranks.
#include <doctest/doctest.h>

#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <kfsdp/io/data/hdf5.hpp>
#include <kfsdp/session.hpp>
#include <kfsdp/train/fit.hpp>

#include "../support/messages.hpp"

namespace {

using kfsdp::io::array_dataset;
using kfsdp::io::hdf5_dataset;
using kfsdp::test::error_message;
using mlp = kfsdp::sequential<"", kfsdp::linear<"fc1", 3, 16>, kfsdp::gelu<>, kfsdp::linear<"fc2", 16, 1>,
                              kfsdp::mse<>>;

constexpr std::size_t global_batch = 12;  // splits over 1, 2 and 3 ranks
const std::string fixtures = KFSDP_HDF5_FIXTURES;

// A file every rank names alike (from rank 0's process id).
std::filesystem::path shared_path(kfsdp::comm::mpi& world, const std::string& name) {
  std::uint64_t id[1] = {std::uint64_t(::getpid())};
  kfsdp::comm::broadcast(world, std::span<std::uint64_t>(id), 0);
  return std::filesystem::temp_directory_path() / fmt::format("kfsdp-test-hdf5-{}-{}", id[0], name);
}

// Writes dataset `name` of `shape` with the HDF5 C API, stored as `file_type`, from doubles.
void write_dataset(hid_t file, const char* name, const std::vector<hsize_t>& shape, hid_t file_type,
                   const std::vector<double>& values) {
  const hid_t space = H5Screate_simple(int(shape.size()), shape.data(), nullptr);
  const hid_t dataset = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(dataset >= 0);
  REQUIRE(H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  H5Dclose(dataset);
  H5Sclose(space);
}

// y = sin(x0) + x1·x2 on `count` samples of 3 features.
struct regression {
  std::vector<double> x, y;
};
regression samples(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  regression r{std::vector<double>(count * 3), std::vector<double>(count)};
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < 3; ++j) r.x[i * 3 + j] = u(rng);
    r.y[i] = std::sin(r.x[i * 3]) + r.x[i * 3 + 1] * r.x[i * 3 + 2];
  }
  return r;
}

std::vector<double> wide_values() {
  std::vector<double> values(60 * 300);
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = double(k) / 3.0;
  return values;
}

std::vector<double> rounded_to_float(std::vector<double> values) {
  for (double& v : values) v = double(float(v));
  return values;
}

// Rank 0 writes the C API file: "x" f64 [60, 3], "y" f64 [60], "x32" f32 [60, 3], "y2" f64 [60, 1],
// "ints" i32 [60, 3], "flat" f64 [180], "cube" f64 [60, 3, 1] and "wide" f64 [60, 300] (rows read as
// blocks, not points: wide_values); every rank returns once it is closed.
std::filesystem::path write_c_api_file(kfsdp::comm::mpi& world, const regression& data) {
  const auto path = shared_path(world, "c-api.h5");
  if (world.rank() == 0) {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(file >= 0);
    write_dataset(file, "x", {60, 3}, H5T_IEEE_F64LE, data.x);
    write_dataset(file, "y", {60}, H5T_IEEE_F64LE, data.y);
    write_dataset(file, "x32", {60, 3}, H5T_IEEE_F32LE, data.x);
    write_dataset(file, "y2", {60, 1}, H5T_IEEE_F64BE, data.y);
    write_dataset(file, "ints", {60, 3}, H5T_STD_I32LE, std::vector<double>(180, 1.0));
    write_dataset(file, "flat", {180}, H5T_IEEE_F64LE, data.x);
    write_dataset(file, "cube", {60, 3, 1}, H5T_IEEE_F64LE, data.x);
    write_dataset(file, "wide", {60, 300}, H5T_IEEE_F64LE, wide_values());
    H5Fclose(file);
  }
  world.barrier();
  return path;
}

template <class Scalar>
std::vector<double> host(const kfsdp::nn::matrix<Scalar>& m) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  std::vector<double> values;
  for (std::size_t r = 0; r < h.extent(0); ++r)
    for (std::size_t c = 0; c < h.extent(1); ++c) values.push_back(double(h(r, c)));
  return values;
}

// The same batches, rows and values from both datasets, bit for bit.
void check_same_batches(const hdf5_dataset& file, const array_dataset& memory, std::size_t rank, std::size_t ranks) {
  REQUIRE(file.count() == memory.count());
  REQUIRE(file.in_features() == memory.in_features());
  REQUIRE(file.out_features() == memory.out_features());
  for (std::size_t index = 0; index < 7; ++index) {
    CAPTURE(index);
    const auto samples = file.micro_batch(3, index, global_batch);
    CHECK(samples == memory.micro_batch(3, index, global_batch));
    const auto [fx, fy] = file.rank_slice<double>(samples, rank, ranks);
    const auto [mx, my] = memory.rank_slice<double>(samples, rank, ranks);
    CHECK(host(fx) == host(mx));
    CHECK(host(fy) == host(my));
    const auto [fx32, fy32] = file.rank_slice<float>(samples, rank, ranks);
    const auto [mx32, my32] = memory.rank_slice<float>(samples, rank, ranks);
    CHECK(host(fx32) == host(mx32));
    CHECK(host(fy32) == host(my32));
  }
  const std::size_t first = memory.count() * rank / ranks, last = memory.count() * (rank + 1) / ranks;
  const auto [fx, fy] = file.rows<double>(first, last - first);
  const auto [mx, my] = memory.rows<double>(first, last - first);
  CHECK(host(fx) == host(mx));
  CHECK(host(fy) == host(my));
}

// fit's training losses over `data`, from its metrics file, and the final loss.
template <class Data>
std::vector<double> fit_losses(kfsdp::session& job, const Data& data, const std::filesystem::path& metrics,
                               kfsdp::io::dataset_ref eval = nullptr) {
  kfsdp::trainer<mlp, double> model(mlp{}, job.shard_group(),
                                    job.fsdp({.sharding_strategy = kfsdp::sharding_strategy::zero3}));
  model.initialize(7);
  kfsdp::optim::adamw<double> adam(model, {.weight_decay = 0.01});
  (void)kfsdp::fit(model, adam, kfsdp::optim::cosine(1e-2, 40), data,
                   {.steps = 8, .global_batch = global_batch, .seed = 3, .eval_data = eval, .log_every = 100,
                    .metrics_file = metrics});
  job.world().barrier();  // rank 0's file is closed
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("\"loss\": ");
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 8)));
  }
  return losses;
}

void check_close(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    CAPTURE(k);
    CHECK(std::abs(a[k] - b[k]) <= 1e-10 * std::abs(b[k]));
  }
}

}  // namespace

TEST_CASE("hdf5: a file of the C API reads as the array_dataset of its values; each rank reads only its rows") {
  kfsdp::session job;
  const std::size_t rank = std::size_t(job.rank()), ranks = std::size_t(job.world().size());
  const regression data = samples(60, 1);
  const auto path = write_c_api_file(job.world(), data);
  {
    const hdf5_dataset file(path, "x", "y", job.world().native());
    CHECK(file.feature_dtype_bytes() == 8);
    check_same_batches(file, array_dataset(data.x, 3, data.y, 1), rank, ranks);
    // 7 batches (no sample twice in one: 60 is 5 batches), each read in f64 and f32, of this rank's
    // 12 / ranks samples; then its share of the 60 rows.
    const std::size_t local = global_batch / ranks, share = 60 * (rank + 1) / ranks - 60 * rank / ranks;
    const std::size_t expected_rows = 7 * 2 * local + share;
    CHECK(file.reads().rows == 2 * expected_rows);  // features and targets
    CHECK(file.reads().bytes == expected_rows * (3 * 8 + 1 * 8));
  }
  {
    const hdf5_dataset file(path, "x32", "y2", job.world().native());  // f32 features, big-endian f64 targets
    CHECK(file.feature_dtype_bytes() == 4);
    check_same_batches(file, array_dataset(rounded_to_float(data.x), 3, data.y, 1), rank, ranks);
  }
  {
    const hdf5_dataset file(path, "wide", "y", job.world().native());  // a union of row blocks
    check_same_batches(file, array_dataset(wide_values(), 300, data.y, 1), rank, ranks);
  }
  {
    const hdf5_dataset file(path, "flat", "flat", job.world().native());  // shape (N,): width 1
    CHECK(file.count() == 180);
    CHECK(file.in_features() == 1);
    CHECK(file.out_features() == 1);
  }
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove(path);
}

TEST_CASE("hdf5: fit from a C API file at any world size has the losses of the array_dataset on one rank") {
  kfsdp::session job;
  const regression data = samples(60, 1);
  const auto path = write_c_api_file(job.world(), data);
  const auto metrics = shared_path(job.world(), "fit.jsonl");
  const std::size_t ranks = std::size_t(job.world().size());
  std::vector<double> from_file;
  {
    const hdf5_dataset file(path, "x", "y", job.world().native());
    from_file = fit_losses(job, file, metrics);
    // 8 steps, each this rank's 12 / ranks rows of 3 + 1 doubles: nothing else read.
    CHECK(file.reads().bytes == 8 * (global_batch / ranks) * (3 + 1) * 8);
    CHECK(file.reads().rows == 2 * 8 * (global_batch / ranks));
  }
  std::vector<double> alone;
  {
    kfsdp::session one({.ranks = MPI_COMM_SELF});  // every rank, a job of one rank, from memory
    alone = fit_losses(one, array_dataset(data.x, 3, data.y, 1), metrics.string() + std::to_string(job.rank()));
  }
  REQUIRE(from_file.size() == 8);
  check_close(from_file, alone);
  CHECK(from_file.back() < from_file.front());
  // Evaluation from a file too (eval_data: any dataset).
  {
    const hdf5_dataset file(path, "x32", "y", job.world().native());
    const hdf5_dataset test(path, "x", "y", job.world().native());
    (void)fit_losses(job, file, metrics, &test);
    CHECK(test.reads().rows == 2 * (60 * (job.rank() + 1) / int(ranks) - 60 * job.rank() / int(ranks)));
  }
  job.world().barrier();
  if (job.is_root()) {
    std::filesystem::remove(path);
    std::filesystem::remove(metrics);
  }
  std::filesystem::remove(metrics.string() + std::to_string(job.rank()));
}

TEST_CASE("hdf5: h5py's file: f32, f16, big-endian f64, a group's datasets; fit from it at any world size") {
  kfsdp::session job;
  const std::string file = fixtures + "/data.h5";
  {
    const hdf5_dataset read(file, "x", "y", MPI_COMM_SELF);
    const auto [x, y] = read.rows<double>(0, 10);
    std::vector<double> expected_x, expected_y;
    for (int k = 0; k < 30; ++k) expected_x.push_back(double(float(k / 7.0)));
    for (int k = 0; k < 10; ++k) expected_y.push_back(std::sin(double(k)));
    CHECK(host(x) == expected_x);
    CHECK(host(y) == expected_y);
  }
  {
    const hdf5_dataset read(file, "half", "big_endian", MPI_COMM_SELF);
    CHECK(read.feature_dtype_bytes() == 2);
    const auto [x, y] = read.rows<double>(9, 1);
    CHECK(host(x) == std::vector<double>{1.0, -0.5, 65504.0});
    CHECK(host(y) == std::vector<double>{18 - 2.5, 19 - 2.5});
  }
  // The training set: every rank's own copy in memory (read alone), against the shared file.
  const hdf5_dataset alone_file(file, "train/x", "train/y", MPI_COMM_SELF);
  const auto [x, y] = alone_file.rows<double>(0, alone_file.count());
  const array_dataset memory(host(x), 3, host(y), 1);
  const hdf5_dataset shared(file, "/train/x", "/train/y", job.world().native());
  check_same_batches(shared, memory, std::size_t(job.rank()), std::size_t(job.world().size()));
  const auto metrics = shared_path(job.world(), "h5py.jsonl");
  const std::vector<double> from_file = fit_losses(job, shared, metrics);
  std::vector<double> alone;
  {
    kfsdp::session one({.ranks = MPI_COMM_SELF});
    alone = fit_losses(one, memory, metrics.string() + std::to_string(job.rank()));
  }
  check_close(from_file, alone);
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove(metrics);
  std::filesystem::remove(metrics.string() + std::to_string(job.rank()));
}

TEST_CASE("hdf5: statistics in a streaming pass equal array_dataset's; normalised batches alike") {
  kfsdp::session job;
  const regression data = samples(60, 1);
  const auto path = write_c_api_file(job.world(), data);
  array_dataset memory(data.x, 3, data.y, 1);
  hdf5_dataset one_chunk(path, "x", "y", job.world().native());
  // One chunk: the same sums in the same order as array_dataset's, bit for bit.
  const auto stats = one_chunk.normalize();
  CHECK(memory.normalize().features.mean == stats.features.mean);
  CHECK(memory.feature_stats().mean.size() == 3);
  check_same_batches(one_chunk, memory, std::size_t(job.rank()), std::size_t(job.world().size()));
  // Chunks of 7 rows over the ranks: the same at any world size (against one rank), close to the above.
  const hdf5_dataset chunked(path, "x", "y", job.world().native(), {.stats_chunk_rows = 7});
  const hdf5_dataset chunked_alone(path, "x", "y", MPI_COMM_SELF, {.stats_chunk_rows = 7});
  const auto world_stats = chunked.feature_stats(), alone_stats = chunked_alone.feature_stats();
  CHECK(world_stats.mean == alone_stats.mean);
  CHECK(world_stats.stddev == alone_stats.stddev);
  CHECK(chunked.target_stats().stddev == chunked_alone.target_stats().stddev);
  for (std::size_t c = 0; c < 3; ++c) {
    CHECK(world_stats.mean[c] == doctest::Approx(stats.features.mean[c]).epsilon(1e-12));
    CHECK(world_stats.stddev[c] == doctest::Approx(stats.features.stddev[c]).epsilon(1e-12));
  }
  CHECK(error_message([&] { one_chunk.normalize({{0.0}, {1.0}}, stats.targets); }) ==
        fmt::format("kfsdp::io::hdf5_dataset::normalize: {}: statistics of 'x' have 1 means and 1 stddevs, expected "
                    "its width 3 each",
                    path.string()));
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove(path);
}

TEST_CASE("hdf5: a file HDF5 cannot decode or a filter it lacks is refused naming the real cause") {
  kfsdp::session job;
  const MPI_Comm world = job.world().native();
  const auto open = [&](const std::string& file) {
    return error_message([&] { const hdf5_dataset refused(file, "x", "y", world); });
  };
  // h5py's libver="latest" with a filter: an older HDF5 (1.10) cannot decode the dataset's layout message. It was
  // refused as "a group or a named type"; HDF5's own innermost error now says why.
  const std::string latest = fixtures + "/latest_filtered.h5", lzf = fixtures + "/lzf.h5";
  const std::string decoded = open(latest);
  CAPTURE(decoded);
  if (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10)
    CHECK(decoded == "kfsdp::io::hdf5_dataset: " + latest + ": dataset 'x' could not be opened, expected a dataset this "
                     "HDF5 library can read (HDF5 " + fmt::format("{}.{}.{}", H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE) +
                     " says: H5O__layout_decode: bad version number for layout message)");
  if (!decoded.empty()) {  // a newer HDF5 may read it
    CHECK(decoded.find("group or a named type") == std::string::npos);
    CHECK(decoded.find(" says: ") != std::string::npos);
  }
  // An lzf-compressed dataset (h5py's own filter): named at open, not "reading ... failed" at the first batch.
  const std::string filtered = open(lzf);
  CAPTURE(filtered);
  if (H5Zfilter_avail(32000) <= 0)  // no lzf plugin installed
    CHECK(filtered.starts_with("kfsdp::io::hdf5_dataset: " + lzf + ": dataset 'x' is compressed with filter 32000 "
                               "('lzf'), which this HDF5 library ("));
}

TEST_CASE("hdf5: refusals name the file and the dataset, on every rank alike") {
  kfsdp::session job;
  const MPI_Comm world = job.world().native();
  const std::string file = fixtures + "/data.h5";
  const auto open = [&](const char* features, const char* targets) {
    return error_message([&] { const hdf5_dataset refused(file, features, targets, world); });
  };
  const std::string prefix = "kfsdp::io::hdf5_dataset: " + file + ": ";
  const std::string names = "big_endian, cube, half, ids, names, short, surrogate, train, x, y, y2";
  CHECK(open("z", "y") == prefix + "no dataset 'z', expected one of: " + names);
  CHECK(open("train/z", "y") == prefix + "no dataset 'train/z', expected one of: " + names);
  CHECK(open("nothere/x", "y").starts_with(prefix + "no dataset 'nothere/x'"));
  CHECK(open("ids", "y") == prefix + "dataset 'ids' has an integer type (8 bytes), expected floating point (16, 32 or "
                                     "64-bit)");
  CHECK(open("x", "names") == prefix + "dataset 'names' has a string type, expected floating point (16, 32 or 64-bit)");
  CHECK(open("cube", "y") == prefix + "dataset 'cube' has shape (10, 2, 2), expected (N, width) or (N,), N and width > 0");
  CHECK(open("train", "y") == prefix + "dataset 'train' is a group or a named type, expected a dataset");
  CHECK(open("x", "short") == prefix + "dataset 'short' has 9 rows, expected 10, as 'x' has");

  // A file that one rank cannot see (rank 1's name is another): every rank throws rank 1's message.
  const auto path = shared_path(job.world(), "present.h5");
  if (job.is_root()) {
    const hid_t created = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    write_dataset(created, "x", {4, 1}, H5T_IEEE_F64LE, {1, 2, 3, 4});
    H5Fclose(created);
  }
  job.world().barrier();
  const std::string mine = job.rank() == 1 ? path.string() + ".missing" : path.string();
  const std::string missing = error_message([&] { const hdf5_dataset refused(mine, "x", "x", world); });
  if (job.world().size() > 1)
    CHECK(missing == fmt::format("kfsdp::io::hdf5_dataset: '{}.missing' is not a regular file on rank 1, expected an "
                                 "HDF5 file that every rank can read",
                                 path.string()));
  else
    CHECK(missing.empty());
  // Not an HDF5 file.
  const std::string text = fixtures + "/make_fixtures.py";
  CHECK(error_message([&] { const hdf5_dataset refused(text, "x", "y", world); }) ==
        fmt::format("kfsdp::io::hdf5_dataset: '{}' is not an HDF5 file (no HDF5 signature), expected one written by "
                    "h5py or the HDF5 library",
                    text));
  // Rows past the end on one rank: every rank throws (no rank waits in the collective read).
  {
    const hdf5_dataset small(path, "x", "x", world);
    const std::size_t first = job.rank() == job.world().size() - 1 ? 3 : 0;
    const std::string past = error_message<std::out_of_range>([&] { (void)small.rows<double>(first, 2); });
    CHECK(past == fmt::format("kfsdp::io::hdf5_dataset::rows: {}: first + count is 3 + 2 on rank {}, expected at most "
                              "the 4 samples",
                              path.string(), job.world().size() - 1));
    const auto [x, y] = small.rows<double>(std::size_t(job.rank()) % 4, 1);  // still usable after
    CHECK(host(x) == std::vector<double>{double(job.rank() % 4 + 1)});
  }
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove(path);
}

TEST_CASE("hdf5: a shape past memory is refused with its figures before anything is sized from it") {
  kfsdp::session job;
  // A chunked dataset of 2^62 rows none of which is written: a small file, a shape no rank could index.
  const auto path = shared_path(job.world(), "huge.h5");
  if (job.is_root()) {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[2] = {hsize_t(1) << 62, 6}, chunk[2] = {1024, 6};
    const hid_t space = H5Screate_simple(2, dims, nullptr), properties = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(properties, 2, chunk);
    H5Dclose(H5Dcreate2(file, "x", H5T_IEEE_F64LE, space, H5P_DEFAULT, properties, H5P_DEFAULT));
    H5Pclose(properties);
    H5Sclose(space);
    H5Fclose(file);
  }
  job.world().barrier();
  const std::string refused = error_message([&] { const hdf5_dataset huge(path, "x", "x", job.world().native()); });
  CHECK(refused.starts_with(fmt::format("kfsdp::io::hdf5_dataset: {}: dataset 'x' is too large: a dataset of shape "
                                        "(4611686018427387904, 6) does not fit: it needs ",
                                        path.string())));
  CHECK(refused.find("of memory is available to each of the") != std::string::npos);
  job.world().barrier();
  if (job.is_root()) std::filesystem::remove(path);
}
