#pragma once
// The safetensors header's JSON, read strictly: a bounds-checked cursor over the text (every error a
// format_error naming the file and the byte where the text breaks), UTF-8 validation, and the
// quoting of header text in messages. src/io/checkpoint/safetensors.cpp applies the schema on top of it.
#include <kfsdp/io/checkpoint/safetensors.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <cmath>
#include <charconv>
#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace kfsdp::io::json_detail {

// ---------------------------------------------------------------- UTF-8 and text for messages

// Length of the valid UTF-8 sequence starting at text[position], or 0 when it is not valid.
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t position) noexcept {
  const auto byte = [&](std::size_t index) -> unsigned {
    return index < text.size() ? static_cast<unsigned char>(text[index]) : 0x100u;
  };
  const auto continuation = [&](std::size_t index, unsigned low = 0x80, unsigned high = 0xbf) {
    const unsigned value = byte(index);
    return value >= low && value <= high;
  };
  const unsigned lead = byte(position);
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) return continuation(position + 1) ? 2 : 0;
  if (lead >= 0xe0 && lead <= 0xef) {
    // E0 excludes overlong forms, ED excludes the UTF-16 surrogates.
    const unsigned low = lead == 0xe0 ? 0xa0 : 0x80;
    const unsigned high = lead == 0xed ? 0x9f : 0xbf;
    return continuation(position + 1, low, high) && continuation(position + 2) ? 3 : 0;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {
    // F0 excludes overlong forms, F4 stops at U+10FFFF.
    const unsigned low = lead == 0xf0 ? 0x90 : 0x80;
    const unsigned high = lead == 0xf4 ? 0x8f : 0xbf;
    return continuation(position + 1, low, high) && continuation(position + 2) &&
                   continuation(position + 3)
               ? 4
               : 0;
  }
  return 0;
}

inline bool is_valid_utf8(std::string_view text) noexcept {
  for (std::size_t position = 0; position < text.size();) {
    const std::size_t length = utf8_sequence_length(text, position);
    if (length == 0) return false;
    position += length;
  }
  return true;
}

inline constexpr char hex_digits[] = "0123456789abcdef";

// A name as it appears in messages: quoted, control bytes and non-UTF-8 escaped, long names cut.
inline std::string printable(std::string_view text) {
  constexpr std::size_t longest_shown = 120;
  std::string shown = "'";
  std::size_t position = 0;
  for (; position < text.size() && shown.size() < longest_shown;) {
    const std::size_t length = utf8_sequence_length(text, position);
    const auto byte = static_cast<unsigned char>(text[position]);
    if (length == 1 && byte >= 0x20 && byte != 0x7f && byte != '\\' && byte != '\'') {
      shown += static_cast<char>(byte);
    } else if (length > 1) {
      shown.append(text.substr(position, length));
    } else {
      shown += "\\x";
      shown += hex_digits[byte >> 4];
      shown += hex_digits[byte & 0xf];
      position += 1;
      continue;
    }
    position += length;
  }
  if (position < text.size()) shown += "'... (" + std::to_string(text.size()) + " bytes)";
  else shown += "'";
  return shown;
}

// A character of the header as it appears in messages.
inline std::string printable_char(int character) {
  if (character < 0) return "the end of the header";
  return printable(std::string(1, static_cast<char>(character)));
}

[[noreturn]] inline void fail(std::string_view file_name, const std::string& what) {
  throw format_error("safetensors file " + printable(file_name) + ": " + what);
}

[[noreturn]] inline void fail_tensor(std::string_view file_name, std::string_view tensor,
                              const std::string& what) {
  fail(file_name, "tensor " + printable(tensor) + ": " + what);
}

// ---------------------------------------------------------------- JSON reading

enum class json_kind { null, boolean, number, string, array, object };

inline std::string_view kind_name(json_kind kind) {
  switch (kind) {
    case json_kind::null: return "null";
    case json_kind::boolean: return "a boolean";
    case json_kind::number: return "a number";
    case json_kind::string: return "a string";
    case json_kind::array: return "an array";
    case json_kind::object: return "an object";
  }
  return "a value";
}

// A cursor over the header text; every read is bounds-checked, every error throws format_error.
class json_reader {
 public:
  // `document`: the text is a JSON file of its own (config.json, an index), not a safetensors
  // header; its syntax errors say only where the text breaks, and the caller names the file.
  json_reader(std::string_view text, std::string_view file_name, bool document = false)
      : text_(text), file_(file_name), document_(document) {}

  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  [[nodiscard]] bool at_end() const noexcept { return position_ >= text_.size(); }
  [[nodiscard]] int peek() const noexcept {
    return at_end() ? -1 : static_cast<unsigned char>(text_[position_]);
  }

