// A doctest main for MPI test programs (doctest has no MPI extension here).
//
// Every rank runs the whole doctest session. Each line a rank prints is prefixed by "[rank r/N] ";
// rank 0 prints doctest's full report, ranks > 0 print only failures (doctest's --minimal). The
// failing test cases are summed over ranks and every rank exits non-zero if any rank failed, so
// mpirun and meson see one verdict.
//
//   mpirun -np 4 ./comm_mpi_test                 # link the test with mpi_test_dep
//   mpirun -np 4 ./comm_mpi_test -tc='*gather*'  # doctest options work as usual, on every rank
//
// Tests must keep collectives matched across ranks: use CHECK (which records and goes on) on
// values that differ by rank; REQUIRE stops one rank's test case while the others carry on and
// would then wait in a collective that never comes.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <span>
#include <streambuf>
#include <string>
#include <utility>

#include <kfsdp/comm/mpi/mpi.hpp>
#ifdef KFSDP_TEST_WITH_KOKKOS
#include <kfsdp/environment.hpp>  // the same main, with Kokkos up for tests that use views
#endif

namespace {

// Writes whole lines, each with a prefix, in one fwrite + fflush so that ranks' lines interleave
// only at line boundaries.
class line_prefix_buffer final : public std::streambuf {
 public:
  explicit line_prefix_buffer(std::string prefix) : prefix_(std::move(prefix)) {}
  ~line_prefix_buffer() override { flush_line(); }

 protected:
  int_type overflow(int_type character) override {
    if (traits_type::eq_int_type(character, traits_type::eof())) {
      return traits_type::not_eof(character);
    }
    line_.push_back(traits_type::to_char_type(character));
    if (character == '\n') flush_line();
    return character;
  }
  int sync() override {
    flush_line();
    return 0;
  }

 private:
  // True when the text holds more than colour escapes ("\x1b[...m") and white space: doctest's
  // --minimal report on a passing rank is only colour resets, which need no line of their own.
  static bool visible(const std::string& text) {
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\x1b') {
        while (i < text.size() && text[i] != 'm') ++i;
      } else if (text[i] != ' ' && text[i] != '\n' && text[i] != '\r' && text[i] != '\t') {
        return true;
      }
    }
    return false;
  }

  void flush_line() {
    if (!visible(line_)) {
      line_.clear();
      return;
    }
    const std::string prefixed = prefix_ + line_;
    std::fwrite(prefixed.data(), 1, prefixed.size(), stdout);
    std::fflush(stdout);
    line_.clear();
  }

  std::string prefix_;
  std::string line_;
};

// Remembers doctest's totals for this rank (a listener sees them after the run).
doctest::TestRunStats this_rank_totals{};

struct totals_listener : doctest::IReporter {
  explicit totals_listener(const doctest::ContextOptions& /*options*/) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& totals) override { this_rank_totals = totals; }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

DOCTEST_REGISTER_LISTENER("kfsdp_mpi_totals", 1, totals_listener);

int main(int argc, char** argv) {
  // SERIALIZED: tests of comm::threaded make their MPI calls from its worker thread.
  kfsdp::comm::mpi::environment mpi_up(argc, argv, MPI_THREAD_SERIALIZED);
  int verdict = 0;
  {
#ifdef KFSDP_TEST_WITH_KOKKOS
    kfsdp::environment kokkos_up(argc, argv);
#endif
    kfsdp::comm::mpi world;

    line_prefix_buffer prefixed(fmt::format("[rank {}/{}] ", world.rank(), world.size()));
    std::ostream rank_output(&prefixed);

    doctest::Context context;
    context.applyCommandLine(argc, argv);
    if (world.rank() > 0) {
      context.setOption("minimal", true);  // only failures from ranks > 0
      context.setOption("no-version", true);
    }
    context.setCout(&rank_output);
    const int this_rank_verdict = context.run();
    rank_output.flush();
    if (context.shouldExit()) return this_rank_verdict;  // --help, --list-test-cases, ...

    // {ranks that failed, failing test cases summed over ranks}
    std::int64_t failures[2] = {this_rank_verdict != 0 ? 1 : 0,
                                static_cast<std::int64_t>(this_rank_totals.numTestCasesFailed)};
    kfsdp::comm::all_reduce_sum(world, std::span<std::int64_t>(failures));
    if (failures[0] != 0) {
      verdict = 1;
      if (world.rank() == 0) {
        rank_output << failures[0] << " of " << world.size() << " ranks failed ("
                    << failures[1] << " failing test cases, summed over ranks)\n";
        rank_output.flush();
      }
    }
  }
  return verdict;
}
