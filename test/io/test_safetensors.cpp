// Tests for include/kfsdp/io/checkpoint/safetensors.hpp: a round trip through a real file, then one test per
// kind of malformed header, each checking that the message names the file (and the tensor).
#include <doctest/doctest.h>
#include <kfsdp/io/checkpoint/checksum.hpp>
#include <kfsdp/io/checkpoint/safetensors.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using kfsdp::io::dtype;
using kfsdp::io::format_error;
using kfsdp::io::parse_header;

constexpr std::string_view file_name = "ckpt/step_7.safetensors";

// A file made of an 8-byte length, `json` verbatim, and `data_bytes` zero bytes.
std::vector<std::byte> file_with_header(std::string_view json, std::size_t data_bytes,
                                        std::uint64_t declared_length) {
  std::vector<std::byte> bytes(8 + json.size() + data_bytes, std::byte{0});
  for (int byte = 0; byte < 8; ++byte)
    bytes[static_cast<std::size_t>(byte)] = static_cast<std::byte>((declared_length >> (8 * byte)) & 0xff);
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  return bytes;
}

std::vector<std::byte> file_with_header(std::string_view json, std::size_t data_bytes) {
  return file_with_header(json, data_bytes, json.size());
}

kfsdp::io::header_table parse(const std::vector<std::byte>& file) {
  return parse_header(file, file.size(), file_name);
}

// The message of the format_error that parsing `file` throws ("" and a failed check if none).
std::string parse_error(const std::vector<std::byte>& file) {
  try {
    (void)parse(file);
  } catch (const format_error& error) {
    return error.what();
  }
  FAIL_CHECK("parse_header accepted a malformed file");
  return {};
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// Checks that the message names the file, the tensor (when given) and says `what`.
void check_message(const std::string& message, std::string_view tensor, std::string_view what) {
  INFO("message: ", message);
  CHECK(contains(message, "'ckpt/step_7.safetensors'"));
  if (!tensor.empty()) CHECK(contains(message, std::string("tensor '").append(tensor).append("'")));
  CHECK(contains(message, what));
}

std::string tensor_json(std::string_view name, std::string_view type, std::string_view shape,
                        std::uint64_t begin, std::uint64_t end) {
  std::string json = "\"";
  json.append(name).append("\":{\"dtype\":\"").append(type).append("\",\"shape\":").append(shape);
  json.append(",\"data_offsets\":[").append(std::to_string(begin)).append(",");
  return json.append(std::to_string(end)).append("]}");
}

// "{" + entries + "}", spelled with append (GCC 12 warns falsely on "literal" + std::string&&).
std::string object_of(const std::string& entries) { return std::string("{").append(entries).append("}"); }

}  // namespace

