#pragma once
// The MPI backend's shared memory (mpi::allocate_shared) and the all-gather that reads it in place
// (mpi::iall_gather_parts where every part's send lies in it). Compiled into kfsdp_mpi
// (src/comm/mpi/shared_memory.cpp).
//
// A window is one MPI_Win_allocate_shared over a communicator whose ranks share a node: each rank
// has a segment of its own, and every rank maps every segment (MPI_Win_shared_query). A send at
// offset o of rank r's segment is read by any rank at bases[r] + o: nothing is sent. E.g. an
// engine's parameter shards, a segment a rank, gathered at 2 ranks:
//
//   rank 0's segment:  [ bucket 0: p0 chunk | p1 chunk ][ bucket 1 ... ]   at bases[0] in both ranks
//   rank 1's segment:  [ bucket 0: p0 chunk | p1 chunk ][ bucket 1 ... ]   at bases[1]
//   rank 0 gathers bucket 0:  p0 recv[chunk 1] = bases[1] + 0,  p1 recv[chunk 1] = bases[1] + |p0 chunk|
//
// Against the same gather as messages (a message a part a peer, each Open MPI rendezvous copying
// its head twice), one small all-gather and a barrier: 0.75-0.85 of a blocking MPI_Allgather of
// the same bytes at 2 ranks, 1-16 MiB (docs/performance.md).

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <kfsdp/comm/shared_memory.hpp>
#include <kfsdp/comm/mpi/call_check.hpp>

namespace kfsdp::comm::detail {

// One window: the n-th a communicator made (its serial, the same on every rank), and where each
// rank's segment lies in this process.
struct shared_window {
  std::uint64_t serial = 0;
  MPI_Win window = MPI_WIN_NULL;
  std::vector<std::byte*> bases;  // bases[r]: rank r's segment
  std::byte* own = nullptr;       // this rank's segment (bases[rank])
  std::size_t bytes = 0;          // its length (the memory handed out lies inside, aligned)
};

// A communicator's live windows, shared with the owners that free them (shared_bytes::owner).
struct shared_windows {
  std::vector<shared_window> live;
  std::uint64_t made = 0;

  // The window whose segment on this rank holds [data, data + bytes), and the offset there; null
  // where none does.
  [[nodiscard]] const shared_window* holding(const std::byte* data, std::size_t bytes,
                                             std::size_t& offset) const;
  // The live window with this serial; throws std::logic_error where there is none (the ranks made
  // or freed windows in different orders).
  [[nodiscard]] const shared_window& with_serial(std::uint64_t serial) const;
};

// Where allocate_window's memory starts: a cache line, as Kokkos aligns its host allocations.
inline constexpr std::size_t shared_alignment = 64;

// Whether the node's shared-memory filesystem (/dev/shm, where Open MPI backs its windows) has room
// for `ranks` segments of `bytes` more, with an eighth to spare: a window larger than what is free there
// faults (SIGBUS) when its pages are first touched, as in a container whose /dev/shm is 64 MiB. True where
// there is no /dev/shm to ask (MPI backs the window elsewhere, and fails cleanly if it cannot).
[[nodiscard]] bool shared_memory_room(std::uint64_t bytes, int ranks);

// A window of `bytes` on this rank over `comm`, whose ranks must share a node, registered in
// `windows`; its owner unregisters and frees it (MPI_Win_free, collective), once the ranks have met
// in a barrier within `waits`' limit (else, and while unwinding an exception, MPI_Finalize frees it).
// Collective.
[[nodiscard]] shared_bytes allocate_window(MPI_Comm comm, int size, std::size_t bytes,
                                           const std::shared_ptr<shared_windows>& windows, wait_rule waits);

// One batch of all-gathers read in place, each part's chunk `bytes` long on every rank:
//   1. an MPI_Iallgather of where each rank's sends lie ((serial, offset) a part): once it is in,
//      every rank's sends are final;
//   2. each peer's chunk of each part copied out of its segment into recv + peer·bytes, then this
//      rank's own chunks;
//   3. an empty message on the call's tag to every peer, and one from every peer awaited (their
//      receives posted at the start): complete once every rank has copied, so that no rank reads a
//      send after its owner's request completes, as with a message.
// Steps 2 and 3 run inside test() and wait(), as the ring's rounds do. They start no collective,
// so test() may be called at any time (the compute thread's polls between kernels): only what
// the constructor starts (step 1) must be in the same order on every rank.
class shared_gather {
 public:
  struct part {
    const std::byte* send;
    std::byte* recv;
    std::size_t bytes;  // a rank's chunk
  };

  // A batch whose every send lies in a window: the parts, and where each send lies ((serial,
  // offset) a part; an empty part anywhere).
  struct located {
    std::vector<part> parts;
    std::vector<std::uint64_t> where;
  };
  // The batch located in `windows`; nothing where a send lies outside them.
  [[nodiscard]] static std::optional<located> locate(const shared_windows& windows, std::vector<part> parts);

  // Starts step 1.
  shared_gather(MPI_Comm comm, int rank, int size, int tag, std::shared_ptr<const shared_windows> windows,
                located batch, std::string_view function, wait_rule waits);
  shared_gather(shared_gather&&) noexcept = default;
  shared_gather& operator=(shared_gather&&) = delete;
  ~shared_gather() = default;

  bool test();
  void wait();

 private:
  void copy_in();  // step 2, then step 3's sends

  std::shared_ptr<const shared_windows> windows_;
  std::vector<part> parts_;
  std::vector<std::uint64_t> where_;     // this rank's (serial, offset) a part (located::where)
  std::vector<std::uint64_t> everyone_;  // every rank's, rank-major
  MPI_Comm comm_;
  int rank_;
  int size_;
  int tag_;
  std::string_view function_;
  wait_rule waits_;
  MPI_Request located_ = MPI_REQUEST_NULL;  // step 1
  std::vector<MPI_Request> copied_;         // step 3: a receive from each peer, then a send to each
  bool copied_in_ = false;
};

}  // namespace kfsdp::comm::detail
