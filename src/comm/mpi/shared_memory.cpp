// The MPI backend's shared memory and the all-gather that reads it in place
// (include/kfsdp/comm/mpi/shared_memory.hpp).

#include <kfsdp/comm/mpi/mpi.hpp>
#include <kfsdp/comm/mpi/shared_memory.hpp>

#include <mpi.h>
#if defined(__linux__)
#include <sys/statvfs.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace kfsdp::comm::detail {

const shared_window* shared_windows::holding(const std::byte* data, std::size_t bytes,
                                             std::size_t& offset) const {
  const std::less_equal<const std::byte*> at_or_before;  // a total order, for pointers into different objects
  for (const shared_window& w : live) {
    if (at_or_before(w.own, data) && at_or_before(data + bytes, w.own + w.bytes)) {
      offset = static_cast<std::size_t>(data - w.own);
      return &w;
    }
  }
  return nullptr;
}

const shared_window& shared_windows::with_serial(std::uint64_t serial) const {
  for (const shared_window& w : live)
    if (w.serial == serial) return w;
  throw std::logic_error(
      fmt::format("kfsdp::comm::mpi: a peer's send lies in shared window {}, which this rank does not have "
                  "(the ranks made or freed their shared memory in different orders)",
                  serial));
}

bool shared_memory_room(std::uint64_t bytes, int ranks) {
#if defined(__linux__)
  struct statvfs room {};
  if (statvfs("/dev/shm", &room) != 0) return true;
  using wide = unsigned __int128;  // no product of these overflows it
  const wide needed = wide{bytes} * static_cast<unsigned>(std::max(ranks, 0));
  return wide{room.f_bavail} * room.f_frsize >= needed + needed / 8;
#else
  (void)bytes;
  (void)ranks;
  return true;
#endif
}

namespace {

// Unregisters and frees a window once its last shared_bytes is gone. MPI_Win_free is collective and
// has no timeout, so the ranks first meet in a barrier that has one (the communicator's): a rank
// whose peers never come leaves the window to MPI_Finalize (or the job's abort) instead of hanging,
// and so does a rank unwinding an exception, whose peers may be anywhere.
class window_owner {
 public:
  window_owner(std::weak_ptr<shared_windows> registry, std::uint64_t serial, MPI_Win window, MPI_Comm ranks,
               wait_rule waits)
      : registry_(std::move(registry)), serial_(serial), window_(window), ranks_(ranks), waits_(waits) {}
  window_owner(const window_owner&) = delete;  // one owner frees the window once
  window_owner& operator=(const window_owner&) = delete;
  ~window_owner() {
    if (auto registry = registry_.lock())
      std::erase_if(registry->live, [&](const shared_window& w) { return w.serial == serial_; });
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised || std::uncaught_exceptions() > 0) return;
    if (!all_ranks_here()) return;
    MPI_Win_unlock_all(window_);
    MPI_Win_free(&window_);
    MPI_Comm_free(&ranks_);
  }

 private:
  struct barrier {
    MPI_Request handle;
    bool test() {
      int complete = 0;
      MPI_Test(&handle, &complete, MPI_STATUS_IGNORE);
      return complete != 0;
    }
  };
  bool all_ranks_here() noexcept {
    constexpr std::string_view function = "kfsdp::comm::mpi (freeing shared memory)";
    barrier meeting{MPI_REQUEST_NULL};
    if (MPI_Ibarrier(ranks_, &meeting.handle) != MPI_SUCCESS) return false;
    if (!waits_.timed()) return MPI_Wait(&meeting.handle, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    int rank = 0, size = 0;
    MPI_Comm_rank(ranks_, &rank);
    MPI_Comm_size(ranks_, &size);
    try {
      wait_polling(meeting, function, waits_, rank, size);
      return true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s; the window is left to MPI_Finalize\n", e.what());
      return false;
    }
  }

  std::weak_ptr<shared_windows> registry_;
  std::uint64_t serial_;
  MPI_Win window_;
  MPI_Comm ranks_;  // a duplicate of the communicator's, for the barrier before the free
  wait_rule waits_;
};

}  // namespace