TEST_CASE("make_header then parse_header through a file on disk gives back every tensor") {
  const std::vector<float> weight{1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  const std::vector<double> bias{0.5, -0.25, 8.0};
  const std::vector<std::int64_t> step{7};

  kfsdp::io::header_builder builder;
  builder.add_tensor("transformer.h.0.mlp.c_fc.weight", dtype::F32, {2, 3})
      .add_tensor("transformer.h.0.mlp.c_fc.bias", dtype::F64, {3})
      .add_tensor("step", dtype::I64, {})
      .add_tensor("empty", dtype::F32, {0, 4})
      .add_metadata("format", "pt")
      .add_metadata("weight.checksum",
                    kfsdp::io::checksum_hex(kfsdp::io::checksum_of(std::as_bytes(std::span(weight)))));
  const kfsdp::io::file_layout layout = builder.build();

  CHECK(layout.data_offset % 8 == 0);
  CHECK(layout.prefix.size() == layout.data_offset);
  CHECK(layout.header_json().size() + 8 == layout.prefix.size());
  CHECK(layout.header_json().starts_with("{\"__metadata__\":{\"format\":\"pt\",\"weight.checksum\":\""));
  REQUIRE(layout.tensors.size() == 4);
  CHECK(layout.tensors[0].begin == layout.data_offset);
  CHECK(layout.tensors[1].begin == layout.tensors[0].end);
  CHECK(layout.tensors[1].size_bytes() == 24);
  CHECK(layout.tensors[2].size_bytes() == 8);
  CHECK(layout.tensors[3].size_bytes() == 0);
  CHECK(layout.file_size == layout.data_offset + 24 + 24 + 8);
  CHECK(layout.tensors[0].row_offset(1) == layout.data_offset + 12);

  // Write it the way ranks would: the prefix at 0, each tensor at its own offset.
  const auto path = std::filesystem::temp_directory_path() /
                    ("kfsdp_test_safetensors_" + std::to_string(std::random_device{}()) + ".safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(layout.prefix.data()),
              static_cast<std::streamsize>(layout.prefix.size()));
    const auto put = [&](const kfsdp::io::tensor_info& tensor, const void* data) {
      out.seekp(static_cast<std::streamoff>(tensor.begin));
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(tensor.size_bytes()));
    };
    put(layout.tensors[1], bias.data());  // any order
    put(layout.tensors[0], weight.data());
    put(layout.tensors[2], step.data());
  }
  std::vector<std::byte> file(std::filesystem::file_size(path));
  {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(file.size()));
  }
  std::filesystem::remove(path);
  REQUIRE(file.size() == layout.file_size);

  const auto table = parse_header(file, file.size(), "roundtrip.safetensors");
  CHECK(table.data_offset == layout.data_offset);
  CHECK(table.metadata == builder.metadata());
  REQUIRE(table.tensors.size() == 4);
  for (const auto& written : layout.tensors) {
    const auto& read = table.at(written.name);
    CHECK(read.type == written.type);
    CHECK(read.shape == written.shape);
    CHECK(read.begin == written.begin);
    CHECK(read.end == written.end);
  }
  const auto& read_weight = table.at("transformer.h.0.mlp.c_fc.weight");
  std::vector<float> weight_back(6);
  std::memcpy(weight_back.data(), file.data() + read_weight.begin, read_weight.size_bytes());
  CHECK(weight_back == weight);
  const auto checksum = kfsdp::io::checksum_hex(kfsdp::io::checksum_of(
      std::span(file).subspan(read_weight.begin, read_weight.size_bytes())));
  CHECK(table.metadata.at("weight.checksum") == checksum);
  CHECK(table.find("missing") == nullptr);
  CHECK_THROWS_WITH_AS((void)table.at("missing"),
                       "safetensors file 'roundtrip.safetensors': no tensor named 'missing'",
                       std::out_of_range);
}

TEST_CASE("make_header escapes names and rejects names it cannot write") {
  const std::vector<kfsdp::io::tensor_entry> odd{{"quote\"back\\slash\nnewline\x01", dtype::U8, {1}},
                                                  {"caf\xc3\xa9", dtype::BF16, {2}}};
  const auto layout = kfsdp::io::make_header(odd);
  std::vector<std::byte> file = layout.prefix;
  file.resize(layout.file_size);
  const auto table = parse_header(file, file.size(), file_name);
  CHECK(table.at("quote\"back\\slash\nnewline\x01").size_bytes() == 1);
  CHECK(table.at("caf\xc3\xa9").size_bytes() == 4);

  using entries = std::vector<kfsdp::io::tensor_entry>;
  CHECK_THROWS_AS((void)kfsdp::io::make_header(entries{{"a", dtype::F32, {1}}, {"a", dtype::F32, {2}}}),
                  std::invalid_argument);
  CHECK_THROWS_AS((void)kfsdp::io::make_header(entries{{"__metadata__", dtype::F32, {1}}}),
                  std::invalid_argument);
  CHECK_THROWS_AS((void)kfsdp::io::make_header(entries{{"bad\xff", dtype::F32, {1}}}),
                  std::invalid_argument);
  CHECK_THROWS_AS((void)kfsdp::io::make_header(entries{{"huge", dtype::F64, {1ull << 40, 1ull << 30}}}),
                  std::invalid_argument);
}

