#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// The shard plan: how every parameter is split along dim 0 over `world_size` ranks, which bucket
// (one all-gather / one reduce-scatter) it travels in, and where its local chunk lives in the
// rank's flat storage. A pure constexpr function of (param table, world size, bucketing).
//
// It lays the parameters out (bucket_offset, storage_offset); every offset derived
// from that layout (a rank's rows, a chunk in a gathered buffer, ...) is shard_mapping's.
//
// Worked example: Linear(4,13) then Linear(13,1) at world_size 3, bucketing layer
//   param        shape    chunk_rows  padding_rows  bucket  bucket_offset  storage_offset
//   0.weight     [13,4]   5           2             0       0              0
//   0.bias       [13]     5           2             0       20             20
//   1.weight     [1,13]   1           2             1       0              25
//   1.bias       [1]      1           2             1       13             38
//   bucket 0: params 0..1, 25 elements per rank, 65 real ones in all; bucket 1: params 2..3, 14 per
//   rank, 14 real; 39 per rank.
// Rank r holds rows [r·chunk_rows, (r+1)·chunk_rows) of each parameter; rows ≥ dim0 are zero padding
// (rank 2 holds rows 10..12 of 0.weight and two padding rows; ranks 1 and 2 hold only padding of 1.*).
//
// Storage is bucket after bucket, so a bucket's local shard (its parameters' chunks) is contiguous:
// the all-gather sends it as it is. One all-gather of the whole shard leaves a bucket as
// [rank 0's shard | rank 1's | ...], (world_size, shard_numel) row-major: the gathered layout
// (shard_mapping.hpp; the engine's per-parameter all-gathers write the unpacked one instead).
//
//   auto plan = kfsdp::make_shard_plan(kfsdp::param_table<M>, comm.size(), kfsdp::bucketing::layer);
//   static_assert(kfsdp::static_shard_plan<M, 3, kfsdp::bucketing::layer>.buckets.size() == 2);

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <kfsdp/meta/enum_names.hpp>
#include <kfsdp/model/param_table.hpp>

namespace kfsdp {

// Thunder's FSDPBucketingStrategy.
KFSDP_EXPORT enum class bucketing {
  none,   // one collective per parameter
  layer,  // one per leaf layer (a Linear's weight and bias together)
  block,  // one per transformer block; parameters outside blocks grouped by layer
};

inline constexpr enum_names<bucketing, 3> bucketing_names = {
    {bucketing::none, "none"}, {bucketing::layer, "layer"}, {bucketing::block, "block"}};
KFSDP_EXPORT constexpr std::string_view to_string(bucketing b) noexcept { return name_of(bucketing_names, b); }

// "none" | "layer" | "block" (case as written); anything else throws naming the value.
KFSDP_EXPORT inline bucketing parse_bucketing(std::string_view text) {
  return parse_named(text, bucketing_names, "bucketing");
}

struct param_shard {
  std::size_t dim0 = 0;            // rows of the full parameter
  std::size_t row_numel = 0;       // elements per row
  std::size_t chunk_rows = 0;      // rows per rank: ceil(dim0 / world_size)
  std::size_t padding_rows = 0;    // chunk_rows·world_size − dim0, zero-filled
  std::size_t bucket = 0;          // index of the bucket it travels in
  std::size_t bucket_offset = 0;   // element offset of its local chunk in the bucket's local shard
  std::size_t storage_offset = 0;  // element offset of its local chunk in the rank's flat storage

  [[nodiscard]] constexpr std::size_t chunk_numel() const noexcept { return chunk_rows * row_numel; }
  [[nodiscard]] constexpr std::size_t full_numel() const noexcept { return dim0 * row_numel; }
};

struct bucket_shard {
  std::size_t first_param = 0;     // parameters first_param .. first_param + param_count − 1
  std::size_t param_count = 0;
  std::size_t shard_numel = 0;     // elements of the bucket's local shard on every rank
  std::size_t storage_offset = 0;  // where that shard starts in the rank's flat storage
  std::size_t full_numel = 0;      // real elements of its parameters (full, unpadded)
};

template <class Params, class Buckets>
struct basic_shard_plan {
  std::size_t world_size = 0;
  kfsdp::bucketing bucketing = kfsdp::bucketing::none;
  Params params{};
  Buckets buckets{};
  std::size_t shard_numel = 0;    // elements of flat storage per rank (padding included)
  std::size_t full_numel = 0;     // elements of the unsharded, unpadded model
  std::size_t padding_numel = 0;  // padding elements over all ranks

