#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::comm::mpi — the MPI communicator backend (opt-in: this header includes mpi.h).
//
// It wraps MPI_COMM_WORLD, or any MPI_Comm you pass, duplicated with MPI_Comm_dup so kfsdp's
// messages never match yours; the duplicate is freed in the destructor (kfsdp's ring
// reduce-scatter and gather batches send point-to-point messages on it, tags 0-32767: send none
// of your own there). Errors come back as exceptions (MPI_ERRORS_RETURN is set on the
// duplicate), never as an abort. Two guards against a user's mismatched collectives
// (mpi_options): the ranks compare each call before making it, and a call that waits longer than
// a timeout (10 minutes unless set) throws. run_or_abort ends a job in which one rank failed.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);    // MPI_Init_thread(FUNNELED), finalize
//     kfsdp::comm::mpi world;                              // MPI_COMM_WORLD, duplicated
//     std::vector<double> shard(4, world.rank()), full(4 * world.size());
//     kfsdp::comm::all_gather(world, shard, std::span(full));  // [0,0,0,0, 1,1,1,1, ...]
//     kfsdp::comm::request pending = world.iall_reduce_sum(std::span(full));
//     pending.wait();
//   }

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/memory.hpp>

namespace kfsdp::comm {

namespace detail {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

// Setting up the 16-bit datatype or sum operation failed (MPI is not running, or out of memory).
inline void check_setup(int code, std::string_view mpi_call) {
  if (code != MPI_SUCCESS) {
    throw std::runtime_error(fmt::format("kfsdp::comm::mpi: {} failed: {} (MPI error code {})",
                                         mpi_call, mpi_error_text(code), code));
  }
}

// bf16 and f16 travel as one 2-byte datatype, committed on first use and kept until MPI ends
// (MPI_Finalize frees it): MPI has no 16-bit float type of its own.
inline MPI_Datatype two_byte_datatype() {
  static const MPI_Datatype type = [] {
    MPI_Datatype contiguous = MPI_DATATYPE_NULL;
    check_setup(MPI_Type_contiguous(2, MPI_BYTE, &contiguous), "MPI_Type_contiguous");
    check_setup(MPI_Type_commit(&contiguous), "MPI_Type_commit");
    return contiguous;
  }();
  return type;
}

template <class T>
MPI_Datatype mpi_datatype() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  else return two_byte_datatype();  // bf16, f16
}

// One addition of the 16-bit formats: in float, rounded once to the format (half.hpp: to nearest,
// ties to even). The MPI sum operation and the ring both add this way.
template <half_element Half>
Half add_in_float(Half a, Half b) {
  return Half(a.to_float() + b.to_float());
}

// The MPI_User_function of a 16-bit sum: inout[i] = in[i] + inout[i].
template <half_element Half>
void half_sum(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const Half* addend = static_cast<const Half*>(in);
  Half* sum = static_cast<Half*>(inout);
  for (int i = 0; i < *length; ++i) sum[i] = add_in_float(addend[i], sum[i]);
}

// MPI_SUM for MPI's own types; a commutative user operation, created on first use, for bf16, f16.
template <class T>
MPI_Op sum_operation() {
  if constexpr (half_element<T>) {
    static const MPI_Op sum = [] {
      MPI_Op created = MPI_OP_NULL;
      check_setup(MPI_Op_create(&half_sum<T>, /*commute=*/1, &created), "MPI_Op_create");
      return created;
    }();
    return sum;
  } else {
    return MPI_SUM;
  }
}

// What the ranks compare before a checked collective: the same on every rank, or a user's bug.
enum class collective_kind : std::uint64_t {
  all_gather, reduce_scatter_sum, broadcast, all_reduce_sum, all_reduce_max, all_reduce_min, barrier,
  all_gather_parts, reduce_scatter_parts
};
// The last kind: a larger value read from another rank (another kfsdp version) reads as this one.
constexpr collective_kind collective_kind_last = collective_kind::reduce_scatter_parts;
// What the ranks compare of an element type: its bytes, and for the two 2-byte floating-point
// formats a tag, so that bf16 on one rank against f16 on another is a mismatch too.
constexpr std::uint64_t half_tag_bf16 = 0x100, half_tag_f16 = 0x200;
template <class T>
constexpr std::uint64_t element_code() {
  if constexpr (std::is_same_v<T, bf16>) return sizeof(T) | half_tag_bf16;
  else if constexpr (std::is_same_v<T, f16>) return sizeof(T) | half_tag_f16;
  else return sizeof(T);
}
struct collective_call {
  collective_kind kind;
  std::uint64_t element_bytes;  // element_code<T>(); 0 for a barrier
  std::uint64_t count;          // per rank for all_gather (send) and reduce_scatter_sum (recv)
  std::uint64_t root;           // broadcast: the root; *_parts: the number of parts
  friend bool operator==(const collective_call&, const collective_call&) = default;
};
inline std::string describe(const collective_call& call) {
  constexpr std::string_view names[] = {"all_gather", "reduce_scatter_sum", "broadcast",
                                        "all_reduce_sum", "all_reduce_max", "all_reduce_min",
                                        "barrier", "all_gather_parts", "reduce_scatter_parts"};
  const std::string_view name = names[static_cast<std::size_t>(call.kind)];
  if (call.kind == collective_kind::barrier) return fmt::format("{}()", name);
  const std::uint64_t tag = call.element_bytes & (half_tag_bf16 | half_tag_f16);
  const std::string elements = fmt::format("{} elements of {} bytes{}", call.count, call.element_bytes & 0xff,
                                           tag == half_tag_bf16 ? " (bf16)" : tag == half_tag_f16 ? " (f16)" : "");
  if (call.kind == collective_kind::broadcast)
    return fmt::format("{}({}, root {})", name, elements, call.root);
  if (call.kind == collective_kind::all_gather_parts || call.kind == collective_kind::reduce_scatter_parts)
    return fmt::format("{}({} per rank in {} parts)", name, elements, call.root);
  const bool per_rank = call.kind == collective_kind::all_gather ||
                        call.kind == collective_kind::reduce_scatter_sum;
  return fmt::format("{}({}{})", name, elements, per_rank ? " per rank" : "");
}

// "all_gather(...) on ranks 0, 2; broadcast(...) on rank 1": each distinct call once.
inline std::string describe_calls(std::span<const collective_call> by_rank) {
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

// The defaults of mpi_options, from the environment so a job can switch them without a rebuild.
inline bool default_check_collectives() {
  const char* value = std::getenv("KFSDP_CHECK_COLLECTIVES");
  if (value == nullptr || *value == '\0') {
#ifdef NDEBUG
    return false;
#else
    return true;
#endif
  }
  const std::string_view text(value);
  if (text == "1" || text == "on") return true;
  if (text == "0" || text == "off") return false;
  throw std::invalid_argument(fmt::format(
      "KFSDP_CHECK_COLLECTIVES is '{}', expected 1, on, 0 or off", text));
}
// 10 minutes, as PyTorch's process groups: a rank that skips a collective ends the job with an
// error naming the call instead of a hang, and no healthy collective waits that long.
inline constexpr std::chrono::duration<double> collective_timeout_default{600.0};
inline std::chrono::duration<double> default_collective_timeout() {
  const char* value = std::getenv("KFSDP_COLLECTIVE_TIMEOUT");
  if (value == nullptr || *value == '\0') return collective_timeout_default;
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(seconds >= 0) || seconds > 1e9) {
    throw std::invalid_argument(fmt::format(
        "KFSDP_COLLECTIVE_TIMEOUT is '{}', expected a number of seconds >= 0 (0: no timeout)",
        value));
  }
  return std::chrono::duration<double>(seconds);
}

// True when this MPI library reads and writes CUDA device memory itself (Open MPI built with
// CUDA support says so at run time); false where it cannot tell.
inline bool mpi_reads_device_memory() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

}  // namespace detail

