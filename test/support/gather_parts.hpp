#pragma once
// A batch of all-gathers as one bucket makes it (comm::iall_gather_parts), checked against what
// one all_gather a part would give, on any communicator. By default four parts of 3, 0, 5 and 1
// elements:
//
//   shard (send):    [part 0: 3 | part 1: 0 | part 2: 5]            this rank's chunks, adjacent
//   gathered (recv): [part 0: 3n] gap [part 2: 5n] gap [part 3: n] gap   gaps untouched
//
// The last part's send is this rank's slot of its own recv (in place).

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>
#include <doctest/doctest.h>

#include <kfsdp/comm/batched_collectives.hpp>
#include <kfsdp/comm/shared_memory.hpp>

#include "rank_values.hpp"

namespace kfsdp::test {

template <class T>
struct gather_parts_case {
  static constexpr std::size_t gap = 2;
  static T untouched() { return T(-7.0f); }

  int rank, ranks;
  std::vector<std::size_t> counts;  // each part's elements a rank; the last one in place
  std::vector<T> shard;     // the other parts' sends
  std::vector<T> gathered;  // every part's recv, gaps between
  std::vector<comm::gather_part<T, Kokkos::HostSpace>> parts;

  gather_parts_case(int rank_, int ranks_, std::vector<std::size_t> counts_ = {3, 0, 5, 1})
      : rank(rank_), ranks(ranks_), counts(std::move(counts_)) {
    const auto n = static_cast<std::size_t>(ranks);
    const std::size_t last = counts.size() - 1;
    std::size_t sent_total = 0, gathered_total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      if (i < last) sent_total += counts[i];
      gathered_total += n * counts[i] + (counts[i] > 0 ? gap : 0);
    }
    shard = contributions<T>(rank, sent_total);
    gathered.assign(gathered_total, untouched());
    std::size_t sent = 0, received = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const std::span<T> recv = std::span(gathered).subspan(received, n * counts[i]);
      std::span<const T> send = std::span<const T>(shard).subspan(std::min(sent, shard.size()), i < last ? counts[i] : 0);
      if (i == last) {  // in place: this rank's slot, filled with what it contributes
        const std::span<T> slot = recv.subspan(static_cast<std::size_t>(rank) * counts[i], counts[i]);
        for (std::size_t j = 0; j < counts[i]; ++j) slot[j] = contribution<T>(rank, sent + j);
        send = slot;
      }
      parts.push_back({comm::span_in<const T, Kokkos::HostSpace>(send), comm::span_in<T, Kokkos::HostSpace>(recv)});
      sent += counts[i];
      received += recv.size() + (counts[i] > 0 ? gap : 0);
    }
  }

  // The sends moved into `memory` (comm::allocate_shared's, say), at most shard.size() elements
  // needed: the batch then reads them there. The in-place part stays where it is.
  void send_from(std::span<T> memory) {
    std::copy(shard.begin(), shard.end(), memory.begin());
    std::size_t sent = 0;
    for (std::size_t i = 0; i + 1 < counts.size(); ++i) {
      parts[i].send = comm::span_in<const T, Kokkos::HostSpace>(memory.subspan(sent, counts[i]));
      sent += counts[i];
    }
  }

  // Every part's recv as all_gather leaves it; the gaps as they were.
  void check() const {
    std::size_t sent = 0, received = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      CAPTURE(i);
      std::size_t wrong = 0, first_wrong = 0;  // one check a part: big parts have thousands of elements
      for (int q = 0; q < ranks; ++q)
        for (std::size_t j = 0; j < counts[i]; ++j) {
          const std::size_t at = received + static_cast<std::size_t>(q) * counts[i] + j;
          if (double(gathered[at]) != double(contribution<T>(q, sent + j)) && wrong++ == 0) first_wrong = at;
        }
      CAPTURE(first_wrong);
      CHECK(wrong == 0);
      sent += counts[i];
      received += static_cast<std::size_t>(ranks) * counts[i];
      if (counts[i] > 0) {
        for (std::size_t j = 0; j < gap; ++j) CHECK(double(gathered[received + j]) == double(untouched()));
        received += gap;
      }
    }
  }
};

}  // namespace kfsdp::test
