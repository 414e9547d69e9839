#pragma once
// Argument checks shared by every communicator backend (self, mpi, nccl): one implementation, so
// every backend reports a bad span size, root or overlap in the same words. Each throws
// std::invalid_argument naming the function, the parameter, the size seen and the size expected:
//
//   kfsdp::comm::mpi::all_gather: recv has 10 elements, expected size()*send.size() = 3*4 = 12
//
// `function` is the fully qualified name the user called, e.g. "kfsdp::comm::mpi::iall_gather".

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace kfsdp::comm::detail {

// Byte ranges [first, first + bytes): pointers compared as integers, so device pointers work too.
struct byte_range {
  std::uintptr_t first;
  std::size_t bytes;

  template <class T>
  static byte_range of(std::span<T> elements) noexcept {
    return {reinterpret_cast<std::uintptr_t>(elements.data()), elements.size_bytes()};
  }
  [[nodiscard]] bool overlaps(const byte_range& other) const noexcept {
    return bytes != 0 && other.bytes != 0 && first < other.first + other.bytes &&
           other.first < first + bytes;
  }
};

inline void check_all_gather_arguments(std::string_view function, int rank, int size,
                                       std::size_t send_count, byte_range send,
                                       std::size_t recv_count, byte_range recv,
                                       std::size_t element_bytes) {
  const auto ranks = static_cast<std::size_t>(size);
  if (recv_count % ranks != 0 || recv_count / ranks != send_count) {
    throw std::invalid_argument(
        fmt::format("{}: recv has {} elements, expected size()*send.size() = {}*{} = {}", function,
                    recv_count, size, send_count, ranks * send_count));
  }
  const std::uintptr_t in_place_send =
      recv.first + static_cast<std::uintptr_t>(rank) * send_count * element_bytes;
  if (send.overlaps(recv) && send.first != in_place_send) {
    throw std::invalid_argument(fmt::format(
        "{}: send and recv overlap; the only overlap allowed is in place, send.data() == "
        "recv.data() + rank()*send.size() = recv.data() + {}*{}",
        function, rank, send_count));
  }
}

inline void check_reduce_scatter_arguments(std::string_view function, int size,
                                           std::size_t send_count, byte_range send,
                                           std::size_t recv_count, byte_range recv) {
  const auto ranks = static_cast<std::size_t>(size);
  if (send_count % ranks != 0 || send_count / ranks != recv_count) {
    throw std::invalid_argument(
        fmt::format("{}: send has {} elements, expected size()*recv.size() = {}*{} = {}", function,
                    send_count, size, recv_count, ranks * recv_count));
  }
  if (send.overlaps(recv)) {
    throw std::invalid_argument(fmt::format(
        "{}: send and recv overlap; reduce_scatter_sum needs separate buffers", function));
  }
}

// all_gather(send, recv): sizes (requirement 2 of the communicator concept) and overlap.
template <class T>
void check_all_gather(std::string_view function, int rank, int size, std::span<const T> send,
                      std::span<T> recv) {
  check_all_gather_arguments(function, rank, size, send.size(), byte_range::of(send), recv.size(),
                             byte_range::of(recv), sizeof(T));
}

// A batch's parts must not write over one another: no recv overlapping another part's recv, and no
// send another part's recv (a part's own send and recv are its collective's check).
template <class Parts>
void check_parts_disjoint(std::string_view function, const Parts& parts) {
  std::vector<std::pair<byte_range, std::size_t>> recvs;  // by address, the empty ones left out
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (!parts[i].recv.empty()) recvs.emplace_back(byte_range::of(parts[i].recv.span()), i);
  std::sort(recvs.begin(), recvs.end(), [](const auto& a, const auto& b) { return a.first.first < b.first.first; });
  const auto overlap = [&](std::string_view what, std::size_t i, std::size_t j) {
    return std::invalid_argument(fmt::format("{}: parts[{}].{} overlaps parts[{}].recv; each part needs a recv of its own",
                                             function, i, what, j));
  };
  for (std::size_t k = 1; k < recvs.size(); ++k)  // sorted: an overlap shows between neighbours
    if (recvs[k - 1].first.overlaps(recvs[k].first)) throw overlap("recv", recvs[k].second, recvs[k - 1].second);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const byte_range send = byte_range::of(parts[i].send.span());
    if (send.bytes == 0) continue;
    // Only the last recv starting before the send's end and the one before it can reach it.
    auto after = std::partition_point(recvs.begin(), recvs.end(),
                                      [&](const auto& r) { return r.first.first < send.first + send.bytes; });
    for (int back = 0; back < 2 && after != recvs.begin(); ++back) {
      --after;
      if (after->second != i && after->first.overlaps(send)) throw overlap("send", i, after->second);
    }
  }
}

