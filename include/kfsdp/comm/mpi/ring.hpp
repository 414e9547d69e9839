#pragma once
// kfsdp's ring reduce-scatter over MPI point-to-point messages (mpi::ireduce_scatter_sum from
// mpi::reduce_scatter_ring_min_bytes() a chunk, and mpi::ireduce_scatter_sum_parts), as a request
// state: each test() advances the rounds whose messages are in, wait() runs the rest.
//
// A reduce-scatter as size-1 rounds of a ring (rank r sends to r+1, receives from r-1).
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

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include <kfsdp/comm/batched_collectives.hpp>
#include <kfsdp/comm/memory_space.hpp>
#include <kfsdp/comm/mpi/call_check.hpp>
#include <kfsdp/comm/mpi/datatypes.hpp>

namespace kfsdp::comm::detail {

inline constexpr std::size_t ring_segment_bytes = 256 * 1024;

// The ring's schedule, shared by ring_reduce_scatter and ring_over_parts: (size - 1) rounds of a
// block's segments, two steps in flight, each step a receive from the left into scratch and a send
// to the right. Ring (CRTP) sends a step's segment (send_step) and adds the received one into its
// sums (add_step); the last round's addition multiplies by the factor (no pass of its own).
template <class T, class Space, class Ring>
class ring_steps {
 public:
  bool test() {
    while (finished_ < steps_) {
      int complete = 0;
      check_mpi(MPI_Testall(2, pending_[finished_ % 2], &complete, MPI_STATUSES_IGNORE), function_, "MPI_Testall");
      if (complete == 0) return false;
      finish_step();
    }
    return true;
  }
  void wait() {
    if (waits_.timed()) return wait_polling(*this, function_, waits_, rank_, size_);
    while (finished_ < steps_) {
      check_mpi(MPI_Waitall(2, pending_[finished_ % 2], MPI_STATUSES_IGNORE), function_, "MPI_Waitall");
      finish_step();
    }
  }

 protected:
  struct step_range {
    int round;
    std::size_t offset;  // into the block
    std::size_t length;
  };

  ring_steps(MPI_Comm comm, int rank, int size, int tag, scale_type<T> factor, std::string_view function,
             wait_rule waits)
      : comm_(comm), rank_(rank), size_(size), tag_(tag), factor_(factor), function_(function), waits_(waits) {}

  // Blocks of `count` elements (count > 0, at most INT_MAX: checked by the caller; size > 1):
  // posts the first steps.
  void start(std::size_t count) {
    count_ = count;
    segment_ = std::min(count_, std::max<std::size_t>(1, ring_segment_bytes / sizeof(T)));
    segments_per_round_ = (count_ + segment_ - 1) / segment_;
    steps_ = static_cast<std::size_t>(size_ - 1) * segments_per_round_;
    // A round's first segment may only leave once the last round computed it.
    depth_ = segments_per_round_ >= 2 ? 2 : 1;
    incoming_ = owned_elements<T, Space>(2 * segment_);  // owned, so the posted receives survive moving the state
    post_ready_steps();
  }

  [[nodiscard]] int left() const noexcept { return (rank_ - 1 + size_) % size_; }
  [[nodiscard]] int right() const noexcept { return (rank_ + 1) % size_; }

  MPI_Comm comm_;
  int rank_;
  int size_;
  int tag_;
  scale_type<T> factor_;  // multiplies the sums (1: a plain reduce-scatter)
  std::string_view function_;

 private:
  [[nodiscard]] step_range range_of(std::size_t step) const {
    const std::size_t offset = (step % segments_per_round_) * segment_;
    return {static_cast<int>(step / segments_per_round_), offset, std::min(segment_, count_ - offset)};
  }
  [[nodiscard]] T* scratch(std::size_t step) const { return incoming_.span().data() + (step % 2) * segment_; }

  void post_ready_steps() {
    for (; posted_ < steps_ && posted_ - finished_ < depth_; ++posted_) {
      const step_range step = range_of(posted_);
      MPI_Request* requests = pending_[posted_ % 2];
      check_mpi(MPI_Irecv(scratch(posted_), static_cast<int>(step.length), mpi_datatype<T>(), left(), tag_, comm_,
                          &requests[0]),
                function_, "MPI_Irecv");
      static_cast<Ring&>(*this).send_step(step, &requests[1]);
    }
  }

  // The step's two messages are done, so its slice of the sums may become partial + own block.
  void finish_step() {
    const step_range step = range_of(finished_);
    const int block = ((rank_ - step.round - 2) % size_ + size_) % size_;
    const scale_type<T> factor = step.round == size_ - 2 ? factor_ : scale_type<T>(1);  // the last round scales
    static_cast<Ring&>(*this).add_step(step, block, scratch(finished_), factor);
    ++finished_;
    post_ready_steps();
  }

  wait_rule waits_;
  std::size_t count_ = 0;                // elements a block
  std::size_t segment_ = 0;              // elements a message
  std::size_t segments_per_round_ = 0;
  std::size_t steps_ = 0;                // (size - 1) rounds of segments_per_round_ messages
  std::size_t depth_ = 1;                // steps in flight at once
  owned_elements<T, Space> incoming_;
  MPI_Request pending_[2][2] = {{MPI_REQUEST_NULL, MPI_REQUEST_NULL}, {MPI_REQUEST_NULL, MPI_REQUEST_NULL}};
  std::size_t posted_ = 0;
  std::size_t finished_ = 0;
};

// One reduce-scatter: block b is send[b*count, (b+1)*count); the partial sums are kept in recv.
template <class T, class Space>
class ring_reduce_scatter : public ring_steps<T, Space, ring_reduce_scatter<T, Space>> {
  using base = ring_steps<T, Space, ring_reduce_scatter<T, Space>>;
  friend base;

