// The C++20 module `kfsdp`: the backend-free public API (descriptors, param tables, shard plans,
// their fmt formatting, the communicator concept and the one-rank backend), fmt's pattern: every std and third-party header in the global module
// fragment, then kfsdp's own headers with KFSDP_MODULE defined so that they skip their includes
// and mark their contents `export`.
//
//   import kfsdp;
//   auto plan = kfsdp::make_shard_plan(kfsdp::param_table<kfsdp::gpt<2, 64, 32>>, 4, kfsdp::bucketing::block);
module;

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <initializer_list>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

export module kfsdp;

#define KFSDP_MODULE

#include <kfsdp/meta/fixed_string.hpp>
#include <kfsdp/meta/inline_string.hpp>
#include <kfsdp/meta/shape_string.hpp>
#include <kfsdp/meta/type_list.hpp>
#include <kfsdp/model/descriptor.hpp>
#include <kfsdp/model/layers.hpp>
#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/param_table.hpp>
#include <kfsdp/model/gpt.hpp>
#include <kfsdp/plan/shard_plan.hpp>
#include <kfsdp/plan/format.hpp>
#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>
#include <kfsdp/comm/self.hpp>

// fmt is part of the interface (a plan formats with fmt::format): importers get it too.
export namespace fmt {
using fmt::format;
using fmt::format_to;
using fmt::formatter;
using fmt::print;
}  // namespace fmt
