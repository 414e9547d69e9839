#pragma once
// kfsdp::detail::between_kernels(): what the compute thread calls as each element or row kernel
// (vector_for) and each matrix product (nn::detail::gemm) starts. A job with no core to spare for a
// communication thread has its engine set `poll` there, to test the collectives in flight: MPI
// moves a collective on only inside MPI calls, so the rank's link works while it computes instead
// of only while it waits (fsdp_engine::set_progress_between_kernels). Unset, it is a load and a branch.
//
//   current_kernel_boundary = {&poll_engine, &engine};   // poll_engine(&engine) between kernels
//   ...forward and backward...
//   current_kernel_boundary = {};

namespace kfsdp::detail {

struct kernel_boundary {
  void (*poll)(void* target) = nullptr;
  void* target = nullptr;
};
inline thread_local kernel_boundary current_kernel_boundary{};  // this thread's

inline void between_kernels() {
  kernel_boundary& here = current_kernel_boundary;
  if (here.poll == nullptr) return;
  const kernel_boundary polling = here;
  here.poll = nullptr;  // a kernel that the poll itself runs (a copy, a dequantization) does not poll again
  struct restore {
    kernel_boundary& at;
    kernel_boundary was;
    ~restore() { at = was; }
  } restored{here, polling};
  polling.poll(polling.target);
}

}  // namespace kfsdp::detail
