// The compiled half of kfsdp::comm::nccl (include/kfsdp/comm/nccl/nccl.hpp): every NCCL and CUDA call.
//
// Build: part of the kfsdp_nccl static library (src/comm/meson.build), only when the CUDA
// toolkit with NCCL is found. Check: test/comm/nccl/test_nccl.cpp under mpirun; without a GPU it checks
// that construction fails with a message naming the missing device.

#include <kfsdp/comm/nccl/nccl.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace kfsdp::comm {

namespace {

void check_cuda(cudaError_t code, std::string_view function, std::string_view cuda_call) {
  if (code != cudaSuccess) {
    throw std::runtime_error(fmt::format("{}: {} failed: {} ({})", function, cuda_call,
                                         cudaGetErrorString(code), cudaGetErrorName(code)));
  }
}

void check_nccl(ncclResult_t code, std::string_view function, std::string_view nccl_call,
                ncclComm_t communicator = nullptr) {
  if (code == ncclSuccess) return;
  const char* detail = communicator != nullptr ? ncclGetLastError(communicator) : nullptr;
  throw std::runtime_error(fmt::format("{}: {} failed: {}{}{}", function, nccl_call,
                                       ncclGetErrorString(code),
                                       detail != nullptr && *detail != '\0' ? " — " : "",
                                       detail != nullptr ? detail : ""));
}

// What a nccl request waits on: an event recorded on the communication stream, owned here.
struct pending_cuda_event {
  cudaEvent_t event;
  std::string_view function;

  explicit pending_cuda_event(cudaEvent_t recorded, std::string_view called_from)
      : event(recorded), function(called_from) {}
  pending_cuda_event(pending_cuda_event&& other) noexcept
      : event(std::exchange(other.event, nullptr)), function(other.function) {}
  pending_cuda_event& operator=(pending_cuda_event&&) = delete;
  ~pending_cuda_event() {
    if (event != nullptr) cudaEventDestroy(event);
  }

  bool test() {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) return false;
    check_cuda(status, function, "cudaEventQuery");
    return true;
  }
  void wait() { check_cuda(cudaEventSynchronize(event), function, "cudaEventSynchronize"); }
  // The stream waits on the event; the host does not (a null stream: the host waits).
  void complete_before(native_stream consumer) {
    if (consumer.handle == nullptr) return wait();
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(consumer.handle), event, 0), function,
               "cudaStreamWaitEvent");
  }
};

ncclDataType_t nccl_type_of(int kind) {
  // In nccl::element_kind's order: float32, float64, int64, uint64, bfloat16, float16.
  constexpr ncclDataType_t by_kind[] = {ncclFloat32, ncclFloat64, ncclInt64,
                                        ncclUint64,  ncclBfloat16, ncclFloat16};
  return by_kind[kind];
}

// The node-local rank: ranks sharing a node (MPI_COMM_TYPE_SHARED) numbered from 0.
int node_local_rank(const mpi& host) {
  constexpr std::string_view function = "kfsdp::comm::nccl::nccl";
  MPI_Comm node = MPI_COMM_NULL;
  mpi::check(MPI_Comm_split_type(host.native(), MPI_COMM_TYPE_SHARED, host.rank(), MPI_INFO_NULL,
                                 &node),
             function, "MPI_Comm_split_type");
  int local_rank = 0;
  const int code = MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  mpi::check(code, function, "MPI_Comm_rank");
  return local_rank;
}

// Why this rank cannot use a GPU ("" when it can), and which device it would use.
struct device_choice {
  int device = -1;
  std::string problem;
  bool problem_is_argument = false;  // a bad `device` argument rather than a missing GPU
};

device_choice choose_device(const mpi& host, int requested) {
  const int local_rank = node_local_rank(host);  // collective: every rank, GPU or not, calls it
  device_choice choice;
  int device_count = 0;
  const cudaError_t status = cudaGetDeviceCount(&device_count);
  if (status != cudaSuccess || device_count == 0) {
    const std::string reason =
        status != cudaSuccess ? std::string(cudaGetErrorString(status)) : "0 devices";
    choice.problem = fmt::format(
        "kfsdp::comm::nccl: no CUDA device is visible (cudaGetDeviceCount: {}); the NCCL backend "
        "needs one GPU per rank — use kfsdp::comm::mpi on CPU machines",
        reason);
    return choice;
  }
  choice.device = requested == nccl::node_local_device ? local_rank % device_count : requested;
  if (choice.device < 0 || choice.device >= device_count) {
    choice.problem = fmt::format(
        "kfsdp::comm::nccl: device is {}, expected 0 <= device < cudaGetDeviceCount() = {} (or "
        "nccl::node_local_device)",
        requested, device_count);
    choice.problem_is_argument = true;
  }
  return choice;
}

}  // namespace