// How an mpi communicator guards against collectives that the ranks do not call alike.
//
//   kfsdp::comm::mpi world(MPI_COMM_WORLD, {.check_collectives = true, .timeout = std::chrono::minutes(2)});
struct mpi_options {
  // Before each collective the ranks all-gather what they are about to call (kind, element size,
  // count, root) and, where they differ, throw collective_mismatch on every rank naming each
  // rank's call, instead of hanging or failing with MPI_ERR_TRUNCATE. One 32-byte all-gather per
  // call: on by default in builds without NDEBUG; KFSDP_CHECK_COLLECTIVES=1|0 sets the default.
  bool check_collectives = detail::default_check_collectives();
  // A collective that has not completed after this long throws mpi::timeout naming the call (as
  // NCCL's watchdog does), e.g. when another rank never calls it; the communicator must not be
  // used afterwards. 600 s by default; KFSDP_COLLECTIVE_TIMEOUT=<seconds> sets the default; zero
  // waits forever.
  std::chrono::duration<double> timeout = detail::default_collective_timeout();
  // How MPI reaches buffers that the host cannot touch (span_in<T, Kokkos::CudaSpace>):
  //   automatic  the device pointers themselves when MPI says it reads device memory
  //              (MPIX_Query_cuda_support), else through host copies (staged);
  //   direct     the device pointers themselves (you know your MPI is CUDA-aware);
  //   staged     through host copies in staging_space (pinned with CUDA), also for host memory,
  //              which is how the tests run this path on a CPU machine.
  // Host memory takes the direct path unless staged is set. Every rank must pass the same value.
  enum class device_memory_path { automatic, direct, staged };
  device_memory_path device_memory = device_memory_path::automatic;
};

