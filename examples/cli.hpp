#pragma once
// A small --flag value parser shared by the examples: every flag is declared with a default and a
// help line; an unknown flag, a missing value or a value that does not parse is an error that
// names the flag and the value seen.

#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace kfsdp::examples {

class cli {
 public:
  cli(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

  cli& flag(const std::string& name, std::string default_value, std::string help) {
    order_.push_back(name);
    flags_[name] = {std::move(default_value), std::move(help)};
    return *this;
  }

  // Parses argv; returns false when --help was asked (the help text is printed).
  bool parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        fmt::print("{}", help());
        return false;
      }
      if (!arg.starts_with("--"))
        throw std::invalid_argument(fmt::format("{}: unexpected argument '{}', expected --flag value", program_, arg));
      std::string name(arg.substr(2));
      std::string value;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else {
        if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{}: --{} needs a value", program_, name));
        value = argv[++i];
      }
      auto it = flags_.find(name);
      if (it == flags_.end())
        throw std::invalid_argument(fmt::format("{}: unknown flag --{} (see --help)", program_, name));
      it->second.value = value;
    }
    return true;
  }

  [[nodiscard]] std::string str(const std::string& name) const { return entry(name).value; }

  [[nodiscard]] std::size_t size(const std::string& name) const {
    const std::string v = str(name);
    std::size_t used = 0;
    unsigned long long n = 0;
    try {
      n = std::stoull(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || v.empty() || v[0] == '-')
      throw std::invalid_argument(fmt::format("{}: --{} is '{}', expected a non-negative integer", program_, name, v));
    return static_cast<std::size_t>(n);
  }

  [[nodiscard]] double real(const std::string& name) const {
    const std::string v = str(name);
    std::size_t used = 0;
    double x = 0;
    try {
      x = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || v.empty())
      throw std::invalid_argument(fmt::format("{}: --{} is '{}', expected a number", program_, name, v));
    return x;
  }

  [[nodiscard]] std::string help() const {
    std::string out = fmt::format("{} — {}\n\nflags:\n", program_, summary_);
    for (const auto& name : order_) {
      const auto& f = flags_.at(name);
      out += fmt::format("  --{:<16} {} (default: {})\n", name, f.help, f.value.empty() ? "none" : f.value);
    }
    return out;
  }

 private:
  struct entry_t {
    std::string value;
    std::string help;
  };
  const entry_t& entry(const std::string& name) const {
    auto it = flags_.find(name);
    if (it == flags_.end()) throw std::logic_error(program_ + ": flag --" + name + " was never declared");
    return it->second;
  }
  std::string program_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, entry_t> flags_;
};

}  // namespace kfsdp::examples