  // Elements of a bucket's all-gathered buffer: world_size × its shard.
  [[nodiscard]] constexpr std::size_t gathered_numel(std::size_t bucket) const {
    return world_size * buckets[bucket].shard_numel;
  }
  // The largest all-gathered bucket (the unsharded buffer one bucket in flight needs).
  [[nodiscard]] constexpr std::size_t max_gathered_numel() const {
    std::size_t m = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) m = gathered_numel(b) > m ? gathered_numel(b) : m;
    return m;
  }
  friend constexpr bool operator==(const basic_shard_plan&, const basic_shard_plan&) = default;
};

constexpr bool operator==(const param_shard& a, const param_shard& b) noexcept {
  return a.dim0 == b.dim0 && a.row_numel == b.row_numel && a.chunk_rows == b.chunk_rows &&
         a.padding_rows == b.padding_rows && a.bucket == b.bucket &&
         a.bucket_offset == b.bucket_offset && a.storage_offset == b.storage_offset;
}
constexpr bool operator==(const bucket_shard& a, const bucket_shard& b) noexcept {
  return a.first_param == b.first_param && a.param_count == b.param_count &&
         a.shard_numel == b.shard_numel && a.storage_offset == b.storage_offset && a.full_numel == b.full_numel;
}

// The plan for a world size known at run time (also usable inside a constant expression).
KFSDP_EXPORT using shard_plan = basic_shard_plan<std::vector<param_shard>, std::vector<bucket_shard>>;

namespace detail {
// Parameters p and q share a bucket when they have the same key (the table lists a layer's and a
// block's parameters next to each other, so buckets are runs of equal keys).
struct bucket_key {
  bool by_block = false;
  std::size_t index = 0;
  friend constexpr bool operator==(const bucket_key&, const bucket_key&) = default;
};
constexpr bucket_key key_of(const param_info& p, std::size_t position, bucketing b) {
  switch (b) {
    case bucketing::none: return {false, position};
    case bucketing::layer: return {false, p.layer};
    case bucketing::block: return p.in_block() ? bucket_key{true, p.block} : bucket_key{false, p.layer};
  }
  return {};
}
}  // namespace detail

// The shard plan of `table` at `world_size` ranks. Throws std::invalid_argument for world_size 0
// or a parameter with a zero extent (a compile error when evaluated in a constant expression).
KFSDP_EXPORT constexpr shard_plan make_shard_plan(std::span<const param_info> table, std::size_t world_size,
                                     bucketing strategy) {
  if (world_size == 0)
    throw std::invalid_argument("kfsdp::make_shard_plan: world_size is 0, expected at least 1");
  if (table.empty())
    throw std::invalid_argument("kfsdp::make_shard_plan: the model has no parameters");
  shard_plan plan;
  plan.world_size = world_size;
  plan.bucketing = strategy;
  plan.params.resize(table.size());
  detail::bucket_key previous{};
  for (std::size_t i = 0; i < table.size(); ++i) {
    const param_info& info = table[i];
    if (info.numel == 0 || info.rank == 0 || info.shape[0] == 0)
      throw std::invalid_argument("kfsdp::make_shard_plan: parameter '" +
                                  std::string(info.name.view()) +
                                  "' has no elements, expected every extent to be at least 1");
    param_shard& p = plan.params[i];
    p.dim0 = info.dim0();
    p.row_numel = info.row_numel();
    p.chunk_rows = p.dim0 / world_size + (p.dim0 % world_size != 0);
    const auto what = [&] { return "make_shard_plan: parameter '" + std::string(info.name.view()) + "', padded"; };
    p.padding_rows = checked_mul(p.chunk_rows, world_size, what) - p.dim0;
    // Every rank's chunk and the gathered buffer (world_size chunks) must be addressable.
    (void)checked_mul(checked_mul(p.chunk_rows, p.row_numel, what), world_size, what);

    const detail::bucket_key key = detail::key_of(info, i, strategy);
    if (i == 0 || !(key == previous)) {
      plan.buckets.push_back(bucket_shard{i, 0, 0, plan.shard_numel, 0});
      previous = key;
    }
    bucket_shard& bucket = plan.buckets.back();
    p.bucket = plan.buckets.size() - 1;
    p.bucket_offset = bucket.shard_numel;
    p.storage_offset = plan.shard_numel;
    bucket.param_count += 1;
    bucket.shard_numel += p.chunk_numel();
    bucket.full_numel += p.full_numel();
    plan.shard_numel = checked_add(plan.shard_numel, p.chunk_numel(), [] { return "make_shard_plan: elements per rank"; });
    plan.full_numel = checked_add(plan.full_numel, p.full_numel(), [] { return "make_shard_plan: elements of the model"; });
    plan.padding_numel += p.padding_rows * p.row_numel;
  }
  // A bucket's gathered buffer (world_size shards) and the rank's storage in bytes (8 per element at most).
  for (const bucket_shard& b : plan.buckets)
    (void)checked_mul(checked_mul(b.shard_numel, world_size, [] { return "make_shard_plan: a bucket's gathered elements"; }), 8,
                      [] { return "make_shard_plan: a bucket's gathered bytes"; });
  return plan;
}