TEST_CASE("parse_header accepts what the reference accepts") {
  SUBCASE("no tensors, no data") { CHECK(parse(file_with_header("{}      ", 0)).tensors.empty()); }
  SUBCASE("null metadata, whitespace everywhere, unknown fields ignored") {
    const auto table = parse(file_with_header(
        " {\n\t\"__metadata__\" : null , \"a\" : { \"dtype\" : \"U8\" , \"shape\" : [ 2 ] , "
        "\"data_offsets\" : [ 0 , 2 ], \"extra\": {\"x\": [1.5e3, true, null]} } }\r\n",
        2));
    CHECK(table.metadata.empty());
    CHECK(table.at("a").size_bytes() == 2);
  }
  SUBCASE("string escapes and surrogate pairs are decoded") {
    const auto table = parse(file_with_header(
        R"({"\u00e9\ud83d\ude00\/\"\\\b\f\n\r\t":{"dtype":"I8","shape":[],"data_offsets":[0,1]}})", 1));
    CHECK(table.tensors.at(0).name == "\xc3\xa9\xf0\x9f\x98\x80/\"\\\b\f\n\r\t");
  }
  SUBCASE("tensors listed out of file order come back in file order") {
    const auto table = parse(file_with_header(
        object_of(tensor_json("second", "F32", "[1]", 4, 8) + "," + tensor_json("first", "F32", "[1]", 0, 4) +
            "," + tensor_json("zero", "F32", "[0]", 8, 8)),
        8));
    REQUIRE(table.tensors.size() == 3);
    CHECK(table.tensors[0].name == "first");
    CHECK(table.tensors[1].name == "second");
    CHECK(table.at("second").begin == table.data_offset + 4);
  }
  SUBCASE("the largest offsets that fit") {
    const auto table = parse(file_with_header(object_of(tensor_json("a", "U64", "[1]", 0, 8)), 8));
    CHECK(table.at("a").element_count() == 1);
  }
}

TEST_CASE("malformed: header length larger than the file") {
  check_message(parse_error(file_with_header("{}", 0, 1000)), "", "header length 1000 is larger than the file");
  check_message(parse_error(std::vector<std::byte>(5)), "", "file is 5 bytes, expected at least 8");
}

TEST_CASE("malformed: absurd header length") {
  const auto file = file_with_header("{}", 0, 200'000'000);
  std::string message;
  try {
    (void)parse_header(file, 300'000'000, file_name);
  } catch (const format_error& error) {
    message = error.what();
  }
  check_message(message, "", "header length 200000000 is absurd, expected at most 100000000");
}

TEST_CASE("malformed: the prefix given holds fewer bytes than the header") {
  const auto file = file_with_header("{}      ", 0);
  std::string message;
  try {
    (void)parse_header(std::span(file).first(10), 100, file_name);
  } catch (const format_error& error) {
    message = error.what();
  }
  check_message(message, "", "file_prefix holds 10 bytes, but the header needs 8 + 8");
  CHECK_THROWS_AS((void)parse_header(file, file.size() - 1, file_name), std::invalid_argument);
}

TEST_CASE("malformed: text that is not JSON") {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", "expected a JSON value, found the end of the header"},
      {"{", "expected a string key in an object"},
      {"{\"a\" 1}", "expected ':' after an object key"},
      {"{\"a\":1,}", "expected a string key in an object"},
      {"{'a':1}", "expected a string key in an object, found '\\x27'"},
      {"{\"a\":[1,2,]}", "expected a JSON value"},
      {"{\"a\":01}", "expected '}' or ',' in an object, found '1'"},
      {"{\"a\":-}", "expected a digit in a number"},
      {"{\"a\":1.}", "expected a digit after '.'"},
      {"{\"a\":1e}", "expected a digit in an exponent"},
      {"{\"a\":tru}", "expected true, false or null"},
      {"{\"a\":\"x}", "unterminated string"},
      {"{\"a\":\"\\x\"}", "unknown escape"},
      {"{\"a\":\"\\u12\"}", "expected 4 hex digits after \\u"},
      {"{\"a\":\"\\udc00\"}", "lone low surrogate"},
      {"{\"a\":\"\\ud800\"}", "high surrogate without a low surrogate"},
      {"{\"a\":\"\\ud800\\u0041\"}", "high surrogate without a low surrogate"},
      {"{\"a\":\"\t\"}", "control character in a string"},
      {"{\"a\":\"\xc3\x28\"}", "invalid UTF-8 in a string"},
      {"{\"a\":\"\xe0\x80\xaf\"}", "invalid UTF-8 in a string"},  // overlong '/'
      {"{\"a\":\"\xed\xa0\x80\"}", "invalid UTF-8 in a string"},  // encoded surrogate
      {std::string(100, '[') + std::string(100, ']'), "nested deeper than 64"},
  };
  for (const auto& [json, what] : cases) {
    CAPTURE(json);
    const std::string message = parse_error(file_with_header(json, 0));
    check_message(message, "", "header is not valid JSON: at byte ");
    check_message(message, "", what);
  }
}