shared_bytes allocate_window(MPI_Comm comm, int size, std::size_t bytes, const std::shared_ptr<shared_windows>& windows,
                             wait_rule waits) {
  constexpr std::string_view function = "kfsdp::comm::mpi::allocate_shared";
  MPI_Info info = MPI_INFO_NULL;
  check_mpi(MPI_Info_create(&info), function, "MPI_Info_create");
  // A segment of its own a rank, each on pages of its own (first touched by its owner).
  check_mpi(MPI_Info_set(info, "alloc_shared_noncontig", "true"), function, "MPI_Info_set");
  // Open MPI starts a segment after a header of its own (8-byte aligned): ask for room to align.
  const std::size_t segment_bytes = bytes + shared_alignment;
  void* mine = nullptr;
  MPI_Win window = MPI_WIN_NULL;
  const int made =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(segment_bytes), 1, info, comm, &mine, &window);
  MPI_Info_free(&info);
  check_mpi(made, function, "MPI_Win_allocate_shared");
  // One passive epoch for the window's life: reads and writes are plain loads and stores, ordered by
  // MPI_Win_sync and the collectives around them.
  if (const int locked = MPI_Win_lock_all(MPI_MODE_NOCHECK, window); locked != MPI_SUCCESS) {
    MPI_Win_free(&window);
    check_mpi(locked, function, "MPI_Win_lock_all");
  }
  shared_window w{windows->made++, window, std::vector<std::byte*>(static_cast<std::size_t>(size)),
                  static_cast<std::byte*>(mine), segment_bytes};
  MPI_Comm ranks = MPI_COMM_NULL;
  if (const int duplicated = MPI_Comm_dup(comm, &ranks); duplicated != MPI_SUCCESS) {
    MPI_Win_unlock_all(window);
    MPI_Win_free(&window);
    check_mpi(duplicated, function, "MPI_Comm_dup");
  }
  auto owner = std::make_shared<window_owner>(windows, w.serial, window, ranks, waits);
  for (int r = 0; r < size; ++r) {
    MPI_Aint segment = 0;
    int unit = 0;
    void* base = nullptr;
    check_mpi(MPI_Win_shared_query(window, r, &segment, &unit, &base), function, "MPI_Win_shared_query");
    w.bases[static_cast<std::size_t>(r)] = static_cast<std::byte*>(base);
  }
  std::memset(mine, 0, segment_bytes);  // zero, as a Kokkos view starts
  windows->live.push_back(std::move(w));
  void* aligned = mine;
  std::size_t room = segment_bytes;
  std::align(shared_alignment, bytes, aligned, room);
  return {std::span<std::byte>(static_cast<std::byte*>(aligned), bytes), std::move(owner)};
}

std::optional<shared_gather::located> shared_gather::locate(const shared_windows& windows, std::vector<part> parts) {
  std::vector<std::uint64_t> where(2 * parts.size(), 0);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].bytes == 0) continue;  // nothing to read: anywhere will do
    std::size_t offset = 0;
    const shared_window* w = windows.holding(parts[i].send, parts[i].bytes, offset);
    if (w == nullptr) return std::nullopt;
    where[2 * i] = w->serial;
    where[2 * i + 1] = offset;
  }
  return located{std::move(parts), std::move(where)};
}

shared_gather::shared_gather(MPI_Comm comm, int rank, int size, int tag, std::shared_ptr<const shared_windows> windows,
                             located batch, std::string_view function, wait_rule waits)
    : windows_(std::move(windows)),
      parts_(std::move(batch.parts)),
      where_(std::move(batch.where)),
      everyone_(where_.size() * static_cast<std::size_t>(size)),
      comm_(comm),
      rank_(rank),
      size_(size),
      tag_(tag),
      function_(function),
      waits_(waits) {
  for (const shared_window& w : windows_->live) MPI_Win_sync(w.window);  // this rank's writes, visible to the peers
  const int count = static_cast<int>(where_.size());
  check_mpi(MPI_Iallgather(where_.data(), count, MPI_UINT64_T, everyone_.data(), count, MPI_UINT64_T, comm_,
                           &located_),
            function_, "MPI_Iallgather (where the sends lie)");
  copied_.reserve(2 * static_cast<std::size_t>(size_));
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank_)
      check_mpi(MPI_Irecv(nullptr, 0, MPI_BYTE, peer, tag_, comm_, &copied_.emplace_back()), function_,
                "MPI_Irecv (a peer has copied)");
}

void shared_gather::copy_in() {
  for (const shared_window& w : windows_->live) MPI_Win_sync(w.window);  // the peers' writes, seen here
  const std::size_t stride = where_.size();
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const std::uint64_t* located = everyone_.data() + static_cast<std::size_t>(peer) * stride;
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const part& p = parts_[i];
      if (p.bytes == 0) continue;
      const std::byte* from =
          windows_->with_serial(located[2 * i]).bases[static_cast<std::size_t>(peer)] + located[2 * i + 1];
      std::memcpy(p.recv + static_cast<std::size_t>(peer) * p.bytes, from, p.bytes);
    }
  }
  for (const part& p : parts_) {
    std::byte* own = p.recv + static_cast<std::size_t>(rank_) * p.bytes;
    if (p.bytes != 0 && own != p.send) std::memmove(own, p.send, p.bytes);
  }
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank_)
      check_mpi(MPI_Isend(nullptr, 0, MPI_BYTE, peer, tag_, comm_, &copied_.emplace_back()), function_,
                "MPI_Isend (this rank has copied)");
  copied_in_ = true;
}

bool shared_gather::test() {
  int complete = 0;
  if (!copied_in_) {
    check_mpi(MPI_Test(&located_, &complete, MPI_STATUS_IGNORE), function_, "MPI_Test");
    if (!complete) return false;
    copy_in();
  }
  check_mpi(MPI_Testall(static_cast<int>(copied_.size()), copied_.data(), &complete, MPI_STATUSES_IGNORE), function_,
            "MPI_Testall");
  return complete != 0;
}

void shared_gather::wait() {
  if (waits_.timed()) return wait_polling(*this, function_, waits_, rank_, size_);
  if (!copied_in_) {
    check_mpi(MPI_Wait(&located_, MPI_STATUS_IGNORE), function_, "MPI_Wait");
    copy_in();
  }
  check_mpi(MPI_Waitall(static_cast<int>(copied_.size()), copied_.data(), MPI_STATUSES_IGNORE), function_,
            "MPI_Waitall");
}

}  // namespace kfsdp::comm::detail
