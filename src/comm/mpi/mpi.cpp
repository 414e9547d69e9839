// The parts of the MPI backend (include/kfsdp/comm/mpi/) that are not templates, compiled once into
// kfsdp_mpi: the environment's defaults, the descriptions of calls and errors, the 16-bit datatype,
// the communicator's construction, splits, barrier and call check, MPI's start and end, and
// run_or_abort's verdict.

#include <kfsdp/comm/mpi/mpi.hpp>

#include <mpi.h>
#if defined(__linux__)
#include <sched.h>
#endif
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kfsdp/meta/parse.hpp>

namespace kfsdp::comm {

namespace detail {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

mpi_error::mpi_error(std::string_view function, std::string_view mpi_call, int code)
    : std::runtime_error(fmt::format("{}: {} failed: {} (MPI error code {})", function, mpi_call,
                                     mpi_error_text(code), code)),
      code_(code) {}

bool node_oversubscribed(MPI_Comm node) {
  constexpr std::string_view function = "kfsdp::comm::mpi (the node's ranks and CPUs)";
  int ranks = 1;
  check_mpi(MPI_Comm_size(node, &ranks), function, "MPI_Comm_size");
#if defined(__linux__)
  cpu_set_t cpus;  // the CPUs this rank may run on, then those any of the node's ranks may
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) CPU_ZERO(&cpus);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &cpus, static_cast<int>(sizeof cpus), MPI_BYTE, MPI_BOR, node), function,
            "MPI_Allreduce");
  return oversubscribed(ranks, CPU_COUNT(&cpus));
#else
  return oversubscribed(ranks, 0);  // nothing to count the CPUs with: yield, the safe side
#endif
}

void throw_timeout(std::string_view function, std::chrono::duration<double> limit, int rank, int size) {
  throw collective_timeout(fmt::format(
      "{}: not complete after {} s (mpi_options::timeout) on rank {} of {}: another rank "
      "has not called it, or called another collective; this communicator must not be used "
      "again",
      function, limit.count(), rank, size));
}

void check_setup(int code, std::string_view mpi_call) {
  if (code != MPI_SUCCESS) {
    throw std::runtime_error(fmt::format("kfsdp::comm::mpi: {} failed: {} (MPI error code {})",
                                         mpi_call, mpi_error_text(code), code));
  }
}

MPI_Datatype two_byte_datatype() {
  static const MPI_Datatype type = [] {
    MPI_Datatype contiguous = MPI_DATATYPE_NULL;
    check_setup(MPI_Type_contiguous(2, MPI_BYTE, &contiguous), "MPI_Type_contiguous");
    check_setup(MPI_Type_commit(&contiguous), "MPI_Type_commit");
    return contiguous;
  }();
  return type;
}

bool mpi_reads_device_memory() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

std::string describe(const collective_call& call) {
  constexpr std::string_view names[] = {"all_gather", "reduce_scatter_sum", "broadcast",
                                        "all_reduce_sum", "all_reduce_max", "all_reduce_min",
                                        "barrier", "all_gather_parts", "reduce_scatter_parts", "all_to_all",
                                        "all_gather_parts (in shared memory)"};
  const std::string_view name = names[static_cast<std::size_t>(call.kind)];
  if (call.kind == collective_kind::barrier) return fmt::format("{}()", name);
  const std::uint64_t tag = call.element_bytes & (half_tag_bf16 | half_tag_f16);
  const std::string elements = fmt::format("{} elements of {} bytes{}", call.count, call.element_bytes & 0xff,
                                           tag == half_tag_bf16 ? " (bf16)" : tag == half_tag_f16 ? " (f16)" : "");
  if (call.kind == collective_kind::broadcast)
    return fmt::format("{}({}, root {})", name, elements, call.root);
  if (call.kind == collective_kind::all_gather_parts || call.kind == collective_kind::reduce_scatter_parts ||
      call.kind == collective_kind::all_gather_parts_in_place)
    return fmt::format("{}({} per rank in {} parts)", name, elements, call.root);
  const bool per_rank = call.kind == collective_kind::all_gather ||
                        call.kind == collective_kind::reduce_scatter_sum || call.kind == collective_kind::all_to_all;
  return fmt::format("{}({}{})", name, elements, per_rank ? " per rank" : "");
}

std::string describe_calls(std::span<const collective_call> by_rank) {
  std::vector<std::pair<collective_call, std::vector<int>>> distinct;
  for (std::size_t rank = 0; rank < by_rank.size(); ++rank) {
    auto same = std::find_if(distinct.begin(), distinct.end(),
                             [&](const auto& seen) { return seen.first == by_rank[rank]; });
    if (same == distinct.end()) same = distinct.insert(distinct.end(), {by_rank[rank], {}});
    same->second.push_back(static_cast<int>(rank));
  }
  std::string text;
  for (const auto& [call, ranks] : distinct)
    text += fmt::format("{}{} on rank{} {}", text.empty() ? "" : "; ", describe(call),
                        ranks.size() > 1 ? "s" : "", fmt::join(ranks, ", "));
  return text;
}