KFSDP_EXPORT class mpi {
 public:
  class environment;

  // An MPI call that returned an error code; what() carries MPI_Error_string's text.
  class error : public std::runtime_error {
   public:
    error(std::string_view function, std::string_view mpi_call, int code)
        : std::runtime_error(fmt::format("{}: {} failed: {} (MPI error code {})", function,
                                         mpi_call, detail::mpi_error_text(code), code)),
          code_(code) {}
    [[nodiscard]] int code() const noexcept { return code_; }

   private:
    int code_;
  };

  // Ranks that called different collectives (mpi_options::check_collectives).
  class collective_mismatch : public std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  // A collective not complete within mpi_options::timeout.
  class timeout : public std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  // Throws mpi::error unless `code` is MPI_SUCCESS.
  static void check(int code, std::string_view function, std::string_view mpi_call) {
    if (code != MPI_SUCCESS) throw error(function, mpi_call, code);
  }

  // Wraps a duplicate of MPI_COMM_WORLD. MPI must be initialised (see mpi::environment).
  mpi() : mpi(MPI_COMM_WORLD) {}

  // Wraps a duplicate of `user_comm` (collective over it); user_comm itself is left untouched.
  // Every rank must pass the same options.
  explicit mpi(MPI_Comm user_comm, mpi_options options = {}) : options_(options) {
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
    if (!(options_.timeout.count() >= 0)) {
      throw std::invalid_argument(fmt::format("{}: options.timeout is {} s, expected >= 0", function,
                                              options_.timeout.count()));
    }
  }

  mpi(mpi&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        rank_(other.rank_),
        size_(other.size_),
        ring_min_bytes_(other.ring_min_bytes_),
        tagged_calls_(other.tagged_calls_),
        options_(other.options_),
        checked_calls_(other.checked_calls_) {}
  mpi& operator=(mpi&& other) noexcept {
    if (this != &other) {
      free_communicator();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
      ring_min_bytes_ = other.ring_min_bytes_;
      tagged_calls_ = other.tagged_calls_;
      options_ = other.options_;
      checked_calls_ = other.checked_calls_;
    }
    return *this;
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() { free_communicator(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  // The duplicated communicator, for calls kfsdp does not wrap; kfsdp keeps ownership.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }
  [[nodiscard]] const mpi_options& options() const noexcept { return options_; }
  // How many of this communicator's ranks share this rank's node (its memory); collective.
  [[nodiscard]] int ranks_on_node() const {
    constexpr std::string_view function = "kfsdp::comm::mpi::ranks_on_node";
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), function, "MPI_Comm_split_type");
    int n = 1;
    const int code = MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    check(code, function, "MPI_Comm_size");
    return n;
  }

  // Communicator groups. The ranks passing the same color form a new communicator, ranked by key
  // (ties broken by rank()); collective over this communicator, and every rank must join a group
  // (color >= 0). The group owns the MPI_Comm that MPI_Comm_split made and frees it; it keeps
  // this communicator's options and ring threshold.
  //
  //   kfsdp::comm::mpi row = world.split(world.rank() / 2, world.rank());   // {0,1}, {2,3}, ...
  [[nodiscard]] mpi split(int color, int key) const {
    constexpr std::string_view function = "kfsdp::comm::mpi::split";
    if (color < 0) {
      throw std::invalid_argument(fmt::format(
          "{}: color is {}, expected color >= 0 (every rank joins a group)", function, color));
    }
    MPI_Comm group = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &group), function, "MPI_Comm_split");
    return mpi(adopt, group, *this, function);
  }
  // The ranks that share this rank's node (its memory), in this communicator's order:
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); collective. Owned as split()'s result is.
  [[nodiscard]] mpi split_shared() const {
    constexpr std::string_view function = "kfsdp::comm::mpi::split_shared";
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), function,
          "MPI_Comm_split_type");
    return mpi(adopt, node, *this, function);
  }

  // The collectives of the communicator concept, on buffers of any Kokkos memory space
  // (span_in<T, Space>) or on host memory (std::span); the blocking ones are communicator.hpp's
  // free functions (comm::all_gather(world, ...) = world.iall_gather(...).wait()). Device memory
  // goes to MPI directly or through host copies, as mpi_options::device_memory says; the ring's
  // adds run in Space's execution space.
  //
  // recv = [rank 0's send | rank 1's | ...]; recv.size() == size()*send.size(). In place when
  // send.data() == recv.data() + rank()*send.size(). send is non-deduced, so a vector converts.
  template <element T, class Space>
  [[nodiscard]] request iall_gather(std::type_identity_t<span_in<const T, Space>> send,
                                    span_in<T, Space> recv) {
    constexpr std::string_view function = "kfsdp::comm::mpi::iall_gather";
    if (reads_directly<Space>()) return start_all_gather<T>(function, send.span(), recv.span());
    detail::check_all_gather(function, rank_, size_, send.span(), recv.span());
    staged<T, Space> copy(recv.size(), recv);
    const std::size_t slot = static_cast<std::size_t>(rank_) * send.size();
    detail::transfer(copy.host().subspan(slot, send.size()), send);
    const auto host = copy.host().span();
    copy.on_host = start_all_gather<T>(function, host.subspan(slot, send.size()), host);  // in place
    return request(std::move(copy));
  }
  template <element T>
  [[nodiscard]] request iall_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    return iall_gather<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }

  // A batch of all-gathers as one exchange (comm::iall_gather_parts): each rank sends its parts'
  // sends to every other rank as one message, and receives each rank's message straight into the
  // parts' places through a derived datatype; its own parts it copies in. One message a peer
  // instead of one collective a part: for a bucket of small parameters the per-call latency was
  // the cost. E.g. two parts of 2 and 3 elements at 2 ranks, rank 1's message to rank 0:
  //
  //   sent from:      parts[0].send[0..2) parts[1].send[0..3)   (rank 1's, where they lie)
  //   received into:  parts[0].recv[2..4) parts[1].recv[3..6)   (rank 0's recv type for rank 1)
  //
  // Memory the host cannot reach, or staged (mpi_options::device_memory), goes part by part.
  template <element T, class Space>
  [[nodiscard]] request iall_gather_parts(std::span<const gather_part<T, Space>> parts) {
    constexpr std::string_view function = "kfsdp::comm::mpi::iall_gather_parts";
    detail::check_all_gather_parts(function, rank_, size_, parts);
    if (!host_accessible<Space> || !reads_directly<Space>() || parts.size() == 1)
      return detail::gather_part_by_part<T, Space>(*this, parts);
    std::size_t total = 0;
    for (const gather_part<T, Space>& part : parts) total += part.send.size();
    verify_call(function, {detail::collective_kind::all_gather_parts, detail::element_code<T>(), total,
                           static_cast<std::uint64_t>(parts.size())});
    const int count = detail::checked_int_count(function, "parts", parts.size());
    std::vector<int> lengths(parts.size());
    std::vector<MPI_Aint> sent_from(parts.size()), received_into(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
      lengths[i] = detail::checked_int_count(function, "send", parts[i].send.size());
      sent_from[i] = address_of(parts[i].send.data());
    }
    const int tag = next_tag();
    pending_mpi<std::vector<MPI_Request>> batch{{}, function, options_.timeout, rank_, size_};
    batch.handles.reserve(2 * static_cast<std::size_t>(size_ - 1));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      for (std::size_t i = 0; i < parts.size(); ++i)
        received_into[i] = address_of(parts[i].recv.data() + static_cast<std::size_t>(peer) * parts[i].send.size());
      const hindexed<T> layout(function, count, lengths, received_into);
      check(MPI_Irecv(MPI_BOTTOM, 1, layout.type, peer, tag, comm_, &batch.handles.emplace_back()), function,
            "MPI_Irecv");
    }
    const hindexed<T> sends(function, count, lengths, sent_from);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      check(MPI_Isend(MPI_BOTTOM, 1, sends.type, peer, tag, comm_, &batch.handles.emplace_back()), function,
            "MPI_Isend");
    }
    // This rank's own chunks while the messages travel: a host copy (the space is host-accessible),
    // as memcpy does it (Kokkos 3.4's deep_copy between host views is a slower loop).
    for (const gather_part<T, Space>& part : parts) {
      T* own = part.recv.data() + static_cast<std::size_t>(rank_) * part.send.size();
      if (own != part.send.data()) std::copy_n(part.send.data(), part.send.size(), own);
    }
    return request(std::move(batch));
  }
  template <element T>
  [[nodiscard]] request iall_gather_parts(std::span<const gather_part<T, Kokkos::HostSpace>> parts) {
    return iall_gather_parts<T, Kokkos::HostSpace>(parts);
  }

  // Rank r's recv[i] = sum over ranks of send[r*recv.size() + i];
  // send.size() == size()*recv.size().
  //
  // Chunks of at least reduce_scatter_ring_min_bytes() (recv.size()*sizeof(T)) go through kfsdp's
  // ring (ring_reduce_scatter below), smaller ones through MPI_Reduce_scatter_block: OpenMPI 4.1's
  // reached only ~0.7 GB/s for 1-64 MiB chunks on shared memory. Either way the sum order is fixed
  // by (size(), recv.size()), so the same inputs give the same bits on every run. bf16 and f16
  // add in float and round once per addition (detail::add_in_float), on both paths.
  //
  // The ring's request advances a round each time test() finds the previous one complete, and
  // wait() runs the remaining rounds; rounds only advance inside test() and wait().
  //
  // With a factor, recv = sums · factor (comm::scales_reduce_scatter): the ring multiplies in its
  // last round's addition, MPI's path in one pass once the sums are in; the same bits either way.
  template <element T, class Space>
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv,
                                            std::type_identity_t<scale_type<T>> factor) {
    constexpr std::string_view function = "kfsdp::comm::mpi::ireduce_scatter_sum";
    if (sums_directly<T, Space>(recv.size_bytes()))
      return start_reduce_scatter<T, Space>(function, send.span(), recv.span(), factor);
    detail::check_reduce_scatter(function, size_, send.span(), recv.span());
    staged<T, Space> copy(recv.size(), recv);
    copy.input = detail::owned_elements<T, staging_space>(send.size());
    detail::transfer(copy.input.span(), send);
    copy.on_host =
        start_reduce_scatter<T, staging_space>(function, copy.input.span().span(), copy.host().span(), factor);
    return request(std::move(copy));
  }
  template <element T, class Space>
  [[nodiscard]] request ireduce_scatter_sum(std::type_identity_t<span_in<const T, Space>> send,
                                            span_in<T, Space> recv) {
    return ireduce_scatter_sum<T, Space>(send, recv, scale_type<T>(1));
  }
  template <element T>
  [[nodiscard]] request ireduce_scatter_sum(std::span<const std::type_identity_t<T>> send,
                                            std::span<T> recv) {
    return ireduce_scatter_sum<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
  }

  // A batch of reduce-scatters as one collective (comm::ireduce_scatter_sum_parts): one ring over
  // the batch, whose block b is every part's chunk b, sent from where the parts lie through derived
  // datatypes (no packing). E.g. two parts of 2 and 3 elements a rank at 2 ranks, rank 0's round:
  //
  //   sent to rank 1:  parts[0].send[2..4) parts[1].send[3..6)    (its block 1, one message)
  //   received:        scratch[0..5)                               (rank 1's block 0)
  //   then:            parts[0].recv[0..2) parts[1].recv[0..3) = (scratch + its block 0) · factor
  //
  // The sums are associated as ireduce_scatter_sum's ring associates them. A batch whose chunks
  // total less than reduce_scatter_ring_min_bytes() is packed rank-major (FSDP2's chunk_cat) into
  // one MPI_Ireduce_scatter_block instead; memory the host cannot reach, or staged, goes part by
  // part.
  template <element T, class Space>
  [[nodiscard]] request ireduce_scatter_sum_parts(std::span<const reduce_scatter_part<T, Space>> parts,
                                                  std::type_identity_t<scale_type<T>> factor = scale_type<T>(1)) {
    constexpr std::string_view function = "kfsdp::comm::mpi::ireduce_scatter_sum_parts";
    detail::check_reduce_scatter_parts(function, size_, parts);
    if (!host_accessible<Space> || !reads_directly<Space>() || parts.size() == 1)
      return detail::reduce_part_by_part<T, Space>(*this, parts, factor);
    std::size_t total = 0;
    for (const reduce_scatter_part<T, Space>& part : parts) total += part.recv.size();
    const int count = detail::checked_int_count(function, "the parts' recv together", total);
    verify_call(function, {detail::collective_kind::reduce_scatter_parts, detail::element_code<T>(), total,
                           static_cast<std::uint64_t>(parts.size())});
    if (size_ == 1 || uses_ring(total * sizeof(T)))
      return request(ring_over_parts<T, Space>(comm_, rank_, size_, next_tag(), parts, factor, function, options_.timeout));
    packed_parts<T, Space> packed(size_, parts, total, factor);
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter_block(packed.packed.span().data(), packed.sums.span().data(), count,
                                    detail::mpi_datatype<T>(), detail::sum_operation<T>(), comm_, &handle),
          function, "MPI_Ireduce_scatter_block");
    packed.sums_pending = pending(handle, function);
    return request(std::move(packed));
  }
  template <element T>
  [[nodiscard]] request ireduce_scatter_sum_parts(std::span<const reduce_scatter_part<T, Kokkos::HostSpace>> parts,
                                                  std::type_identity_t<scale_type<T>> factor = scale_type<T>(1)) {
    return ireduce_scatter_sum_parts<T, Kokkos::HostSpace>(parts, factor);
  }

  // Per-rank chunk size (bytes) from which reduce_scatter_sum uses the ring. Every rank must set
  // the same value before the same call: the two paths do not talk to each other.
  [[nodiscard]] std::size_t reduce_scatter_ring_min_bytes() const noexcept {
    return ring_min_bytes_;
  }
  void set_reduce_scatter_ring_min_bytes(std::size_t bytes) noexcept { ring_min_bytes_ = bytes; }
  // Measured with bench/collectives at 2 and 4 ranks (docs/performance.md).
  static constexpr std::size_t default_reduce_scatter_ring_min_bytes = 64 * 1024;

  // Every rank's data becomes root's; 0 <= root < size().
  template <element T, class Space>
  [[nodiscard]] request ibroadcast(span_in<T, Space> data, int root) {
    constexpr std::string_view function = "kfsdp::comm::mpi::ibroadcast";
    if (reads_directly<Space>()) return start_broadcast(function, data.span(), root);
    detail::check_root(function, root, size_);
    staged<T, Space> copy(data.size(), rank_ == root ? span_in<T, Space>() : data);  // root keeps its data
    if (rank_ == root) detail::transfer(copy.host(), span_in<const T, Space>(data));
    copy.on_host = start_broadcast(function, copy.host().span(), root);
    return request(std::move(copy));
  }
  template <element T>
  [[nodiscard]] request ibroadcast(std::span<T> data, int root) {
    return ibroadcast<T, Kokkos::HostSpace>(host_span<T>(data), root);
  }

  // In place, element by element over ranks.
  template <element T, class Space>
  [[nodiscard]] request iall_reduce_sum(span_in<T, Space> data) {
    constexpr std::string_view function = "kfsdp::comm::mpi::iall_reduce_sum";
    if (sums_directly<T, Space>(0))
      return start_all_reduce(data.span(), detail::collective_kind::all_reduce_sum, function);
    staged<T, Space> copy(data.size(), data);
    detail::transfer(copy.host(), span_in<const T, Space>(data));
    copy.on_host = start_all_reduce(copy.host().span(), detail::collective_kind::all_reduce_sum, function);
    return request(std::move(copy));
  }
  template <element T>
  [[nodiscard]] request iall_reduce_sum(std::span<T> data) {
    return iall_reduce_sum<T, Kokkos::HostSpace>(host_span<T>(data));
  }
  // Blocking (MPI_Allreduce): agreement checks make these, and wait for them at once.
  template <ordered_element T>
  void all_reduce_max(std::span<T> data) {
    all_reduce(data, detail::collective_kind::all_reduce_max, "kfsdp::comm::mpi::all_reduce_max");
  }
  template <ordered_element T>
  void all_reduce_min(std::span<T> data) {
    all_reduce(data, detail::collective_kind::all_reduce_min, "kfsdp::comm::mpi::all_reduce_min");
  }

  void barrier() {
    constexpr std::string_view function = "kfsdp::comm::mpi::barrier";
    verify_call(function, {detail::collective_kind::barrier, 0, 0, 0});
    if (!timed()) return check(MPI_Barrier(comm_), function, "MPI_Barrier");
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &handle), function, "MPI_Ibarrier");
    pending(handle, function).wait();
  }

 private:
  // Takes ownership of `owned`, a communicator MPI just made from `parent` (split, split_shared).
  struct adopt_t {};
  static constexpr adopt_t adopt{};
  mpi(adopt_t, MPI_Comm owned, const mpi& parent, std::string_view function)
      : comm_(owned), ring_min_bytes_(parent.ring_min_bytes_), options_(parent.options_) {
    try {
      check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), function, "MPI_Comm_set_errhandler");
      check(MPI_Comm_rank(comm_, &rank_), function, "MPI_Comm_rank");
      check(MPI_Comm_size(comm_, &size_), function, "MPI_Comm_size");
    } catch (...) {
      free_communicator();  // a throwing constructor runs no destructor
      throw;
    }
  }

  // What an mpi request waits on: one MPI request, or several that complete together
  // (iall_gather_parts' messages); `function` names the call that started it, for errors.
  // With a timeout, wait() polls test() until the deadline.
  template <class Handles>
  struct pending_mpi {
    Handles handles;  // std::array<MPI_Request, 1> or std::vector<MPI_Request>
    std::string_view function;
    std::chrono::duration<double> limit;  // zero: no timeout
    int rank;
    int size;

    bool test() {
      int complete = 0;
      check(MPI_Testall(static_cast<int>(handles.size()), handles.data(), &complete, MPI_STATUSES_IGNORE), function,
            "MPI_Testall");
      return complete != 0;
    }
    void wait() {
      if (limit.count() > 0) return wait_polling(*this, function, limit, rank, size);
      check(MPI_Waitall(static_cast<int>(handles.size()), handles.data(), MPI_STATUSES_IGNORE), function,
            "MPI_Waitall");
    }
  };
  // A committed MPI_Type_create_hindexed of T at absolute addresses (used with MPI_BOTTOM), freed
  // at the end of the scope: MPI lets the operations already posted with it complete.
  template <class T>
  struct hindexed {
    hindexed(std::string_view function, int count, const std::vector<int>& lengths,
             const std::vector<MPI_Aint>& addresses) {
      check(MPI_Type_create_hindexed(count, lengths.data(), addresses.data(), detail::mpi_datatype<T>(), &type),
            function, "MPI_Type_create_hindexed");
      const int committed = MPI_Type_commit(&type);
      if (committed != MPI_SUCCESS) MPI_Type_free(&type);
      check(committed, function, "MPI_Type_commit");
    }
    hindexed(const hindexed&) = delete;
    hindexed& operator=(const hindexed&) = delete;
    ~hindexed() { MPI_Type_free(&type); }
    MPI_Datatype type = MPI_DATATYPE_NULL;
  };
  static MPI_Aint address_of(const void* where) {
    MPI_Aint address = 0;
    MPI_Get_address(where, &address);
    return address;
  }
  [[nodiscard]] request pending(MPI_Request handle, std::string_view function) const {
    return request(pending_mpi<std::array<MPI_Request, 1>>{{handle}, function, options_.timeout, rank_, size_});
  }

  // Whether MPI gets the pointers of a buffer in Space itself, or host copies (mpi_options).
  template <class Space>
  [[nodiscard]] bool reads_directly() const {
    using path = mpi_options::device_memory_path;
    if (options_.device_memory == path::staged) return false;
    if constexpr (host_accessible<Space>) return true;
    else return options_.device_memory == path::direct || detail::mpi_reads_device_memory();
  }

  // A sum on buffers in Space without host copies: reads_directly, except that MPI's own 16-bit sum
  // (a user operation, run by the host) must not see device memory; the ring adds in Space.
  template <class T, class Space>
  [[nodiscard]] bool sums_directly(std::size_t chunk_bytes) const {
    if (!reads_directly<Space>()) return false;
    if constexpr (half_element<T> && !host_accessible<Space>) return uses_ring(chunk_bytes);
    else return true;
  }

  // A collective run on host copies (staging_space) of buffers in Space: the caller copies the
  // inputs in and starts on_host; once that completes, the result is copied out to `target`
  // (empty: nothing to copy, e.g. a broadcast's root). The copies outlive on_host, which is
  // declared after them and so destroyed (waited on) first.
  template <class T, class Space>
  struct staged {
    staged(std::size_t count, span_in<T, Space> result) : output(count), target(result) {}
    [[nodiscard]] span_in<T, staging_space> host() const noexcept { return output.span(); }

    bool test() {
      if (!on_host.test()) return false;
      copy_out();
      return true;
    }
    void wait() {
      on_host.wait();
      copy_out();
    }
    void copy_out() {
      if (target.data() != nullptr) detail::transfer(target, span_in<const T, staging_space>(output.span()));
      target = {};
    }

    detail::owned_elements<T, staging_space> input;   // the send copy of a reduce-scatter
    detail::owned_elements<T, staging_space> output;  // the result, gathered or reduced on the host
    span_in<T, Space> target;
    request on_host;
  };

  // Polls operation.test() until it completes; throws mpi::timeout once `limit` has passed.
  template <class Operation>
  static void wait_polling(Operation& operation, std::string_view function,
                           std::chrono::duration<double> limit, int rank, int size) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(limit);
    while (!operation.test()) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw timeout(fmt::format(
            "{}: not complete after {} s (mpi_options::timeout) on rank {} of {}: another rank "
            "has not called it, or called another collective; this communicator must not be used "
            "again",
            function, limit.count(), rank, size));
      }
      std::this_thread::yield();
    }
  }

  [[nodiscard]] bool timed() const noexcept { return options_.timeout.count() > 0; }

  // Throws collective_mismatch on every rank unless every rank is making the same call.
  void verify_call(std::string_view function, detail::collective_call call) {
    if (!options_.check_collectives) return;
    ++checked_calls_;
    const std::uint64_t mine[4] = {static_cast<std::uint64_t>(call.kind), call.element_bytes,
                                   call.count, call.root};
    std::vector<std::uint64_t> all(4 * static_cast<std::size_t>(size_));
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Iallgather(mine, 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, comm_, &handle),
          function, "MPI_Iallgather (the collective check)");
    pending(handle, function).wait();
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

  // A reduce-scatter as size()-1 rounds of a ring (rank r sends to r+1, receives from r-1).
  // In round s rank r receives the partial sum of block b = (r-s-2) mod n (the contributions of
  // ranks b+1 ... r-1), adds its own block b and, next round, passes it on; after n-1 rounds it
  // holds block r. The sum of block b is therefore associated as
  //   ((x[b+1] + x[b+2]) + ...) + x[b]      (rank indices mod n)
  // which differs from MPI_Reduce_scatter_block's order (so float results may differ from it in
  // the last bits) but is fixed by (n, count): the same inputs give the same bits on every run.
  //
  // Each round moves the block in segments of ring_segment_bytes, two in flight: the add of one
  // segment overlaps the transfer of the next, and the scratch space stays two segments whatever
  // the bucket size. Each call gets its own tag, so several reduce-scatters in flight never cross.
  static constexpr std::size_t ring_segment_bytes = 256 * 1024;

  template <class T, class Space>
  class ring_reduce_scatter {
   public:
    ring_reduce_scatter(MPI_Comm comm, int rank, int size, int tag, std::span<const T> send,
                        std::span<T> recv, scale_type<T> factor, std::string_view function,
                        std::chrono::duration<double> limit)
        : comm_(comm),
          rank_(rank),
          size_(size),
          tag_(tag),
          send_(send.data()),
          recv_(recv.data()),
          count_(recv.size()),
          segment_(std::max<std::size_t>(1, ring_segment_bytes / sizeof(T))),
          segments_per_round_((count_ + segment_ - 1) / segment_),
          steps_(static_cast<std::size_t>(size_ - 1) * segments_per_round_),
          // A round's first segment may only leave once the last round computed it.
          depth_(segments_per_round_ >= 2 ? 2 : 1),
          factor_(factor),
          function_(function),
          limit_(limit) {
      if (size_ == 1) {
        detail::copy(span_in<const T, Space>(send), span_in<T, Space>(recv));
        detail::multiply(span_in<T, Space>(recv), factor_);
        return;
      }
      incoming_ = detail::owned_elements<T, Space>(2 * std::min(segment_, count_));  // received first
      post_ready_steps();
    }

    bool test() {
      while (finished_ < steps_) {
        int complete = 0;
        check(MPI_Testall(2, pending_[finished_ % 2], &complete, MPI_STATUSES_IGNORE), function_,
              "MPI_Testall");
        if (complete == 0) return false;
        finish_step();
      }
      return true;
    }
    void wait() {
      if (limit_.count() > 0) return wait_polling(*this, function_, limit_, rank_, size_);
      while (finished_ < steps_) {
        check(MPI_Waitall(2, pending_[finished_ % 2], MPI_STATUSES_IGNORE), function_,
              "MPI_Waitall");
        finish_step();
      }
    }

   private:
    struct step_range {
      int round;
      std::size_t offset;  // into the block
      std::size_t length;
    };
    [[nodiscard]] step_range range_of(std::size_t step) const {
      const std::size_t offset = (step % segments_per_round_) * segment_;
      return {static_cast<int>(step / segments_per_round_), offset,
              std::min(segment_, count_ - offset)};
    }
    [[nodiscard]] const T* own_block(int block) const {
      return send_ + static_cast<std::size_t>(block) * count_;
    }
    [[nodiscard]] T* scratch(std::size_t step) const {
      return incoming_.span().data() + (step % 2) * std::min(segment_, count_);
    }

    void post_ready_steps() {
      const int left = (rank_ - 1 + size_) % size_;
      const int right = (rank_ + 1) % size_;
      for (; posted_ < steps_ && posted_ - finished_ < depth_; ++posted_) {
        const step_range step = range_of(posted_);
        const int length = static_cast<int>(step.length);  // count <= INT_MAX, checked by caller
        // Round 0 passes on this rank's own block r-1; later rounds the partial sum kept in recv.
        const T* outgoing = (step.round == 0 ? own_block(left) : recv_) + step.offset;
        MPI_Request* requests = pending_[posted_ % 2];
        check(MPI_Irecv(scratch(posted_), length, detail::mpi_datatype<T>(), left, tag_, comm_,
                        &requests[0]),
              function_, "MPI_Irecv");
        check(MPI_Isend(outgoing, length, detail::mpi_datatype<T>(), right, tag_, comm_,
                        &requests[1]),
              function_, "MPI_Isend");
      }
    }

    // The step's two messages are done, so its slice of recv may become partial + own block.
    void finish_step() {
      const step_range step = range_of(finished_);
      const int block = ((rank_ - step.round - 2) % size_ + size_) % size_;
      // A kernel in Space's execution space, complete before the next send reads the sum; the last
      // round's addition multiplies by the factor (no pass of its own).
      const bool last_round = step.round == size_ - 2;
      detail::add(span_in<const T, Space>(scratch(finished_), step.length),
                  span_in<const T, Space>(own_block(block) + step.offset, step.length),
                  span_in<T, Space>(recv_ + step.offset, step.length), last_round ? factor_ : scale_type<T>(1));
      ++finished_;
      post_ready_steps();
    }

    MPI_Comm comm_;
    int rank_;
    int size_;
    int tag_;
    const T* send_;
    T* recv_;
    std::size_t count_;
    std::size_t segment_;             // elements per message
    std::size_t segments_per_round_;
    std::size_t steps_;               // (size - 1) rounds of segments_per_round_ messages
    std::size_t depth_;               // steps in flight at once
    scale_type<T> factor_;            // multiplies the sums (1: a plain reduce-scatter)
    std::string_view function_;
    std::chrono::duration<double> limit_;  // zero: no timeout
    detail::owned_elements<T, Space> incoming_;  // owned, so the posted receives survive moving the state
    MPI_Request pending_[2][2] = {{MPI_REQUEST_NULL, MPI_REQUEST_NULL},
                                  {MPI_REQUEST_NULL, MPI_REQUEST_NULL}};
    std::size_t posted_ = 0;
    std::size_t finished_ = 0;
  };

  // The ring of ring_reduce_scatter over a batch of parts (ireduce_scatter_sum_parts). Block b is
  // the concatenation of every part's chunk b; a step moves a segment [offset, offset + length) of
  // it as one message described by an hindexed datatype over the pieces of the parts it covers
  // (round 0 from the parts' sends, later rounds from their recvs, which hold the partial sums),
  // into a contiguous scratch segment, then adds piece by piece into the recvs.
  template <class T, class Space>
  class ring_over_parts {
   public:
    ring_over_parts(MPI_Comm comm, int rank, int size, int tag, std::span<const reduce_scatter_part<T, Space>> parts,
                    scale_type<T> factor, std::string_view function, std::chrono::duration<double> limit)
        : comm_(comm),
          rank_(rank),
          size_(size),
          tag_(tag),
          parts_(parts.begin(), parts.end()),
          starts_(parts.size() + 1, 0),
          factor_(factor),
          function_(function),
          limit_(limit) {
      for (std::size_t i = 0; i < parts_.size(); ++i) starts_[i + 1] = starts_[i] + parts_[i].recv.size();
      count_ = starts_.back();
      if (size_ == 1 || count_ == 0) {
        for (const reduce_scatter_part<T, Space>& part : parts_) {
          detail::copy(part.send, part.recv);
          detail::multiply(part.recv, factor_);
        }
        return;
      }
      segment_ = std::min(count_, std::max<std::size_t>(1, ring_segment_bytes / sizeof(T)));
      segments_per_round_ = (count_ + segment_ - 1) / segment_;
      steps_ = static_cast<std::size_t>(size_ - 1) * segments_per_round_;
      depth_ = segments_per_round_ >= 2 ? 2 : 1;
      incoming_ = detail::owned_elements<T, Space>(2 * segment_);
      post_ready_steps();
    }

    bool test() {
      while (finished_ < steps_) {
        int complete = 0;
        check(MPI_Testall(2, pending_[finished_ % 2], &complete, MPI_STATUSES_IGNORE), function_, "MPI_Testall");
        if (complete == 0) return false;
        finish_step();
      }
      return true;
    }
    void wait() {
      if (limit_.count() > 0) return wait_polling(*this, function_, limit_, rank_, size_);
      while (finished_ < steps_) {
        check(MPI_Waitall(2, pending_[finished_ % 2], MPI_STATUSES_IGNORE), function_, "MPI_Waitall");
        finish_step();
      }
    }

   private:
    // Calls f(part, from, count, at) for each part's piece of block elements [offset, offset+length):
    // elements [from, from + count) of the part's chunk, at `at` from the segment's start.
    template <class F>
    void for_each_piece(std::size_t offset, std::size_t length, F&& f) const {
      auto part = std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1;
      for (std::size_t at = 0; at < length; ++part) {
        const std::size_t from = offset + at - starts_[part];
        const std::size_t count = std::min(length - at, parts_[part].recv.size() - from);
        if (count > 0) f(parts_[part], from, count, at);
        at += count;
      }
    }
    [[nodiscard]] int round_of(std::size_t step) const { return static_cast<int>(step / segments_per_round_); }
    [[nodiscard]] std::size_t offset_of(std::size_t step) const { return (step % segments_per_round_) * segment_; }
    [[nodiscard]] std::size_t length_of(std::size_t step) const { return std::min(segment_, count_ - offset_of(step)); }
    [[nodiscard]] T* scratch(std::size_t step) const { return incoming_.span().data() + (step % 2) * segment_; }

    void post_ready_steps() {
      const int left = (rank_ - 1 + size_) % size_;
      const int right = (rank_ + 1) % size_;
      for (; posted_ < steps_ && posted_ - finished_ < depth_; ++posted_) {
        const int round = round_of(posted_);
        const std::size_t length = length_of(posted_);
        // Round 0 passes on this rank's own block r-1; later rounds the partial sums kept in the recvs.
        std::vector<int> lengths;
        std::vector<MPI_Aint> addresses;
        for_each_piece(offset_of(posted_), length, [&](const reduce_scatter_part<T, Space>& part, std::size_t from,
                                                       std::size_t count, std::size_t) {
          const T* outgoing = round == 0 ? part.send.data() + static_cast<std::size_t>(left) * part.recv.size()
                                         : part.recv.data();
          lengths.push_back(static_cast<int>(count));  // the total fits an int: checked by the caller
          addresses.push_back(address_of(outgoing + from));
        });
        const hindexed<T> outgoing(function_, static_cast<int>(lengths.size()), lengths, addresses);
        MPI_Request* requests = pending_[posted_ % 2];
        check(MPI_Irecv(scratch(posted_), static_cast<int>(length), detail::mpi_datatype<T>(), left, tag_, comm_,
                        &requests[0]),
              function_, "MPI_Irecv");
        check(MPI_Isend(MPI_BOTTOM, 1, outgoing.type, right, tag_, comm_, &requests[1]), function_, "MPI_Isend");
      }
    }

    // The step's two messages are done: its pieces of the recvs become partial + own block.
    void finish_step() {
      const int round = round_of(finished_);
      const int block = ((rank_ - round - 2) % size_ + size_) % size_;
      const scale_type<T> factor = round == size_ - 2 ? factor_ : scale_type<T>(1);  // the last round scales
      const T* incoming = scratch(finished_);
      for_each_piece(offset_of(finished_), length_of(finished_),
                     [&](const reduce_scatter_part<T, Space>& part, std::size_t from, std::size_t count, std::size_t at) {
                       const T* own = part.send.data() + static_cast<std::size_t>(block) * part.recv.size() + from;
                       detail::add(span_in<const T, Space>(incoming + at, count), span_in<const T, Space>(own, count),
                                   part.recv.subspan(from, count), factor);
                     });
      ++finished_;
      post_ready_steps();
    }

    MPI_Comm comm_;
    int rank_;
    int size_;
    int tag_;
    std::vector<reduce_scatter_part<T, Space>> parts_;
    std::vector<std::size_t> starts_;  // part i's chunk starts at starts_[i] of a block; the block's size last
    std::size_t count_ = 0;            // elements a block
    std::size_t segment_ = 0;          // elements a message
    std::size_t segments_per_round_ = 0;
    std::size_t steps_ = 0;            // (size - 1) rounds of segments_per_round_ messages
    std::size_t depth_ = 1;            // steps in flight at once
    scale_type<T> factor_;
    std::string_view function_;
    std::chrono::duration<double> limit_;  // zero: no timeout
    detail::owned_elements<T, Space> incoming_;
    MPI_Request pending_[2][2] = {{MPI_REQUEST_NULL, MPI_REQUEST_NULL}, {MPI_REQUEST_NULL, MPI_REQUEST_NULL}};
    std::size_t posted_ = 0;
    std::size_t finished_ = 0;
  };

  // A small batch of reduce-scatters as one MPI_Ireduce_scatter_block: the parts' chunks packed
  // rank-major (FSDP2's chunk_cat), the sums unpacked into the recvs once they are in. E.g. parts
  // of 2 and 3 elements a rank at 2 ranks: packed = [p0 chunk 0 | p1 chunk 0 | p0 chunk 1 | p1 chunk 1].
  template <class T, class Space>
  struct packed_parts {
    packed_parts(int size, std::span<const reduce_scatter_part<T, Space>> batch, std::size_t total,
                 scale_type<T> scale)
        : parts(batch.begin(), batch.end()), packed(static_cast<std::size_t>(size) * total), sums(total), factor(scale) {
      T* into = packed.span().data();
      for (int rank = 0; rank < size; ++rank)
        for (const reduce_scatter_part<T, Space>& part : parts)
          into = std::copy_n(part.send.data() + static_cast<std::size_t>(rank) * part.recv.size(), part.recv.size(), into);
    }
    bool test() {
      if (!sums_pending.test()) return false;
      unpack();
      return true;
    }
    void wait() {
      sums_pending.wait();
      unpack();
    }
    void unpack() {
      const T* from = sums.span().data();
      for (const reduce_scatter_part<T, Space>& part : parts) {
        T* to = part.recv.data();
        for (std::size_t i = 0; i < part.recv.size(); ++i) to[i] = detail::product_of(from[i], factor);
        from += part.recv.size();
      }
    }

    std::vector<reduce_scatter_part<T, Space>> parts;  // host-accessible memory
    detail::owned_elements<T, Space> packed;
    detail::owned_elements<T, Space> sums;
    scale_type<T> factor;
    request sums_pending;  // declared last: destroyed (waited on) before the buffers
  };

  [[nodiscard]] bool uses_ring(std::size_t chunk_bytes) const noexcept {
    return size_ > 1 && chunk_bytes > 0 && chunk_bytes >= ring_min_bytes_;
  }
  // Every rank makes the same calls in the same order, so the counters agree without talking.
  int next_tag() noexcept { return static_cast<int>(tagged_calls_++ % tag_count); }
  static constexpr std::uint64_t tag_count = 32768;  // MPI guarantees MPI_TAG_UB >= 32767

  // Each collective's argument checks, then the ranks' comparison of the call; the MPI count.
  template <class T>
  int prepare_all_gather(std::string_view function, std::span<const T> send, std::span<T> recv) {
    detail::check_all_gather(function, rank_, size_, send, recv);
    const int count = detail::checked_int_count(function, "send", send.size());
    verify_call(function, {detail::collective_kind::all_gather, detail::element_code<T>(), send.size(), 0});
    return count;
  }
  template <class T>
  int prepare_reduce_scatter(std::string_view function, std::span<const T> send,
                             std::span<T> recv) {
    detail::check_reduce_scatter(function, size_, send, recv);
    const int count = detail::checked_int_count(function, "recv", recv.size());
    verify_call(function, {detail::collective_kind::reduce_scatter_sum, detail::element_code<T>(), recv.size(), 0});
    return count;
  }
  template <class T>
  int prepare_broadcast(std::string_view function, std::span<T> data, int root) {
    detail::check_root(function, root, size_);
    const int count = detail::checked_int_count(function, "data", data.size());
    verify_call(function, {detail::collective_kind::broadcast, detail::element_code<T>(), data.size(),
                           static_cast<std::uint64_t>(root)});
    return count;
  }

  // The non-blocking forms.
  template <class T>
  request start_all_gather(std::string_view function, std::span<const T> send, std::span<T> recv) {
    const int count = prepare_all_gather<T>(function, send, recv);
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Iallgather(send_or_in_place(send, recv), count, detail::mpi_datatype<T>(),
                         recv.data(), count, detail::mpi_datatype<T>(), comm_, &handle),
          function, "MPI_Iallgather");
    return pending(handle, function);
  }
  template <class T, class Space>
  request start_reduce_scatter(std::string_view function, std::span<const T> send, std::span<T> recv,
                               scale_type<T> factor) {
    const int count = prepare_reduce_scatter<T>(function, send, recv);
    if (uses_ring(recv.size_bytes())) {
      return request(ring_reduce_scatter<T, Space>(comm_, rank_, size_, next_tag(), send, recv, factor,
                                                   function, options_.timeout));
    }
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter_block(send.data(), recv.data(), count, detail::mpi_datatype<T>(),
                                    detail::sum_operation<T>(), comm_, &handle),
          function, "MPI_Ireduce_scatter_block");
    return detail::multiplied_once_complete<T, Space>(pending(handle, function), span_in<T, Space>(recv), factor);
  }
  template <class T>
  request start_broadcast(std::string_view function, std::span<T> data, int root) {
    const int count = prepare_broadcast(function, data, root);
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data.data(), count, detail::mpi_datatype<T>(), root, comm_, &handle),
          function, "MPI_Ibcast");
    return pending(handle, function);
  }
  template <class T>
  request start_all_reduce(std::span<T> data, detail::collective_kind kind,
                           std::string_view function) {
    const int count = detail::checked_int_count(function, "data", data.size());
    verify_call(function, {kind, detail::element_code<T>(), data.size(), 0});
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count, detail::mpi_datatype<T>(),
                         operation_of<T>(kind), comm_, &handle),
          function, "MPI_Iallreduce");
    return pending(handle, function);
  }
  template <class T>
  static MPI_Op operation_of(detail::collective_kind kind) {
    return kind == detail::collective_kind::all_reduce_max   ? MPI_MAX
           : kind == detail::collective_kind::all_reduce_min ? MPI_MIN
                                                             : detail::sum_operation<T>();
  }

  // MPI spells the in-place all-gather with MPI_IN_PLACE rather than an aliasing send buffer.
  template <class T>
  const void* send_or_in_place(std::span<const T> send, std::span<T> recv) const {
    const std::size_t slot = static_cast<std::size_t>(rank_) * send.size();
    const bool in_place = !send.empty() && send.data() == recv.data() + slot;
    return in_place ? MPI_IN_PLACE : static_cast<const void*>(send.data());
  }

  template <class T>
  void all_reduce(std::span<T> data, detail::collective_kind kind, std::string_view function) {
    if (timed()) return start_all_reduce(data, kind, function).wait();
    const int count = detail::checked_int_count(function, "data", data.size());
    verify_call(function, {kind, detail::element_code<T>(), data.size(), 0});
    check(MPI_Allreduce(MPI_IN_PLACE, data.data(), count, detail::mpi_datatype<T>(),
                        operation_of<T>(kind), comm_),
          function, "MPI_Allreduce");
  }

  void free_communicator() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Comm_free(&comm_);  // after MPI_Finalize there is nothing left to free
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::size_t ring_min_bytes_ = default_reduce_scatter_ring_min_bytes;
  std::uint64_t tagged_calls_ = 0;  // ring reduce-scatters and gather batches started: the next one's tag
  mpi_options options_;
  std::uint64_t checked_calls_ = 0;  // collectives compared across ranks, for the messages
};