  void skip_whitespace() noexcept {
    while (!at_end()) {
      const char c = text_[position_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++position_;
    }
  }

  [[noreturn]] void syntax_error(const std::string& what) const {
    if (document_)
      throw format_error("at byte " + std::to_string(position_) + ": " + what + ", found " +
                         (at_end() ? std::string("the end of the text") : printable_char(peek())));
    fail(file_, "header is not valid JSON: at byte " + std::to_string(position_) +
                    " of the header: " + what + ", found " + printable_char(peek()));
  }

  void expect(char wanted, std::string_view context) {
    skip_whitespace();
    if (peek() != static_cast<unsigned char>(wanted))
      syntax_error("expected '" + std::string(1, wanted) + "' " + std::string(context));
    ++position_;
  }

  // True (and consumes it) when the next non-space character is `wanted`.
  bool consume(char wanted) {
    skip_whitespace();
    if (peek() != static_cast<unsigned char>(wanted)) return false;
    ++position_;
    return true;
  }

  [[nodiscard]] json_kind next_kind() {
    skip_whitespace();
    switch (peek()) {
      case '{': return json_kind::object;
      case '[': return json_kind::array;
      case '"': return json_kind::string;
      case 't': case 'f': return json_kind::boolean;
      case 'n': return json_kind::null;
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return json_kind::number;
        syntax_error("expected a JSON value");
    }
  }

  // Reads any value, checking its syntax; nesting deeper than max_json_depth is an error.
  void skip_value(std::size_t depth) {
    switch (next_kind()) {
      case json_kind::object: {
        enter(depth);
        ++position_;
        if (consume('}')) return;
        do {
          skip_whitespace();
          if (peek() != '"') syntax_error("expected a string key in an object");
          read_string();
          expect(':', "after an object key");
          skip_value(depth + 1);
        } while (consume(','));
        expect('}', "or ',' in an object");
        return;
      }
      case json_kind::array: {
        enter(depth);
        ++position_;
        if (consume(']')) return;
        do skip_value(depth + 1);
        while (consume(','));
        expect(']', "or ',' in an array");
        return;
      }
      case json_kind::string: read_string(); return;
      case json_kind::number: read_number_text(); return;
      case json_kind::boolean:
      case json_kind::null: read_literal(); return;
    }
  }

  // Reads a string at the cursor and returns it decoded (escapes resolved, UTF-8 checked).
  std::string read_string() {
    skip_whitespace();
    if (peek() != '"') syntax_error("expected a string");
    ++position_;
    std::string decoded;
    for (;;) {
      if (at_end()) syntax_error("unterminated string");
      const auto byte = static_cast<unsigned char>(text_[position_]);
      if (byte == '"') {
        ++position_;
        return decoded;
      }
      if (byte < 0x20) syntax_error("control character in a string (escape it)");
      if (byte == '\\') {
        read_escape(decoded);
        continue;
      }
      const std::size_t length = utf8_sequence_length(text_, position_);
      if (length == 0) syntax_error("invalid UTF-8 in a string");
      decoded.append(text_.substr(position_, length));
      position_ += length;
    }
  }

  // Reads a number at the cursor (JSON grammar) and returns its text.
  std::string_view read_number_text() {
    skip_whitespace();
    const std::size_t start = position_;
    if (peek() == '-') ++position_;
    if (peek() == '0') {
      ++position_;
    } else if (peek() >= '1' && peek() <= '9') {
      skip_digits();
    } else {
      syntax_error("expected a digit in a number");
    }
    if (peek() == '.') {
      ++position_;
      if (!(peek() >= '0' && peek() <= '9')) syntax_error("expected a digit after '.'");
      skip_digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++position_;
      if (peek() == '+' || peek() == '-') ++position_;
      if (!(peek() >= '0' && peek() <= '9')) syntax_error("expected a digit in an exponent");
      skip_digits();
    }
    // "01" would stop after the 0; the caller then sees '1' where ',' or ']' belongs.
    return text_.substr(start, position_ - start);
  }

 private:
  void enter(std::size_t depth) const {
    if (depth >= max_json_depth)
      syntax_error("arrays and objects nested deeper than " + std::to_string(max_json_depth));
  }

  void skip_digits() noexcept {
    while (peek() >= '0' && peek() <= '9') ++position_;
  }

  void read_literal() {
    for (const std::string_view literal : {"true", "false", "null"}) {
      if (text_.substr(position_, literal.size()) == literal) {
        position_ += literal.size();
        return;
      }
    }
    syntax_error("expected true, false or null");
  }

  unsigned read_hex4() {
    unsigned value = 0;
    for (int digit = 0; digit < 4; ++digit) {
      const int c = peek();
      unsigned nibble = 0;
      if (c >= '0' && c <= '9') nibble = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') nibble = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') nibble = static_cast<unsigned>(c - 'A' + 10);
      else syntax_error("expected 4 hex digits after \\u");
      value = value * 16 + nibble;
      ++position_;
    }
    return value;
  }

