#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// kfsdp::comm::mpi — the communicator: MPI_COMM_WORLD, or any MPI_Comm you pass, duplicated with
// MPI_Comm_dup so kfsdp's messages never match yours (kfsdp/comm/mpi/mpi.hpp describes the backend).
// Its collectives are templates over the element type and memory space; what is not a template
// (construction, splits, the barrier, the comparison of calls) is compiled into kfsdp_mpi
// (src/comm/mpi/mpi.cpp).

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/batched_collectives.hpp>
#include <kfsdp/comm/memory_space.hpp>
#include <kfsdp/comm/shared_memory.hpp>
#include <kfsdp/comm/mpi/call_check.hpp>
#include <kfsdp/comm/mpi/datatypes.hpp>
#include <kfsdp/comm/mpi/options.hpp>
#include <kfsdp/comm/mpi/ring.hpp>
#include <kfsdp/comm/mpi/shared_memory.hpp>

namespace kfsdp::comm {

KFSDP_EXPORT class mpi {
 public:
  class environment;

  // An MPI call that returned an error code; what() carries MPI_Error_string's text.
  using error = detail::mpi_error;
  // Ranks that called different collectives (mpi_options::check_collectives).
  using collective_mismatch = detail::collective_mismatch;
  // A collective not complete within mpi_options::timeout.
  using timeout = detail::collective_timeout;

  // Throws mpi::error unless `code` is MPI_SUCCESS.
  static void check(int code, std::string_view function, std::string_view mpi_call) {
    detail::check_mpi(code, function, mpi_call);
  }

  // Wraps a duplicate of MPI_COMM_WORLD. MPI must be initialised (see mpi::environment).
  mpi() : mpi(MPI_COMM_WORLD) {}

  // Wraps a duplicate of `user_comm` (collective over it); user_comm itself is left untouched.
  // Every rank must pass the same options.
  explicit mpi(MPI_Comm user_comm, mpi_options options = {});
  mpi(mpi&& other) noexcept;
  mpi& operator=(mpi&& other) noexcept;
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi();

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  // The duplicated communicator, for calls kfsdp does not wrap; kfsdp keeps ownership.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }
  [[nodiscard]] const mpi_options& options() const noexcept { return options_; }
  // How many of this communicator's ranks share this rank's node (its memory); collective.
  [[nodiscard]] int ranks_on_node() const;

  // Communicator groups. The ranks passing the same color form a new communicator, ranked by key
  // (ties broken by rank()); collective over this communicator, and every rank must join a group
  // (color >= 0). The group owns the MPI_Comm that MPI_Comm_split made and frees it; it keeps
  // this communicator's options and ring threshold.
  //
  //   kfsdp::comm::mpi row = world.split(world.rank() / 2, world.rank());   // {0,1}, {2,3}, ...
  [[nodiscard]] mpi split(int color, int key) const;
  // The ranks that share this rank's node (its memory), in this communicator's order:
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); collective. Owned as split()'s result is.
  [[nodiscard]] mpi split_shared() const;