 public:
  ring_reduce_scatter(MPI_Comm comm, int rank, int size, int tag, std::span<const T> send, std::span<T> recv,
                      scale_type<T> factor, std::string_view function, wait_rule waits)
      : base(comm, rank, size, tag, factor, function, waits), send_(send.data()), recv_(recv.data()),
        count_(recv.size()) {
    if (size == 1) {
      detail::copy(span_in<const T, Space>(send), span_in<T, Space>(recv));
      detail::multiply(span_in<T, Space>(recv), factor);
      return;
    }
    this->start(count_);
  }

 private:
  [[nodiscard]] const T* own_block(int block) const { return send_ + static_cast<std::size_t>(block) * count_; }

  void send_step(const typename base::step_range& step, MPI_Request* request) {
    // Round 0 passes on this rank's own block r-1; later rounds the partial sum kept in recv.
    const T* outgoing = (step.round == 0 ? own_block(this->left()) : recv_) + step.offset;
    check_mpi(MPI_Isend(outgoing, static_cast<int>(step.length), mpi_datatype<T>(), this->right(), this->tag_,
                        this->comm_, request),
              this->function_, "MPI_Isend");
  }
  // A kernel in Space's execution space, complete before the next send reads the sum.
  void add_step(const typename base::step_range& step, int block, const T* incoming, scale_type<T> factor) {
    detail::add(span_in<const T, Space>(incoming, step.length),
                span_in<const T, Space>(own_block(block) + step.offset, step.length),
                span_in<T, Space>(recv_ + step.offset, step.length), factor);
  }

  const T* send_;
  T* recv_;
  std::size_t count_;
};

// The ring over a batch of parts (mpi::ireduce_scatter_sum_parts). Block b is the concatenation of
// every part's chunk b; a step moves a segment [offset, offset + length) of it as one message
// described by an hindexed datatype over the pieces of the parts it covers, or contiguous where it
// lies in one part (round 0 from the parts' sends, later rounds from their recvs, which hold the
// partial sums), into a contiguous scratch segment, then adds piece by piece into the recvs.
template <class T, class Space>
class ring_over_parts : public ring_steps<T, Space, ring_over_parts<T, Space>> {
  using base = ring_steps<T, Space, ring_over_parts<T, Space>>;
  friend base;

 public:
  ring_over_parts(MPI_Comm comm, int rank, int size, int tag, std::span<const reduce_scatter_part<T, Space>> parts,
                  scale_type<T> factor, std::string_view function, wait_rule waits)
      : base(comm, rank, size, tag, factor, function, waits), parts_(parts.begin(), parts.end()),
        starts_(parts.size() + 1, 0) {
    for (std::size_t i = 0; i < parts_.size(); ++i) starts_[i + 1] = starts_[i] + parts_[i].recv.size();
    if (size == 1 || starts_.back() == 0) {
      for (const reduce_scatter_part<T, Space>& part : parts_) {
        detail::copy(part.send, part.recv);
        detail::multiply(part.recv, factor);
      }
      return;
    }
    this->start(starts_.back());
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

  void send_step(const typename base::step_range& step, MPI_Request* request) {
    // Round 0 passes on this rank's own block r-1; later rounds the partial sums kept in the recvs.
    std::vector<int> lengths;
    std::vector<MPI_Aint> addresses;
    const std::size_t left = static_cast<std::size_t>(this->left());
    const T* first_piece = nullptr;
    for_each_piece(step.offset, step.length,
                   [&](const reduce_scatter_part<T, Space>& part, std::size_t from, std::size_t count, std::size_t) {
                     const T* outgoing =
                         step.round == 0 ? part.send.data() + left * part.recv.size() : part.recv.data();
                     if (first_piece == nullptr) first_piece = outgoing + from;
                     lengths.push_back(static_cast<int>(count));  // the total fits an int: checked by the caller
                     addresses.push_back(address_of(outgoing + from));
                   });
    if (lengths.size() == 1) {  // one piece: contiguous, which shared memory copies once (gather_alone_min_bytes)
      check_mpi(MPI_Isend(first_piece, lengths[0], mpi_datatype<T>(), this->right(), this->tag_, this->comm_, request),
                this->function_, "MPI_Isend");
    } else {
      const hindexed<T> outgoing(this->function_, static_cast<int>(lengths.size()), lengths, addresses);
      check_mpi(MPI_Isend(MPI_BOTTOM, 1, outgoing.type, this->right(), this->tag_, this->comm_, request),
                this->function_, "MPI_Isend");
    }
  }
  void add_step(const typename base::step_range& step, int block, const T* incoming, scale_type<T> factor) {
    for_each_piece(step.offset, step.length,
                   [&](const reduce_scatter_part<T, Space>& part, std::size_t from, std::size_t count, std::size_t at) {
                     const T* own = part.send.data() + static_cast<std::size_t>(block) * part.recv.size() + from;
                     detail::add(span_in<const T, Space>(incoming + at, count), span_in<const T, Space>(own, count),
                                 part.recv.subspan(from, count), factor);
                   });
  }

  std::vector<reduce_scatter_part<T, Space>> parts_;
  std::vector<std::size_t> starts_;  // part i's chunk starts at starts_[i] of a block; the block's size last
};

}  // namespace kfsdp::comm::detail