  static void append_utf8(std::string& out, unsigned code_point) {
    if (code_point < 0x80) {
      out += static_cast<char>(code_point);
    } else if (code_point < 0x800) {
      out += static_cast<char>(0xc0 | (code_point >> 6));
      out += static_cast<char>(0x80 | (code_point & 0x3f));
    } else if (code_point < 0x10000) {
      out += static_cast<char>(0xe0 | (code_point >> 12));
      out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code_point & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code_point >> 18));
      out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code_point & 0x3f));
    }
  }

  void read_escape(std::string& decoded) {
    ++position_;  // the backslash
    const int c = peek();
    if (c < 0) syntax_error("unterminated escape");
    ++position_;
    switch (c) {
      case '"': decoded += '"'; return;
      case '\\': decoded += '\\'; return;
      case '/': decoded += '/'; return;
      case 'b': decoded += '\b'; return;
      case 'f': decoded += '\f'; return;
      case 'n': decoded += '\n'; return;
      case 'r': decoded += '\r'; return;
      case 't': decoded += '\t'; return;
      case 'u': break;
      default: --position_; syntax_error("unknown escape");
    }
    const unsigned unit = read_hex4();
    if (unit >= 0xdc00 && unit <= 0xdfff) syntax_error("lone low surrogate in a \\u escape");
    if (unit < 0xd800 || unit > 0xdbff) {
      append_utf8(decoded, unit);
      return;
    }
    // A high surrogate must be followed by an escaped low surrogate.
    if (text_.substr(position_, 2) != "\\u") syntax_error("high surrogate without a low surrogate");
    position_ += 2;
    const unsigned low = read_hex4();
    if (low < 0xdc00 || low > 0xdfff) syntax_error("high surrogate without a low surrogate");
    append_utf8(decoded, 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00));
  }

  std::string_view text_;
  std::string_view file_;
  bool document_ = false;
  std::size_t position_ = 0;
};

// A parsed JSON value, for small documents read whole (config.json, an index): objects keep their
// keys in order (a duplicate key is an error), numbers and literals their text.
//   {"a": [1, true]}  ->  object, keys {"a"}, values {array, values {number "1", boolean "true"}}
struct json_value {
  json_kind kind = json_kind::null;
  std::string text;               // a string's decoded text, a number's text, "true" or "false"
  std::vector<std::string> keys;  // an object's keys
  std::vector<json_value> values; // an object's values (beside its keys) or an array's items

  // The member called `key` of an object, or nullptr.
  [[nodiscard]] const json_value* find(std::string_view key) const noexcept {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &values[i];
    return nullptr;
  }
};

// Reads the value at the cursor (and nothing after it) into a tree.
inline json_value read_json_value(json_reader& in, std::size_t depth = 0) {
  json_value value;
  value.kind = in.next_kind();
  if (depth >= max_json_depth) in.syntax_error("arrays and objects nested deeper than " + std::to_string(max_json_depth));
  switch (value.kind) {
    case json_kind::object:
      in.expect('{', "");
      if (in.consume('}')) break;
      do {
        std::string key = in.read_string();
        if (std::find(value.keys.begin(), value.keys.end(), key) != value.keys.end())
          in.syntax_error("duplicate key " + printable(key));
        in.expect(':', "after an object key");
        value.keys.push_back(std::move(key));
        value.values.push_back(read_json_value(in, depth + 1));
      } while (in.consume(','));
      in.expect('}', "or ',' in an object");
      break;
    case json_kind::array:
      in.expect('[', "");
      if (in.consume(']')) break;
      do value.values.push_back(read_json_value(in, depth + 1));
      while (in.consume(','));
      in.expect(']', "or ',' in an array");
      break;
    case json_kind::string: value.text = in.read_string(); break;
    case json_kind::number: value.text = std::string(in.read_number_text()); break;
    case json_kind::boolean:
      value.text = in.peek() == 't' ? "true" : "false";
      in.skip_value(depth);
      break;
    case json_kind::null: in.skip_value(depth); break;
  }
  return value;
}

