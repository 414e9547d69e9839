#pragma once
// kfsdp::comm::mpi — the MPI communicator backend (opt-in: this header includes mpi.h).
//
// It wraps MPI_COMM_WORLD, or any MPI_Comm you pass, duplicated with MPI_Comm_dup so kfsdp's
// messages never match yours; the duplicate is freed in the destructor. Errors come back as
// exceptions (MPI_ERRORS_RETURN is set on the duplicate), never as an abort.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);    // MPI_Init_thread(FUNNELED), finalize
//     kfsdp::comm::mpi world;                              // MPI_COMM_WORLD, duplicated
//     std::vector<double> shard(4, world.rank()), full(4 * world.size());
//     world.all_gather(shard, std::span(full));            // full = [0,0,0,0, 1,1,1,1, ...]
//     kfsdp::comm::request pending = world.iall_reduce_sum(std::span(full));
//     pending.wait();
//   }

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include <kfsdp/comm/argument_checks.hpp>
#include <kfsdp/comm/communicator.hpp>

namespace kfsdp::comm {

namespace detail {

template <class T>
MPI_Datatype mpi_datatype() noexcept;
template <>
inline MPI_Datatype mpi_datatype<float>() noexcept { return MPI_FLOAT; }
template <>
inline MPI_Datatype mpi_datatype<double>() noexcept { return MPI_DOUBLE; }
template <>
inline MPI_Datatype mpi_datatype<std::int64_t>() noexcept { return MPI_INT64_T; }
template <>
inline MPI_Datatype mpi_datatype<std::uint64_t>() noexcept { return MPI_UINT64_T; }

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace detail

class mpi {
 public:
  class environment;

  // An MPI call that returned an error code; what() carries MPI_Error_string's text.
  class error : public std::runtime_error {
   public:
    error(std::string_view function, std::string_view mpi_call, int code)
        : std::runtime_error(fmt::format("{}: {} failed: {} (MPI error code {})", function,
                                         mpi_call, detail::mpi_error_text(code), code)),
          code_(code) {}
    [[nodiscard]] int code() const noexcept { return code_; }

   private:
    int code_;
  };

  // Throws mpi::error unless `code` is MPI_SUCCESS.
  static void check(int code, std::string_view function, std::string_view mpi_call) {
    if (code != MPI_SUCCESS) throw error(function, mpi_call, code);
  }

  // Wraps a duplicate of MPI_COMM_WORLD. MPI must be initialised (see mpi::environment).
  mpi() : mpi(MPI_COMM_WORLD) {}

  // Wraps a duplicate of `user_comm` (collective over it); user_comm itself is left untouched.
  explicit mpi(MPI_Comm user_comm) {
    constexpr std::string_view function = "kfsdp::comm::mpi::mpi";
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (!initialised || finalised) {
      throw std::logic_error(
          "kfsdp::comm::mpi::mpi: MPI is not running; create a kfsdp::comm::mpi::environment "
          "first (and keep it alive while communicators exist)");
    }
    if (user_comm == MPI_COMM_NULL) {
      throw std::invalid_argument("kfsdp::comm::mpi::mpi: user_comm is MPI_COMM_NULL");
    }
    check(MPI_Comm_dup(user_comm, &comm_), function, "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), function, "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), function, "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), function, "MPI_Comm_size");
  }