struct nccl::device_state {
  int device = -1;
  ncclComm_t communicator = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t collectives_issued = nullptr;  // reused by make_stream_wait
  cudaEvent_t compute_done = nullptr;        // reused by order_after; made on first use

  ~device_state() {
    // Destructors do not throw: a failure here cannot be reported, only survived.
    if (device >= 0) cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (communicator != nullptr) ncclCommDestroy(communicator);
    if (collectives_issued != nullptr) cudaEventDestroy(collectives_issued);
    if (compute_done != nullptr) cudaEventDestroy(compute_done);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

nccl::nccl(const mpi& bootstrap, int device)
    : host_(bootstrap.native()), state_(std::make_unique<device_state>()) {
  constexpr std::string_view function = "kfsdp::comm::nccl::nccl";
  const device_choice choice = choose_device(host_, device);

  // Every rank learns whether any rank failed, so all throw together instead of some waiting in
  // the unique-id broadcast or ncclCommInitRank. {any problem, highest failing rank + 1}
  std::int64_t failures[2] = {choice.problem.empty() ? 0 : 1,
                              choice.problem.empty() ? 0 : host_.rank() + 1};
  host_.all_reduce_max(std::span<std::int64_t>(failures));
  if (!choice.problem.empty()) {
    if (choice.problem_is_argument) throw std::invalid_argument(choice.problem);
    throw std::runtime_error(choice.problem);
  }
  if (failures[0] != 0) {
    throw std::runtime_error(fmt::format(
        "{}: rank {} cannot use a CUDA device (see its own error); every rank stops so that none "
        "waits in ncclCommInitRank",
        function, failures[1] - 1));
  }

  state_->device = choice.device;
  check_cuda(cudaSetDevice(choice.device), function, "cudaSetDevice");

  // Rank 0 makes the unique id; its status travels with it, so a failure stops every rank.
  struct unique_id_message {
    ncclResult_t status;
    ncclUniqueId id;
  } message{};
  if (host_.rank() == 0) message.status = ncclGetUniqueId(&message.id);
  mpi::check(MPI_Bcast(&message, sizeof(message), MPI_BYTE, 0, host_.native()), function,
             "MPI_Bcast");
  check_nccl(message.status, function, "ncclGetUniqueId (on rank 0)");

  check_cuda(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), function,
             "cudaStreamCreateWithFlags");
  check_cuda(cudaEventCreateWithFlags(&state_->collectives_issued, cudaEventDisableTiming),
             function, "cudaEventCreateWithFlags");
  check_nccl(ncclCommInitRank(&state_->communicator, host_.size(), message.id, host_.rank()),
             function, "ncclCommInitRank");
}

nccl::nccl(mpi host, std::unique_ptr<device_state> state) noexcept
    : host_(std::move(host)), state_(std::move(state)) {}

nccl nccl::split(int color, int key) const {
  constexpr std::string_view function = "kfsdp::comm::nccl::split";
  mpi host_group = host_.split(color, key);  // checks color; collective over host()
  auto group_state = std::make_unique<device_state>();
  group_state->device = state_->device;
  check_cuda(cudaSetDevice(state_->device), function, "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&group_state->stream, cudaStreamNonBlocking), function,
             "cudaStreamCreateWithFlags");
  check_cuda(cudaEventCreateWithFlags(&group_state->collectives_issued, cudaEventDisableTiming),
             function, "cudaEventCreateWithFlags");
  // The same (color, key) as the host group, so its ranks are numbered alike.
  check_nccl(ncclCommSplit(state_->communicator, color, key, &group_state->communicator, nullptr),
             function, "ncclCommSplit", state_->communicator);
  return nccl(std::move(host_group), std::move(group_state));
}

nccl::nccl(nccl&&) noexcept = default;
nccl& nccl::operator=(nccl&&) noexcept = default;
nccl::~nccl() = default;

int nccl::device() const noexcept { return state_ ? state_->device : -1; }
nccl::cuda_stream nccl::stream() const noexcept { return state_ ? state_->stream : nullptr; }

void nccl::wait_for(cuda_event produced) {
  check_cuda(cudaStreamWaitEvent(state_->stream, produced, 0), "kfsdp::comm::nccl::wait_for",
             "cudaStreamWaitEvent");
}

void nccl::order_after(native_stream compute) {
  constexpr std::string_view function = "kfsdp::comm::nccl::order_after";
  if (compute.handle == nullptr) return;  // a host instance: its work is complete
  if (state_->compute_done == nullptr)
    check_cuda(cudaEventCreateWithFlags(&state_->compute_done, cudaEventDisableTiming), function,
               "cudaEventCreateWithFlags");
  // A wait takes the event as recorded now: re-recording it later leaves this one in place.
  check_cuda(cudaEventRecord(state_->compute_done, static_cast<cudaStream_t>(compute.handle)), function,
             "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(state_->stream, state_->compute_done, 0), function, "cudaStreamWaitEvent");
}

void nccl::make_stream_wait(cuda_stream consumer) {
  constexpr std::string_view function = "kfsdp::comm::nccl::make_stream_wait";
  check_cuda(cudaEventRecord(state_->collectives_issued, state_->stream), function,
             "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(consumer, state_->collectives_issued, 0), function,
             "cudaStreamWaitEvent");
}

void nccl::issue_all_gather(const void* send, void* recv, std::size_t send_count,
                            element_kind kind, std::string_view function) {
  check_nccl(ncclAllGather(send, recv, send_count, nccl_type_of(static_cast<int>(kind)),
                           state_->communicator, state_->stream),
             function, "ncclAllGather", state_->communicator);
}

void nccl::issue_reduce_scatter_sum(const void* send, void* recv, std::size_t recv_count,
                                    element_kind kind, std::string_view function) {
  check_nccl(ncclReduceScatter(send, recv, recv_count, nccl_type_of(static_cast<int>(kind)),
                               ncclSum, state_->communicator, state_->stream),
             function, "ncclReduceScatter", state_->communicator);
}

void nccl::issue_group(collective what, std::span<const part_call> calls, element_kind kind,
                       std::string_view function) {
  const ncclDataType_t type = nccl_type_of(static_cast<int>(kind));
  check_nccl(ncclGroupStart(), function, "ncclGroupStart", state_->communicator);
  // Every call is made and the group always ended, so a failure leaves NCCL outside a group.
  ncclResult_t failed = ncclSuccess;
  for (const part_call& call : calls) {
    const ncclResult_t code =
        what == collective::all_gather
            ? ncclAllGather(call.send, call.recv, call.count, type, state_->communicator, state_->stream)
            : ncclReduceScatter(call.send, call.recv, call.count, type, ncclSum, state_->communicator, state_->stream);
    if (failed == ncclSuccess) failed = code;
  }
  const ncclResult_t ended = ncclGroupEnd();
  check_nccl(failed, function, what == collective::all_gather ? "ncclAllGather" : "ncclReduceScatter",
             state_->communicator);
  check_nccl(ended, function, "ncclGroupEnd", state_->communicator);
}

void nccl::issue_all_to_all(const void* send, void* recv, std::size_t block_count, std::size_t element_bytes,
                            element_kind kind, std::string_view function) {
  const ncclDataType_t type = nccl_type_of(static_cast<int>(kind));
  const std::size_t block_bytes = block_count * element_bytes;
  check_nccl(ncclGroupStart(), function, "ncclGroupStart", state_->communicator);
  // Every call is made and the group always ended, so a failure leaves NCCL outside a group.
  ncclResult_t failed = ncclSuccess;
  for (int peer = 0; peer < size(); ++peer) {
    const std::size_t offset = static_cast<std::size_t>(peer) * block_bytes;
    const ncclResult_t sent = ncclSend(static_cast<const char*>(send) + offset, block_count, type, peer,
                                       state_->communicator, state_->stream);
    const ncclResult_t received = ncclRecv(static_cast<char*>(recv) + offset, block_count, type, peer,
                                           state_->communicator, state_->stream);
    if (failed == ncclSuccess) failed = sent != ncclSuccess ? sent : received;
  }
  const ncclResult_t ended = ncclGroupEnd();
  check_nccl(failed, function, "ncclSend/ncclRecv", state_->communicator);
  check_nccl(ended, function, "ncclGroupEnd", state_->communicator);
}

void nccl::issue_broadcast(void* data, std::size_t count, element_kind kind, int root,
                           std::string_view function) {
  check_nccl(ncclBroadcast(data, data, count, nccl_type_of(static_cast<int>(kind)), root,
                           state_->communicator, state_->stream),
             function, "ncclBroadcast", state_->communicator);
}

void nccl::issue_all_reduce(void* data, std::size_t count, element_kind kind,
                            reduction operation, std::string_view function) {
  const ncclRedOp_t nccl_operation = operation == reduction::sum   ? ncclSum
                                     : operation == reduction::max ? ncclMax
                                                                   : ncclMin;
  check_nccl(ncclAllReduce(data, data, count, nccl_type_of(static_cast<int>(kind)),
                           nccl_operation, state_->communicator, state_->stream),
             function, "ncclAllReduce", state_->communicator);
}

void nccl::synchronize(std::string_view function) {
  check_cuda(cudaStreamSynchronize(state_->stream), function, "cudaStreamSynchronize");
}

request nccl::record(std::string_view function) {
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), function,
             "cudaEventCreateWithFlags");
  pending_cuda_event pending(event, function);  // owns the event from here, even if record fails
  check_cuda(cudaEventRecord(event, state_->stream), function, "cudaEventRecord");
  return request(std::move(pending));
}

void nccl::barrier() {
  synchronize("kfsdp::comm::nccl::barrier");
  host_.barrier();
}

}  // namespace kfsdp::comm
