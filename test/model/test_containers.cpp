#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <kfsdp/model/containers.hpp>
#include <kfsdp/model/layers.hpp>

using namespace kfsdp;

using mlp = sequential<"mlp", linear<"fc", 4, 8>, linear<"out", 8, 2>>;
static_assert(container_descriptor<mlp>);
static_assert(descriptor<repeat<"h", 3, block<"", mlp>>>);
static_assert(block<"", mlp>::kind == layer_kind::block);

TEST_CASE("containers visit their children in order, repeat names copies by index") {
  std::vector<std::string> names;
  repeat<"h", 3, block<"", mlp>>{}.for_each_child(
      [&]<class Child>(const Child&, std::string_view name) { names.emplace_back(name); });
  CHECK(names == std::vector<std::string>{"0", "1", "2"});
  names.clear();
  mlp{}.for_each_child([&]<class Child>(const Child&, std::string_view name) { names.emplace_back(name); });
  CHECK(names == std::vector<std::string>{"fc", "out"});
  CHECK_THROWS_WITH_AS((repeat<"h", dyn, block<"", mlp>>(0, {})),
                       "kfsdp: repeat 'h': count is 0, expected at least 1", std::invalid_argument);
}