  mpi(mpi&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)), rank_(other.rank_), size_(other.size_) {}
  mpi& operator=(mpi&& other) noexcept {
    if (this != &other) {
      free_communicator();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
    }
    return *this;
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() { free_communicator(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  // The duplicated communicator, for calls kfsdp does not wrap; kfsdp keeps ownership.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }

  // recv = [rank 0's send | rank 1's | ...]; recv.size() == size()*send.size(). In place when
  // send.data() == recv.data() + rank()*send.size(). send is non-deduced, so a vector converts.
  template <element T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    constexpr std::string_view function = "kfsdp::comm::mpi::all_gather";
    const int count = prepare_all_gather<T>(function, send, recv);
    check(MPI_Allgather(send_or_in_place(send, recv), count, detail::mpi_datatype<T>(),
                        recv.data(), count, detail::mpi_datatype<T>(), comm_),
          function, "MPI_Allgather");
  }
  template <element T>
  [[nodiscard]] request iall_gather(std::span<const std::type_identity_t<T>> send,
                                    std::span<T> recv) {
    constexpr std::string_view function = "kfsdp::comm::mpi::iall_gather";
    const int count = prepare_all_gather<T>(function, send, recv);
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Iallgather(send_or_in_place(send, recv), count, detail::mpi_datatype<T>(),
                         recv.data(), count, detail::mpi_datatype<T>(), comm_, &handle),
          function, "MPI_Iallgather");
    return request(pending_mpi_request{handle, function});
  }

  // Rank r's recv[i] = sum over ranks of send[r*recv.size() + i];
  // send.size() == size()*recv.size().
  template <element T>
  void reduce_scatter_sum(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    constexpr std::string_view function = "kfsdp::comm::mpi::reduce_scatter_sum";
    const int count = prepare_reduce_scatter<T>(function, send, recv);
    check(MPI_Reduce_scatter_block(send.data(), recv.data(), count, detail::mpi_datatype<T>(),
                                   MPI_SUM, comm_),
          function, "MPI_Reduce_scatter_block");
  }
  template <element T>
  [[nodiscard]] request ireduce_scatter_sum(std::span<const std::type_identity_t<T>> send,
                                            std::span<T> recv) {
    constexpr std::string_view function = "kfsdp::comm::mpi::ireduce_scatter_sum";
    const int count = prepare_reduce_scatter<T>(function, send, recv);
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter_block(send.data(), recv.data(), count, detail::mpi_datatype<T>(),
                                    MPI_SUM, comm_, &handle),
          function, "MPI_Ireduce_scatter_block");
    return request(pending_mpi_request{handle, function});
  }

  // Every rank's data becomes root's; 0 <= root < size().
  template <element T>
  void broadcast(std::span<T> data, int root) {
    constexpr std::string_view function = "kfsdp::comm::mpi::broadcast";
    detail::check_root(function, root, size_);
    const int count = detail::checked_int_count(function, "data", data.size());
    check(MPI_Bcast(data.data(), count, detail::mpi_datatype<T>(), root, comm_), function,
          "MPI_Bcast");
  }
  template <element T>
  [[nodiscard]] request ibroadcast(std::span<T> data, int root) {
    constexpr std::string_view function = "kfsdp::comm::mpi::ibroadcast";
    detail::check_root(function, root, size_);
    const int count = detail::checked_int_count(function, "data", data.size());
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data.data(), count, detail::mpi_datatype<T>(), root, comm_, &handle),
          function, "MPI_Ibcast");
    return request(pending_mpi_request{handle, function});
  }

  // In place, element by element over ranks.
  template <element T>
  void all_reduce_sum(std::span<T> data) {
    all_reduce(data, MPI_SUM, "kfsdp::comm::mpi::all_reduce_sum");
  }
  template <element T>
  void all_reduce_max(std::span<T> data) {
    all_reduce(data, MPI_MAX, "kfsdp::comm::mpi::all_reduce_max");
  }
  template <element T>
  void all_reduce_min(std::span<T> data) {
    all_reduce(data, MPI_MIN, "kfsdp::comm::mpi::all_reduce_min");
  }
  template <element T>
  [[nodiscard]] request iall_reduce_sum(std::span<T> data) {
    constexpr std::string_view function = "kfsdp::comm::mpi::iall_reduce_sum";
    const int count = detail::checked_int_count(function, "data", data.size());
    MPI_Request handle = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count, detail::mpi_datatype<T>(), MPI_SUM,
                         comm_, &handle),
          function, "MPI_Iallreduce");
    return request(pending_mpi_request{handle, function});
  }

  void barrier() { check(MPI_Barrier(comm_), "kfsdp::comm::mpi::barrier", "MPI_Barrier"); }

 private:
  // What an mpi request waits on; `function` names the call that started it, for errors.
  struct pending_mpi_request {
    MPI_Request handle;
    std::string_view function;

    bool test() {
      int complete = 0;
      check(MPI_Test(&handle, &complete, MPI_STATUS_IGNORE), function, "MPI_Test");
      return complete != 0;
    }
    void wait() { check(MPI_Wait(&handle, MPI_STATUS_IGNORE), function, "MPI_Wait"); }
  };

  template <class T>
  int prepare_all_gather(std::string_view function, std::span<const T> send,
                         std::span<T> recv) const {
    detail::check_all_gather(function, rank_, size_, send, recv);
    return detail::checked_int_count(function, "send", send.size());
  }
  template <class T>
  int prepare_reduce_scatter(std::string_view function, std::span<const T> send,
                             std::span<T> recv) const {
    detail::check_reduce_scatter(function, size_, send, recv);
    return detail::checked_int_count(function, "recv", recv.size());
  }

  // MPI spells the in-place all-gather with MPI_IN_PLACE rather than an aliasing send buffer.
  template <class T>
  const void* send_or_in_place(std::span<const T> send, std::span<T> recv) const {
    const std::size_t slot = static_cast<std::size_t>(rank_) * send.size();
    const bool in_place = !send.empty() && send.data() == recv.data() + slot;
    return in_place ? MPI_IN_PLACE : static_cast<const void*>(send.data());
  }

  template <class T>
  void all_reduce(std::span<T> data, MPI_Op operation, std::string_view function) {
    const int count = detail::checked_int_count(function, "data", data.size());
    check(MPI_Allreduce(MPI_IN_PLACE, data.data(), count, detail::mpi_datatype<T>(), operation,
                        comm_),
          function, "MPI_Allreduce");
  }

  void free_communicator() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Comm_free(&comm_);  // after MPI_Finalize there is nothing left to free
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

