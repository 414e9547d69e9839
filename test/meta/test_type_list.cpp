#include <doctest/doctest.h>

#include <stdexcept>
#include <type_traits>

#include <kfsdp/meta/type_list.hpp>

using namespace kfsdp::meta;

static_assert(mp_size<type_list<int, char, float>>::value == 3);
static_assert(mp_size<type_list<>>::value == 0);
static_assert(mp_contains<type_list<int, char>, char>::value);
static_assert(!mp_contains<type_list<int, char>, float>::value);
static_assert(mp_count_if<type_list<int, float, long>, std::is_integral>::value == 2);
static_assert(std::is_same_v<mp_find_if<type_list<float, long, int>, std::is_integral, void>, long>);
static_assert(std::is_same_v<mp_find_if<type_list<float>, std::is_integral, void>, void>);
static_assert(mp_with_index<3>(2, [](auto i) { return i.value * 10; }) == 20);

TEST_CASE("mp_with_index turns a run-time index into a compile-time one") {
  std::size_t seen = 99;
  mp_with_index<4>(3, [&](auto i) {
    static_assert(decltype(i)::value < 4);
    seen = decltype(i)::value;
  });
  CHECK(seen == 3);
  CHECK_THROWS_WITH_AS(mp_with_index<2>(2, [](auto) {}),
                       "kfsdp::meta::mp_with_index: index 2 is out of range, expected less than 2",
                       std::out_of_range);
}