TEST_CASE("malformed: JSON that is not an object of tensors") {
  check_message(parse_error(file_with_header("[1, 2]", 0)), "", "header is an array, expected a JSON object");
  check_message(parse_error(file_with_header("{\"w\": 3}", 0)), "w",
                "entry is a number, expected an object with dtype, shape and data_offsets");
  check_message(parse_error(file_with_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4)), "w",
                "'data_offsets' is missing");
  check_message(parse_error(file_with_header("{\"w\": {\"dtype\": 4, \"shape\": [1]}}", 4)), "w",
                "dtype is a number, expected a string");
  check_message(parse_error(file_with_header("{\"w\": {\"dtype\": \"F32\", \"dtype\": \"F32\"}}", 4)), "w",
                "'dtype' appears twice");
  check_message(parse_error(file_with_header(
                    "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4)),
                "w", "data_offsets has 3 numbers, expected 2");
  check_message(parse_error(file_with_header(
                    "{\"w\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 4)),
                "w", "shape is an object, expected an array of unsigned integers");
  check_message(parse_error(file_with_header(
                    "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4)),
                "w", "shape[0] is a string, expected an unsigned integer");
}

TEST_CASE("malformed: trailing garbage after the JSON value") {
  check_message(parse_error(file_with_header("{}  x", 0)), "",
                "at byte 4 of the header: expected the end of the header after the JSON value, found 'x'");
  check_message(parse_error(file_with_header("{}{}", 0)), "", "expected the end of the header");
  check_message(parse_error(file_with_header(std::string("{}\0\0", 4), 0)), "", "found '\\x00'");
}

TEST_CASE("malformed: duplicate names") {
  check_message(parse_error(file_with_header(object_of(tensor_json("w", "U8", "[1]", 0, 1) + "," +
                                             tensor_json("w", "U8", "[1]", 1, 2)),
                                             2)),
                "w", "appears twice in the header");
  check_message(parse_error(file_with_header("{\"__metadata__\":{},\"__metadata__\":{}}", 0)), "",
                "'__metadata__' appears twice");
  check_message(parse_error(file_with_header("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0)), "",
                "'__metadata__' key 'k' appears twice");
}

TEST_CASE("malformed: unknown dtype") {
  check_message(parse_error(file_with_header(object_of(tensor_json("w", "F31", "[1]", 0, 4)), 4)), "w",
                "dtype 'F31' is unknown, expected one of BOOL, U8, I8");
  check_message(parse_error(file_with_header(object_of(tensor_json("w", "f32", "[1]", 0, 4)), 4)), "w",
                "dtype 'f32' is unknown");
}

TEST_CASE("malformed: shapes and offsets that are not unsigned 64-bit integers") {
  const std::vector<std::pair<std::string, std::string>> cases{
      {tensor_json("w", "U8", "[-1]", 0, 1), "shape[0] = -1 is negative, expected an unsigned integer"},
      {tensor_json("w", "U8", "[-0]", 0, 0), "shape[0] = -0 is negative"},
      {tensor_json("w", "U8", "[1, 2.0]", 0, 2), "shape[1] = 2.0 is not an integer"},
      {tensor_json("w", "U8", "[1e2]", 0, 100), "shape[0] = 1e2 is not an integer"},
      {tensor_json("w", "U8", "[-1.5]", 0, 1), "shape[0] = -1.5 is not an integer"},
      {tensor_json("w", "U8", "[18446744073709551616]", 0, 1),
       "shape[0] = 18446744073709551616 does not fit in 64 bits"},
      {"\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-1]}", "data_offsets[1] = -1 is negative"},
      {"\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}",
       "data_offsets[1] = 99999999999999999999 does not fit in 64 bits"},
  };
  for (const auto& [entry, what] : cases) {
    CAPTURE(entry);
    check_message(parse_error(file_with_header(object_of(entry), 1)), "w", what);
  }
}

TEST_CASE("malformed: shape times dtype size differs from the byte range") {
  check_message(parse_error(file_with_header(object_of(tensor_json("w", "F32", "[2, 3]", 0, 20)), 20)),
                "w", "shape [2, 3] of F32 (4 bytes each) is 24 bytes, but data_offsets [0, 20] span 20");
  check_message(parse_error(file_with_header(
                    object_of(tensor_json("w", "F64", "[4294967296, 4294967296]", 0, 8)), 8)),
                "w", "has more than 2^64 bytes");
  check_message(parse_error(file_with_header(object_of(tensor_json("w", "U8", "[1]", 5, 4)), 8)), "w",
                "data_offsets [5, 4] end before begin");
}

TEST_CASE("malformed: offsets past the end of the data") {
  check_message(parse_error(file_with_header(object_of(tensor_json("w", "U8", "[16]", 0, 16)), 8)), "w",
                "data_offsets [0, 16] go past the end of the data section, which has 8 bytes");
}

TEST_CASE("malformed: overlapping ranges") {
  check_message(parse_error(file_with_header(object_of(tensor_json("a", "U8", "[8]", 0, 8) + "," +
                                             tensor_json("b", "U8", "[4]", 4, 8)),
                                             8)),
                "b", "data_offsets [4, 8] overlap tensor 'a', which ends at 8");
  check_message(parse_error(file_with_header(object_of(tensor_json("a", "U8", "[8]", 0, 8) + "," +
                                             tensor_json("empty", "U8", "[0]", 4, 4)),
                                             8)),
                "empty", "overlap tensor 'a'");
}

TEST_CASE("malformed: ranges that leave holes") {
  check_message(parse_error(file_with_header(object_of(tensor_json("a", "U8", "[4]", 0, 4) + "," +
                                             tensor_json("b", "U8", "[2]", 6, 8)),
                                             8)),
                "b", "leave a hole: bytes [4, 6) of the data section belong to no tensor");
  check_message(parse_error(file_with_header(object_of(tensor_json("a", "U8", "[4]", 0, 4)), 8)), "",
                "bytes [4, 8) at the end of the data section belong to no tensor (the last is 'a')");
  check_message(parse_error(file_with_header("{}", 3)), "", "(the header has no tensors)");
}

TEST_CASE("malformed: a metadata value that is not a string") {
  check_message(parse_error(file_with_header("{\"__metadata__\":{\"step\":100}}", 0)), "",
                "'__metadata__' value of 'step' is a number, expected a string");
  check_message(parse_error(file_with_header("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", 0)), "",
                "value of 'a' is an object, expected a string");
  check_message(parse_error(file_with_header("{\"__metadata__\":[]}", 0)), "",
                "'__metadata__' is an array, expected an object of strings");
}

TEST_CASE("messages show odd names safely and cut long ones") {
  const std::string long_name(500, 'n');
  const std::string message =
      parse_error(file_with_header(object_of(tensor_json(long_name, "F31", "[1]", 0, 4)), 4));
  CHECK(contains(message, "... (500 bytes)"));
  CHECK(message.size() < 400);
  const std::string control =
      parse_error(file_with_header(object_of(tensor_json("a\\u0001b", "F31", "[1]", 0, 4)), 4));
  check_message(control, "a\\x01b", "unknown");
}

TEST_CASE("dtype helpers") {
  CHECK(kfsdp::io::dtype_size(dtype::BF16) == 2);
  CHECK(kfsdp::io::dtype_name(dtype::F8_E4M3) == "F8_E4M3");
  CHECK(kfsdp::io::parse_dtype("U64") == dtype::U64);
  CHECK_FALSE(kfsdp::io::parse_dtype("F4").has_value());
  static_assert(kfsdp::io::dtype_of<float> == dtype::F32);
  static_assert(kfsdp::io::dtype_of<double> == dtype::F64);
  static_assert(kfsdp::io::dtype_of<std::int64_t> == dtype::I64);
}