  // `bytes` of host memory that this communicator's other ranks read in place (comm::shared_bytes):
  // an MPI shared-memory window, where every rank shares this rank's node; empty otherwise, and for
  // a single rank. Collective; every rank asks in the same order, the sizes may differ. An
  // all-gather batch whose sends all lie in it copies them straight out of the peers' memory
  // (iall_gather_parts). Freed, collectively, when the last copy of the result's owner goes.
  [[nodiscard]] shared_bytes allocate_shared(std::size_t bytes);
  // Whether iall_gather_parts reads this batch in place: every part's send lies in
  // allocate_shared's memory, which the host reaches, and there are peers to read from.
  template <class T, class Space>
  [[nodiscard]] bool reads_in_place(std::span<const gather_part<T, Space>> parts) const {
    return located_in_place(parts).has_value();
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

  // A batch of all-gathers as one exchange (comm::iall_gather_parts). Where every part's send lies
  // in allocate_shared's memory (reads_in_place), nothing is sent: each rank copies its peers'
  // chunks straight out of their memory (detail::shared_gather: where the sends lie, the copies, a
  // barrier). Otherwise each rank sends its small parts' sends to every other rank as one message,
  // and receives each rank's message straight into the parts' places through a derived datatype;
  // parts of gather_alone_min_bytes or more go as a contiguous message of their own each; its own
  // parts it copies in once the messages are complete. One message a peer for the small parts
  // instead of one collective a part: for a bucket of small parameters the per-call latency was
  // the cost. E.g. two parts of 2 and 3 elements at 2 ranks, rank 1's message to rank 0:
  //
  //   sent from:      parts[0].send[0..2) parts[1].send[0..3)   (rank 1's, where they lie)
  //   received into:  parts[0].recv[2..4) parts[1].recv[3..6)   (rank 0's recv type for rank 1)
  //
  // A single part goes as iall_gather; memory the host cannot reach, or staged
  // (mpi_options::device_memory), part by part. Every rank must take the same path: with
  // check_collectives a rank reading in place against one sending throws collective_mismatch.
  template <element T, class Space>
  [[nodiscard]] request iall_gather_parts(std::span<const gather_part<T, Space>> parts) {
    constexpr std::string_view function = "kfsdp::comm::mpi::iall_gather_parts";
    detail::check_all_gather_parts(function, rank_, size_, parts);
    if (auto in_place = located_in_place(parts)) {
      verify_call(function, {detail::collective_kind::all_gather_parts_in_place, detail::element_code<T>(),
                             total_sent(parts), static_cast<std::uint64_t>(parts.size())});
      return request(detail::shared_gather(comm_, rank_, size_, next_tag(), windows_, std::move(*in_place), function, waits()));
    }
    if (!host_accessible<Space> || !reads_directly<Space>() || parts.size() == 1)
      return detail::gather_part_by_part<T, Space>(*this, parts);
    verify_call(function, {detail::collective_kind::all_gather_parts, detail::element_code<T>(), total_sent(parts),
                           static_cast<std::uint64_t>(parts.size())});
    std::vector<std::size_t> batched, alone;  // parts' indices: in the one typed message, or on their own
    for (std::size_t i = 0; i < parts.size(); ++i)
      (parts[i].send.size_bytes() >= gather_alone_min_bytes ? alone : batched).push_back(i);
    const int count = detail::checked_int_count(function, "parts", batched.size());
    std::vector<int> lengths(batched.size());
    std::vector<MPI_Aint> sent_from(batched.size()), received_into(batched.size());
    for (std::size_t j = 0; j < batched.size(); ++j) {
      lengths[j] = detail::checked_int_count(function, "send", parts[batched[j]].send.size());
      sent_from[j] = address_of(parts[batched[j]].send.data());
    }
    for (std::size_t i : alone) (void)detail::checked_int_count(function, "send", parts[i].send.size());
    // One tag for the batch: MPI keeps messages between two ranks on one tag in order, and every
    // rank posts the typed message first, then the parts alone in the parts' order.
    const int tag = next_tag();
    const std::size_t messages = (batched.empty() ? 0 : 1) + alone.size();
    gather_batch<T> batch{{}, {{}, function, waits(), rank_, size_}, {}};
    std::vector<MPI_Request>& handles = batch.messages.handles;
    handles.reserve(2 * messages * static_cast<std::size_t>(size_ - 1));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      const auto slot = [&](std::size_t i) {
        return parts[i].recv.data() + static_cast<std::size_t>(peer) * parts[i].send.size();
      };
      if (!batched.empty()) {
        for (std::size_t j = 0; j < batched.size(); ++j) received_into[j] = address_of(slot(batched[j]));
        const hindexed<T> layout(function, count, lengths, received_into);
        check(MPI_Irecv(MPI_BOTTOM, 1, layout.type, peer, tag, comm_, &handles.emplace_back()), function,
              "MPI_Irecv");
      }
      for (std::size_t i : alone)
        check(MPI_Irecv(slot(i), static_cast<int>(parts[i].send.size()), detail::mpi_datatype<T>(), peer, tag, comm_,
                        &handles.emplace_back()),
              function, "MPI_Irecv");
    }
    std::optional<hindexed<T>> sends;
    if (!batched.empty()) sends.emplace(function, count, lengths, sent_from);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      if (sends)
        check(MPI_Isend(MPI_BOTTOM, 1, sends->type, peer, tag, comm_, &handles.emplace_back()), function,
              "MPI_Isend");
      for (std::size_t i : alone)
        check(MPI_Isend(parts[i].send.data(), static_cast<int>(parts[i].send.size()), detail::mpi_datatype<T>(), peer,
                        tag, comm_, &handles.emplace_back()),
              function, "MPI_Isend");
    }
    for (const gather_part<T, Space>& part : parts) {
      T* own = part.recv.data() + static_cast<std::size_t>(rank_) * part.send.size();
      if (own != part.send.data()) batch.own.push_back({part.send.data(), own, part.send.size()});
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
  // ring (mpi/ring.hpp), smaller ones through MPI_Reduce_scatter_block: OpenMPI 4.1's
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
      return request(detail::ring_over_parts<T, Space>(comm_, rank_, size_, next_tag(), parts, factor, function, waits()));
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

  // Gather parts of this many bytes or more go as contiguous messages of their own: Open MPI's
  // shared-memory transport copies only contiguous messages once (CMA), a typed one twice.
  static constexpr std::size_t gather_alone_min_bytes = 8 * 1024;

  // Per-rank chunk size (bytes) from which reduce_scatter_sum uses the ring. Every rank must set
  // the same value before the same call: the two paths do not talk to each other.
  [[nodiscard]] std::size_t reduce_scatter_ring_min_bytes() const noexcept {
    return ring_min_bytes_;
  }
  void set_reduce_scatter_ring_min_bytes(std::size_t bytes) noexcept { ring_min_bytes_ = bytes; }

  // Measured with bench/collectives at 2 and 4 ranks (docs/performance.md).
  static constexpr std::size_t default_reduce_scatter_ring_min_bytes = 64 * 1024;

  // Whether a wait yields the CPU between its tests from the start: this node runs more of the
  // communicator's ranks than the CPUs their affinity masks allow (decided when it is made; a
  // split keeps it). Otherwise a wait polls, yielding only once it has lasted 1 ms.
  [[nodiscard]] bool yields_while_waiting() const noexcept { return yields_; }

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
  // Rank r's recv block s = rank s's send block r; send.size() == recv.size(), a multiple of
  // size() (MPI_Ialltoall, a block a rank). Device memory MPI cannot read goes through host copies.
  template <element T, class Space>
  [[nodiscard]] request iall_to_all(std::type_identity_t<span_in<const T, Space>> send, span_in<T, Space> recv) {
    constexpr std::string_view function = "kfsdp::comm::mpi::iall_to_all";
    if (reads_directly<Space>()) return start_all_to_all<T>(function, send.span(), recv.span());
    detail::check_all_to_all(function, size_, send.span(), recv.span());
    staged<T, Space> copy(recv.size(), recv);
    copy.input = detail::owned_elements<T, staging_space>(send.size());
    detail::transfer(copy.input.span(), send);
    copy.on_host = start_all_to_all<T>(function, copy.input.span().span(), copy.host().span());
    return request(std::move(copy));
  }
  template <element T>
  [[nodiscard]] request iall_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    return iall_to_all<T, Kokkos::HostSpace>(host_span<const T>(send), host_span<T>(recv));
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

  void barrier();

 private:
  // Takes ownership of `owned`, a communicator MPI just made from `parent` (split, split_shared).
  struct adopt_t {};
  static constexpr adopt_t adopt{};
  mpi(adopt_t, MPI_Comm owned, const mpi& parent, std::string_view function);

  // What an mpi request waits on: one MPI request, or several that complete together
  // (iall_gather_parts' messages); `function` names the call that started it, for errors.
  // With a timeout, wait() polls test() until the deadline.
  template <class Handles>
  struct pending_mpi {
    Handles handles;  // std::array<MPI_Request, 1> or std::vector<MPI_Request>
    std::string_view function;
    detail::wait_rule waits;
    int rank;
    int size;

    bool test() {
      int complete = 0;
      check(MPI_Testall(static_cast<int>(handles.size()), handles.data(), &complete, MPI_STATUSES_IGNORE), function,
            "MPI_Testall");
      return complete != 0;
    }
    void wait() {
      if (waits.timed()) return detail::wait_polling(*this, function, waits, rank, size);
      check(MPI_Waitall(static_cast<int>(handles.size()), handles.data(), MPI_STATUSES_IGNORE), function,
            "MPI_Waitall");
    }
  };
  // iall_gather_parts' messages, then this rank's own chunks copied in as memcpy does it (Kokkos
  // 3.4's deep_copy between host views is a slower loop). The copy waits for the messages: made
  // while they travel it was slower (0.17-0.20 against 0.16-0.18 ms at 2 ranks, 4 parts of
  // 256 KiB), the peers' single-copy reads progressing only inside MPI calls.
  template <class T>
  struct gather_batch : detail::finished_on_completion<gather_batch<T>> {
    struct own_chunk {
      const T* from;
      T* to;
      std::size_t count;
    };
    pending_mpi<std::vector<MPI_Request>> messages;
    std::vector<own_chunk> own;

    pending_mpi<std::vector<MPI_Request>>& awaited() { return messages; }
    void finish() {
      for (const own_chunk& chunk : own) std::copy_n(chunk.from, chunk.count, chunk.to);
    }
  };
  // The batch's datatypes (datatypes.hpp).
  template <class T>
  using hindexed = detail::hindexed<T>;
  static MPI_Aint address_of(const void* where) { return detail::address_of(where); }
  // The batch as shared_gather reads it, where reads_in_place; nothing otherwise.
  template <class T, class Space>
  [[nodiscard]] std::optional<detail::shared_gather::located> located_in_place(
      std::span<const gather_part<T, Space>> parts) const {
    if constexpr (host_accessible<Space>) {
      if (size_ == 1 || !windows_ || windows_->live.empty() || !reads_directly<Space>()) return std::nullopt;
      std::vector<detail::shared_gather::part> bytes;
      bytes.reserve(parts.size());
      for (const gather_part<T, Space>& part : parts)
        bytes.push_back({reinterpret_cast<const std::byte*>(part.send.data()),
                         reinterpret_cast<std::byte*>(part.recv.data()), part.send.size_bytes()});
      return detail::shared_gather::locate(*windows_, std::move(bytes));
    } else {
      return std::nullopt;
    }
  }
  template <class T, class Space>
  static std::size_t total_sent(std::span<const gather_part<T, Space>> parts) {
    std::size_t total = 0;
    for (const gather_part<T, Space>& part : parts) total += part.send.size();
    return total;
  }
  [[nodiscard]] request pending(MPI_Request handle, std::string_view function) const;

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
  struct staged : detail::finished_on_completion<staged<T, Space>> {
    staged(std::size_t count, span_in<T, Space> result) : output(count), target(result) {}
    [[nodiscard]] span_in<T, staging_space> host() const noexcept { return output.span(); }

    request& awaited() { return on_host; }
    void finish() {
      if (target.data() != nullptr) detail::transfer(target, span_in<const T, staging_space>(output.span()));
      target = {};
    }

    detail::owned_elements<T, staging_space> input;   // the send copy of a reduce-scatter
    detail::owned_elements<T, staging_space> output;  // the result, gathered or reduced on the host
    span_in<T, Space> target;
    request on_host;
  };

  [[nodiscard]] detail::wait_rule waits() const noexcept { return {options_.timeout, yields_}; }
  [[nodiscard]] bool timed() const noexcept { return waits().timed(); }

  // Throws collective_mismatch on every rank unless every rank is making the same call.
  void verify_call(std::string_view function, detail::collective_call call);

  // A small batch of reduce-scatters as one MPI_Ireduce_scatter_block: the parts' chunks packed
  // rank-major (FSDP2's chunk_cat), the sums unpacked into the recvs once they are in. E.g. parts
  // of 2 and 3 elements a rank at 2 ranks: packed = [p0 chunk 0 | p1 chunk 0 | p0 chunk 1 | p1 chunk 1].
  template <class T, class Space>
  struct packed_parts : detail::finished_on_completion<packed_parts<T, Space>> {
    packed_parts(int size, std::span<const reduce_scatter_part<T, Space>> batch, std::size_t total,
                 scale_type<T> scale)
        : parts(batch.begin(), batch.end()), packed(static_cast<std::size_t>(size) * total), sums(total), factor(scale) {
      T* into = packed.span().data();
      for (int rank = 0; rank < size; ++rank)
        for (const reduce_scatter_part<T, Space>& part : parts)
          into = std::copy_n(part.send.data() + static_cast<std::size_t>(rank) * part.recv.size(), part.recv.size(), into);
    }
    request& awaited() { return sums_pending; }
    void finish() {
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
      return request(detail::ring_reduce_scatter<T, Space>(comm_, rank_, size_, next_tag(), send, recv, factor,
                                                   function, waits()));
    }
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter_block(send.data(), recv.data(), count, detail::mpi_datatype<T>(),
                                    detail::sum_operation<T>(), comm_, &handle),
          function, "MPI_Ireduce_scatter_block");
    return detail::multiplied_once_complete<T, Space>(pending(handle, function), span_in<T, Space>(recv), factor);
  }
  template <class T>
  request start_all_to_all(std::string_view function, std::span<const T> send, std::span<T> recv) {
    detail::check_all_to_all(function, size_, send, recv);
    const std::size_t block = send.size() / static_cast<std::size_t>(size_);
    const int count = detail::checked_int_count(function, "a block of send", block);
    verify_call(function, {detail::collective_kind::all_to_all, detail::element_code<T>(), block, 0});
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ialltoall(send.data(), count, detail::mpi_datatype<T>(), recv.data(), count, detail::mpi_datatype<T>(),
                        comm_, &handle),
          function, "MPI_Ialltoall");
    return pending(handle, function);
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
    // Sums only: a max or min of a NaN would depend on which operand comes first.
    if (size_ == 2 && kind == detail::collective_kind::all_reduce_sum && !data.empty())
      return exchange_and_reduce<T>(data, count, kind, function);
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count, detail::mpi_datatype<T>(),
                         operation_of<T>(kind), comm_, &handle),
          function, "MPI_Iallreduce");
    return pending(handle, function);
  }
  // A sum of two ranks as one exchange and MPI_Reduce_local: both link directions busy at once, where
  // Open MPI's binomial tree (below 4 ranks) uses one at a time (docs/cluster.md); x0 + x1 == x1 + x0.
  template <class T>
  struct exchanged_reduction : detail::finished_on_completion<exchanged_reduction<T>> {
    pending_mpi<std::array<MPI_Request, 2>> messages;   // the receive and the send
    detail::owned_elements<T, Kokkos::HostSpace> peer;  // the peer's values, owned: a timeout keeps them
    std::span<T> data;
    MPI_Op operation = MPI_OP_NULL;
    std::string_view function;

    pending_mpi<std::array<MPI_Request, 2>>& awaited() { return messages; }
    void finish() {
      check(MPI_Reduce_local(peer.span().data(), data.data(), static_cast<int>(data.size()),
                             detail::mpi_datatype<T>(), operation),
            function, "MPI_Reduce_local");
    }
  };
  template <class T>
  request exchange_and_reduce(std::span<T> data, int count, detail::collective_kind kind,
                              std::string_view function) {
    const int tag = next_tag(), other = 1 - rank_;
    detail::owned_elements<T, Kokkos::HostSpace> peer(data.size());
    std::array<MPI_Request, 2> handles{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    check(MPI_Irecv(peer.span().data(), count, detail::mpi_datatype<T>(), other, tag, comm_, &handles[0]),
          function, "MPI_Irecv");
    check(MPI_Isend(data.data(), count, detail::mpi_datatype<T>(), other, tag, comm_, &handles[1]), function,
          "MPI_Isend");
    exchanged_reduction<T> state{};
    state.messages = {handles, function, waits(), rank_, size_};
    state.peer = std::move(peer);
    state.data = data;
    state.operation = operation_of<T>(kind);
    state.function = function;
    return request(std::move(state));
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
    if (timed()) {  // on a copy the request owns: a timeout leaves MPI nothing of the caller's
      return detail::wait_on_own_copy<T>({}, data, true, [&](std::span<const T>, std::span<T> copy) {
        return start_all_reduce(copy, kind, function);
      });
    }
    const int count = detail::checked_int_count(function, "data", data.size());
    verify_call(function, {kind, detail::element_code<T>(), data.size(), 0});
    check(MPI_Allreduce(MPI_IN_PLACE, data.data(), count, detail::mpi_datatype<T>(),
                        operation_of<T>(kind), comm_),
          function, "MPI_Allreduce");
  }

  void free_communicator() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::size_t ring_min_bytes_ = default_reduce_scatter_ring_min_bytes;
  std::uint64_t tagged_calls_ = 0;  // ring reduce-scatters and gather batches started: the next one's tag
  mpi_options options_;
  std::uint64_t checked_calls_ = 0;  // collectives compared across ranks, for the messages
  bool yields_ = true;  // waits yield between tests: the node runs more ranks than CPUs (wait_rule)
  std::shared_ptr<detail::shared_windows> windows_ = std::make_shared<detail::shared_windows>();  // allocate_shared's
};

static_assert(communicator<mpi>);
static_assert(communicator_in<mpi, Kokkos::HostSpace>);

}  // namespace kfsdp::comm