// A batch of all-gathers (iall_gather_parts): each part as iall_gather(send, recv), the message
// naming the part; the parts disjoint.
template <class Parts>
void check_all_gather_parts(std::string_view function, int rank, int size, const Parts& parts) {
  for (std::size_t i = 0; i < parts.size(); ++i) {
    try {
      check_all_gather(function, rank, size, parts[i].send.span(), parts[i].recv.span());
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(fmt::format("{} (parts[{}])", error.what(), i));
    }
  }
  check_parts_disjoint(function, parts);
}

// reduce_scatter_sum(send, recv): sizes (requirement 3) and overlap.
template <class T>
void check_reduce_scatter(std::string_view function, int size, std::span<const T> send,
                          std::span<T> recv) {
  check_reduce_scatter_arguments(function, size, send.size(), byte_range::of(send), recv.size(),
                                 byte_range::of(recv));
}

// A batch of reduce-scatters (ireduce_scatter_sum_parts): each part as ireduce_scatter_sum(send,
// recv), the message naming the part; the parts disjoint.
template <class Parts>
void check_reduce_scatter_parts(std::string_view function, int size, const Parts& parts) {
  for (std::size_t i = 0; i < parts.size(); ++i) {
    try {
      check_reduce_scatter(function, size, parts[i].send.span(), parts[i].recv.span());
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(fmt::format("{} (parts[{}])", error.what(), i));
    }
  }
  check_parts_disjoint(function, parts);
}

// all_to_all(send, recv): equal sizes, a whole block a rank (requirement 11 of the communicator
// concept), and separate buffers.
inline void check_all_to_all_arguments(std::string_view function, int size, std::size_t send_count,
                                       byte_range send, std::size_t recv_count, byte_range recv) {
  const auto ranks = static_cast<std::size_t>(size);
  if (send_count % ranks != 0) {
    throw std::invalid_argument(fmt::format(
        "{}: send has {} elements, expected a multiple of size() = {} (one block a rank)", function,
        send_count, size));
  }
  if (recv_count != send_count) {
    throw std::invalid_argument(fmt::format("{}: recv has {} elements, expected send.size() = {}",
                                            function, recv_count, send_count));
  }
  if (send.overlaps(recv)) {
    throw std::invalid_argument(fmt::format(
        "{}: send and recv overlap; all_to_all needs separate buffers", function));
  }
}
template <class T>
void check_all_to_all(std::string_view function, int size, std::span<const T> send,
                      std::span<T> recv) {
  check_all_to_all_arguments(function, size, send.size(), byte_range::of(send), recv.size(),
                             byte_range::of(recv));
}

// broadcast(data, root): 0 <= root < size() (requirement 4).
inline void check_root(std::string_view function, int root, int size) {
  if (root < 0 || root >= size) {
    throw std::invalid_argument(
        fmt::format("{}: root is {}, expected 0 <= root < size() = {}", function, root, size));
  }
}

// An element count that a backend must pass as `int` (MPI): larger is an error, not an overflow.
inline int checked_int_count(std::string_view function, std::string_view parameter,
                             std::size_t count) {
  constexpr auto int_max = static_cast<std::size_t>(std::numeric_limits<int>::max());
  if (count > int_max) {
    throw std::invalid_argument(fmt::format(
        "{}: {} has {} elements, expected at most INT_MAX = {} (the count of one MPI call is an "
        "int); split the buffer into several calls",
        function, parameter, count, int_max));
  }
  return static_cast<int>(count);
}

}  // namespace kfsdp::comm::detail