// A whole JSON file (config.json, an index): one value and nothing but white space after it. A
// syntax error throws format_error saying where ("at byte 12: expected ..."); the caller names the file.
inline json_value parse_json(std::string_view text, std::string_view file_name) {
  json_reader in(text, file_name, /*document=*/true);
  json_value value = read_json_value(in);
  in.skip_whitespace();
  if (!in.at_end()) in.syntax_error("expected the end of the text after the value");
  return value;
}

// Reads the keys of one JSON object (a config.json, an adapter_config.json), each error naming the
// function, the origin and the key:  "<function>: <origin>: key 'r': <what>".
class object_keys {
 public:
  object_keys(const json_value& object, std::string_view function, std::string origin)
      : object_(object), function_(function), origin_(std::move(origin)) {}

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw format_error(fmt::format("{}: {}: key '{}': {}", function_, origin_, key, what));
  }

  // A member of the given kind, or nullptr when absent or null.
  const json_value* find(std::string_view key, json_kind kind) const {
    const json_value* value = object_.find(key);
    if (value == nullptr || value->kind == json_kind::null) return nullptr;
    if (value->kind != kind)
      fail(key, fmt::format("{} '{}', expected {}", kind_name(value->kind), value->text, kind_name(kind)));
    return value;
  }

  std::size_t size(std::string_view key, std::optional<std::size_t> absent = std::nullopt) const {
    const json_value* value = find(key, json_kind::number);
    if (value == nullptr) {
      if (absent) return *absent;
      fail(key, "missing, expected a positive integer");
    }
    std::size_t parsed = 0;
    const char* end = value->text.data() + value->text.size();
    const auto [stop, error] = std::from_chars(value->text.data(), end, parsed);
    if (error != std::errc() || stop != end || parsed == 0)
      fail(key, fmt::format("{}, expected a positive integer", value->text));
    return parsed;
  }

  double real(std::string_view key, double absent) const {
    const json_value* value = find(key, json_kind::number);
    if (value == nullptr) return absent;
    errno = 0;
    char* stop = nullptr;
    const double parsed = std::strtod(value->text.c_str(), &stop);
    if (errno != 0 || stop != value->text.c_str() + value->text.size() || !std::isfinite(parsed))
      fail(key, fmt::format("{}, expected a finite number", value->text));
    return parsed;
  }

  bool flag(std::string_view key, bool absent) const {
    const json_value* value = find(key, json_kind::boolean);
    return value == nullptr ? absent : value->text == "true";
  }

  std::string text(std::string_view key, std::string_view absent) const {
    const json_value* value = find(key, json_kind::string);
    return value == nullptr ? std::string(absent) : value->text;
  }

 private:
  const json_value& object_;
  std::string_view function_;
  std::string origin_;
};


// The whole text of a small file (a config), `what` naming it in messages ("config.json"). Throws
// std::runtime_error naming the file for one that is a directory, cannot be opened or read.
inline std::string read_text_file(const std::filesystem::path& file, std::string_view what, std::string_view function) {
  namespace fs = std::filesystem;
  std::error_code ignored;
  // A directory opens as a stream, then fails inside the read with no path: refused by name first.
  if (const fs::file_status status = fs::status(file, ignored); fs::exists(status) && !fs::is_regular_file(status))
    throw std::runtime_error(fmt::format("{}: {} '{}' is {}, expected a regular file", function, what, file.string(),
                                         fs::is_directory(status) ? "a directory" : "not a regular file"));
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open {} '{}': {}", function, what, file.string(), std::strerror(errno)));
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& error) {
    throw std::runtime_error(fmt::format("{}: read of {} '{}' failed: {}", function, what, file.string(), error.what()));
  }
  if (in.bad()) throw std::runtime_error(fmt::format("{}: read of {} '{}' failed", function, what, file.string()));
  return text;
}

// `text` as a JSON string, quotes and escapes included, appended to `out` (the writers of a
// safetensors header and of adapter_config.json).
inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (byte < 0x20) {
          out += "\\u00";
          out += hex_digits[byte >> 4];
          out += hex_digits[byte & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace kfsdp::io::json_detail