// A 64-bit fingerprint (FNV-1a) of everything that shapes the collectives of a plan: ranks compare
// it before the first collective, so a plan mismatch is an error instead of a hang.
KFSDP_EXPORT template <class Params, class Buckets>
constexpr std::uint64_t fingerprint(const basic_shard_plan<Params, Buckets>& plan) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint64_t v) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (v >> (8 * byte)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  };
  mix(plan.world_size);
  mix(static_cast<std::uint64_t>(plan.bucketing));
  mix(plan.params.size());
  for (const param_shard& p : plan.params) {
    mix(p.dim0);
    mix(p.row_numel);
    mix(p.bucket);
  }
  mix(plan.shard_numel);
  return h;
}

namespace detail {
// to = from element by element: a std::vector takes from's size, a std::array has it already.
template <class To, class From>
constexpr void assign_elements(To& to, const From& from) {
  if constexpr (requires { to.assign(from.begin(), from.end()); }) to.assign(from.begin(), from.end());
  else std::copy(from.begin(), from.end(), to.begin());
}

// The same plan in other containers (std::vector <-> std::array): every field copied.
template <class To, class Params, class Buckets>
constexpr To convert_plan(const basic_shard_plan<Params, Buckets>& from) {
  To to;
  to.world_size = from.world_size;
  to.bucketing = from.bucketing;
  assign_elements(to.params, from.params);
  assign_elements(to.buckets, from.buckets);
  to.shard_numel = from.shard_numel;
  to.full_numel = from.full_numel;
  to.padding_numel = from.padding_numel;
  return to;
}

template <class Model, std::size_t WorldSize, bucketing Strategy>
constexpr auto make_static_shard_plan() {
  constexpr std::size_t bucket_count =
      make_shard_plan(param_table<Model>, WorldSize, Strategy).buckets.size();
  constexpr std::size_t count = param_table<Model>.size();
  return convert_plan<basic_shard_plan<std::array<param_shard, count>, std::array<bucket_shard, bucket_count>>>(
      make_shard_plan(param_table<Model>, WorldSize, Strategy));
}
}  // namespace detail

// The plan of a fully static model at a world size known at compile time: the same
// make_shard_plan, evaluated by the compiler into std::arrays.
KFSDP_EXPORT template <class Model, std::size_t WorldSize, bucketing Strategy>
inline constexpr auto static_shard_plan = [] {
  static_assert(WorldSize >= 1, "kfsdp::static_shard_plan: WorldSize must be at least 1");
  return detail::make_static_shard_plan<Model, WorldSize, Strategy>();
}();

// The same plan held in std::vectors: to compare with one computed at run time, or to give
// fsdp_engine or kfsdp::trainer as their plan (checked there against the communicator).
KFSDP_EXPORT template <class Params, class Buckets>
constexpr shard_plan to_dynamic(const basic_shard_plan<Params, Buckets>& plan) {
  return detail::convert_plan<shard_plan>(plan);
}

}  // namespace kfsdp