// RAII guard: MPI_Init_thread with at least `required_thread_level` (MPI_THREAD_FUNNELED by
// default: only the main thread calls MPI) unless MPI is already up; MPI_Finalize at the end if
// this guard initialised it. Throws when MPI cannot give the thread level asked for.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);
//     kfsdp::comm::mpi world;
//     ...                                  // every kfsdp::comm::mpi must die before mpi_up
//   }
class mpi::environment {
 public:
  environment(int& argc, char**& argv, int required_thread_level = MPI_THREAD_FUNNELED) {
    start(&argc, &argv, required_thread_level);
  }
  explicit environment(int required_thread_level = MPI_THREAD_FUNNELED) {
    start(nullptr, nullptr, required_thread_level);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (!owns_mpi_) return;
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Finalize();
  }

  // True when this guard called MPI_Init_thread (and so will call MPI_Finalize).
  [[nodiscard]] bool owns_mpi() const noexcept { return owns_mpi_; }
  // The thread level MPI provides (MPI_THREAD_SINGLE < FUNNELED < SERIALIZED < MULTIPLE).
  [[nodiscard]] int thread_level() const noexcept { return thread_level_; }

 private:
  void start(int* argc, char*** argv, int required_thread_level) {
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

  bool owns_mpi_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

static_assert(communicator<mpi>);
static_assert(communicator_in<mpi, Kokkos::HostSpace>);

// Runs program() on every rank of `world` and ends the job cleanly whichever ranks fail:
// - no exception: every rank returns what program() returned;
// - an exception on every rank (a bad flag, seen alike everywhere): rank 0 prints
//   "error: <what>" and every rank returns 2;
// - an exception on some ranks only, while the others run on or wait in a collective: each
//   failing rank prints "error on rank r of n: <what>" and, when the others have not finished
//   within `grace`, calls MPI_Abort(MPI_COMM_WORLD, 2), so the job ends instead of hanging.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);
//     kfsdp::comm::mpi world;
//     return kfsdp::comm::run_or_abort(world, [&] { return train(world); });
//   }
KFSDP_EXPORT template <class Program>
int run_or_abort(mpi& world, Program&& program,
                 std::chrono::duration<double> grace = std::chrono::seconds(3)) {
  constexpr std::string_view function = "kfsdp::comm::run_or_abort";
  MPI_Comm verdicts = MPI_COMM_NULL;  // its own communicator: a failed rank's world may be mid-call
  mpi::check(MPI_Comm_dup(world.native(), &verdicts), function, "MPI_Comm_dup");
  int status = 0;
  std::string message;
  try {
    status = program();
  } catch (const std::exception& caught) {
    message = caught.what();
  } catch (...) {
    message = "an exception that is not a std::exception";
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

}  // namespace kfsdp::comm