bool switch_from_environment(const char* name, bool when_unset) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return when_unset;
  return parse_switch(value, name);
}

void check_collective_timeout(std::chrono::duration<double> timeout, std::string_view what) {
  const double seconds = timeout.count();
  if (seconds == 0 || (seconds >= collective_timeout_least.count() && seconds <= collective_timeout_most.count()))
    return;
  throw std::invalid_argument(fmt::format("{} is {:g} s, expected 0 (no timeout) or from {:g} to {:g} s", what, seconds,
                                          collective_timeout_least.count(), collective_timeout_most.count()));
}

std::chrono::duration<double> default_collective_timeout() {
  constexpr const char* name = "KFSDP_COLLECTIVE_TIMEOUT";
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return collective_timeout_default;
  try {
    const std::chrono::duration<double> timeout(parse_real(value, name, 0));
    check_collective_timeout(timeout, name);
    return timeout;
  } catch (const std::invalid_argument&) {  // one message for text and for a value out of range
    throw std::invalid_argument(fmt::format("{} is '{}', expected 0 (no timeout) or seconds from {:g} to {:g}", name,
                                            value, collective_timeout_least.count(), collective_timeout_most.count()));
  }
}

int agree_or_abort(mpi& world, MPI_Comm verdicts, int status, const std::string& message,
                   std::chrono::duration<double> grace, bool timed_out) {
  if (timed_out) {
    std::fprintf(stderr, "error on rank %d of %d: %s\n(a collective timed out: aborting the job)\n", world.rank(),
                 world.size(), message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int failed = message.empty() ? 0 : 1, failures = 0;
  MPI_Request handle = MPI_REQUEST_NULL;
  MPI_Iallreduce(&failed, &failures, 1, MPI_INT, MPI_SUM, verdicts, &handle);
  int complete = 0;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::nanoseconds>(grace);
  if (!failed) {
    MPI_Wait(&handle, MPI_STATUS_IGNORE);  // a healthy rank waits for the others, however long
    complete = 1;
  }
  while (!complete && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&handle, &complete, MPI_STATUS_IGNORE);
    if (!complete) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!complete) {
    std::fprintf(stderr,
                 "error on rank %d of %d: %s\n(the other ranks did not finish within %g s: "
                 "aborting the job)\n",
                 world.rank(), world.size(), message.c_str(), grace.count());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Comm_free(&verdicts);
  if (!failed && failures == 0) return status;
  if (failures == world.size()) {
    if (world.rank() == 0) std::fprintf(stderr, "error: %s\n", message.c_str());
  } else if (failed) {
    std::fprintf(stderr, "error on rank %d of %d: %s\n", world.rank(), world.size(),
                 message.c_str());
  }
  return 2;
}

}  // namespace detail

mpi::mpi(MPI_Comm user_comm, mpi_options options) : options_(options) {
  constexpr std::string_view function = "kfsdp::comm::mpi::mpi";
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (!initialised || finalised) {
    throw std::logic_error(
        "kfsdp::comm::mpi::mpi: MPI is not running; create a kfsdp::comm::mpi::environment "
        "first (and keep it alive while communicators exist)");
  }
  if (user_comm == MPI_COMM_NULL) {
    throw std::invalid_argument("kfsdp::comm::mpi::mpi: user_comm is MPI_COMM_NULL");
  }
  check(MPI_Comm_dup(user_comm, &comm_), function, "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), function, "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), function, "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), function, "MPI_Comm_size");
  detail::check_collective_timeout(options_.timeout, fmt::format("{}: options.timeout", function));
  yields_ = detail::node_oversubscribed(split_shared().native());
}

mpi::mpi(mpi&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(other.rank_),
      size_(other.size_),
      ring_min_bytes_(other.ring_min_bytes_),
      tagged_calls_(other.tagged_calls_),
      options_(other.options_),
      checked_calls_(other.checked_calls_),
      yields_(other.yields_),
      windows_(std::move(other.windows_)) {}
mpi& mpi::operator=(mpi&& other) noexcept {
  if (this != &other) {
    free_communicator();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = other.rank_;
    size_ = other.size_;
    ring_min_bytes_ = other.ring_min_bytes_;
    tagged_calls_ = other.tagged_calls_;
    options_ = other.options_;
    checked_calls_ = other.checked_calls_;
    yields_ = other.yields_;
    windows_ = std::move(other.windows_);
  }
  return *this;
}
mpi::~mpi() { free_communicator(); }

mpi::mpi(adopt_t, MPI_Comm owned, const mpi& parent, std::string_view function)
    : comm_(owned), ring_min_bytes_(parent.ring_min_bytes_), options_(parent.options_), yields_(parent.yields_) {
  try {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), function, "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), function, "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), function, "MPI_Comm_size");
  } catch (...) {
    free_communicator();  // a throwing constructor runs no destructor
    throw;
  }
}

int mpi::ranks_on_node() const { return split_shared().size(); }