// RAII guard: MPI_Init_thread with at least `required_thread_level` (MPI_THREAD_FUNNELED by
// default: only the main thread calls MPI) unless MPI is already up; MPI_Finalize at the end if
// this guard initialised it. Throws when MPI cannot give the thread level asked for.
//
//   int main(int argc, char** argv) {
//     kfsdp::comm::mpi::environment mpi_up(argc, argv);
//     kfsdp::comm::mpi world;
//     ...                                  // every kfsdp::comm::mpi must die before mpi_up
//   }
class mpi::environment {
 public:
  environment(int& argc, char**& argv, int required_thread_level = MPI_THREAD_FUNNELED) {
    start(&argc, &argv, required_thread_level);
  }
  explicit environment(int required_thread_level = MPI_THREAD_FUNNELED) {
    start(nullptr, nullptr, required_thread_level);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (!owns_mpi_) return;
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Finalize();
  }

  // True when this guard called MPI_Init_thread (and so will call MPI_Finalize).
  [[nodiscard]] bool owns_mpi() const noexcept { return owns_mpi_; }
  // The thread level MPI provides (MPI_THREAD_SINGLE < FUNNELED < SERIALIZED < MULTIPLE).
  [[nodiscard]] int thread_level() const noexcept { return thread_level_; }

 private:
  void start(int* argc, char*** argv, int required_thread_level) {
    constexpr std::string_view function = "kfsdp::comm::mpi::environment";
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) {
      throw std::logic_error(
          "kfsdp::comm::mpi::environment: MPI was already finalised; it cannot start again");
    }
    if (initialised) {
      check(MPI_Query_thread(&thread_level_), function, "MPI_Query_thread");
    } else {
      check(MPI_Init_thread(argc, argv, required_thread_level, &thread_level_), function,
            "MPI_Init_thread");
      owns_mpi_ = true;
    }
    if (thread_level_ < required_thread_level) {
      if (owns_mpi_) MPI_Finalize();  // the destructor will not run for a throwing constructor
      throw std::runtime_error(fmt::format(
          "{}: MPI provides thread level {}, expected at least required_thread_level = {} "
          "(MPI_THREAD_SINGLE={}, FUNNELED={}, SERIALIZED={}, MULTIPLE={})",
          function, thread_level_, required_thread_level, int{MPI_THREAD_SINGLE},
          int{MPI_THREAD_FUNNELED}, int{MPI_THREAD_SERIALIZED}, int{MPI_THREAD_MULTIPLE}));
    }
  }

  bool owns_mpi_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

static_assert(communicator<mpi>);

}  // namespace kfsdp::comm
