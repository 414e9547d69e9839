#pragma once
// The message of what a call throws, for tests that compare error messages whole.

#include <stdexcept>
#include <string>

namespace kfsdp::test {

// The message of the `Error` that `call` throws, or "" when it throws none.
//   CHECK(error_message([&] { (void)kfsdp::io::read_npy("x.npz"); }) == "kfsdp::io: x.npz: not a .npy file ...");
template <class Error = std::invalid_argument, class Call>
std::string error_message(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace kfsdp::test