shared_bytes mpi::allocate_shared(std::size_t bytes) {
  constexpr std::string_view function = "kfsdp::comm::mpi::allocate_shared";
  // Every rank gives the same answer: options agree, and the node and its room are the ranks' together.
  if (!options_.shared_memory || size_ == 1 || comm_ == MPI_COMM_NULL) return {};
  if (ranks_on_node() != size_) return {};  // ranks on several nodes
  unsigned long long largest = bytes;
  check(MPI_Allreduce(MPI_IN_PLACE, &largest, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm_), function, "MPI_Allreduce");
  int fits = detail::shared_memory_room(largest + detail::shared_alignment, size_) ? 1 : 0;  // else SIGBUS later
  check(MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, comm_), function, "MPI_Allreduce");
  if (fits == 0) return {};
  if (!windows_) windows_ = std::make_shared<detail::shared_windows>();
  return detail::allocate_window(comm_, size_, bytes, windows_, waits());
}

mpi mpi::split(int color, int key) const {
  constexpr std::string_view function = "kfsdp::comm::mpi::split";
  if (color < 0) {
    throw std::invalid_argument(fmt::format(
        "{}: color is {}, expected color >= 0 (every rank joins a group)", function, color));
  }
  MPI_Comm group = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &group), function, "MPI_Comm_split");
  return mpi(adopt, group, *this, function);
}

mpi mpi::split_shared() const {
  constexpr std::string_view function = "kfsdp::comm::mpi::split_shared";
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), function,
        "MPI_Comm_split_type");
  return mpi(adopt, node, *this, function);
}

void mpi::barrier() {
  constexpr std::string_view function = "kfsdp::comm::mpi::barrier";
  verify_call(function, {detail::collective_kind::barrier, 0, 0, 0});
  if (!timed()) return check(MPI_Barrier(comm_), function, "MPI_Barrier");
  MPI_Request handle = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &handle), function, "MPI_Ibarrier");
  pending(handle, function).wait();
}

request mpi::pending(MPI_Request handle, std::string_view function) const {
  return request(pending_mpi<std::array<MPI_Request, 1>>{{handle}, function, waits(), rank_, size_});
}

void mpi::verify_call(std::string_view function, detail::collective_call call) {
  if (!options_.check_collectives) return;
  ++checked_calls_;
  const std::uint64_t mine[4] = {static_cast<std::uint64_t>(call.kind), call.element_bytes,
                                 call.count, call.root};
  std::vector<std::uint64_t> all(4 * static_cast<std::size_t>(size_));
  // On copies the request owns, as every blocking call: a timeout leaves MPI nothing of this frame.
  detail::wait_on_own_copy<std::uint64_t>(mine, all, false, [&](std::span<const std::uint64_t> in,
                                                                std::span<std::uint64_t> out) {
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Iallgather(in.data(), 4, MPI_UINT64_T, out.data(), 4, MPI_UINT64_T, comm_, &handle), function,
          "MPI_Iallgather (the collective check)");
    return pending(handle, function);
  });
  std::vector<detail::collective_call> calls;
  for (std::size_t r = 0; r < all.size(); r += 4)
    calls.push_back({static_cast<detail::collective_kind>(
                         std::min(all[r], static_cast<std::uint64_t>(detail::collective_kind_last))),
                     all[r + 1], all[r + 2], all[r + 3]});
  if (std::all_of(calls.begin(), calls.end(), [&](const auto& other) { return other == call; }))
    return;
  throw collective_mismatch(fmt::format(
      "{}: the ranks called different collectives (checked call {} on this communicator): {}; "
      "this is rank {} of {}",
      function, checked_calls_, detail::describe_calls(calls), rank_, size_));
}

void mpi::free_communicator() noexcept {
  if (comm_ == MPI_COMM_NULL) return;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised) MPI_Comm_free(&comm_);  // after MPI_Finalize there is nothing left to free
  comm_ = MPI_COMM_NULL;
}

void mpi::environment::start(int* argc, char*** argv, int required_thread_level) {
  constexpr std::string_view function = "kfsdp::comm::mpi::environment";
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (finalised) {
    throw std::logic_error(
        "kfsdp::comm::mpi::environment: MPI was already finalised; it cannot start again");
  }
  if (initialised) {
    check(MPI_Query_thread(&thread_level_), function, "MPI_Query_thread");
  } else {
    check(MPI_Init_thread(argc, argv, required_thread_level, &thread_level_), function,
          "MPI_Init_thread");
    owns_mpi_ = true;
  }
  if (thread_level_ < required_thread_level) {
    if (owns_mpi_) MPI_Finalize();  // the destructor will not run for a throwing constructor
    throw std::runtime_error(fmt::format(
        "{}: MPI provides thread level {}, expected at least required_thread_level = {} "
        "(MPI_THREAD_SINGLE={}, FUNNELED={}, SERIALIZED={}, MULTIPLE={})",
        function, thread_level_, required_thread_level, int{MPI_THREAD_SINGLE},
        int{MPI_THREAD_FUNNELED}, int{MPI_THREAD_SERIALIZED}, int{MPI_THREAD_MULTIPLE}));
  }
}

mpi::environment::~environment() {
  if (!owns_mpi_) return;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised) MPI_Finalize();
}

}  // namespace kfsdp::comm
