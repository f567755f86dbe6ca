// The NCCL communicator: CUDA ranks. Collectives are queued on the Side stream (Ops::native_stream); the
// caller orders them against Main with events (Ops::wait). The unique id travels through the host
// communicator of the launch (MPI under mpirun / srun, the TCP rendezvous at MASTER_ADDR:MASTER_PORT under
// torchrun's variables or `gpus: N`), which also carries barriers and host flags. A watchdog thread polls
// NCCL's asynchronous error state: a peer that died or a failed collective aborts the communicator and ends
// this rank with a message, instead of leaving it waiting on the GPU forever. A peer that is alive but silent
// (stopped, hung, far behind) raises no error: a CUDA event queued after each collective
// (dist/pending_collectives.h) lets the watchdog see one unfinished ddp_timeout seconds after it was queued,
// and the rank ends with a line naming it (exit 2; the launcher then names the rank that did not stop).
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/launch.h"
#include "dist/pending_collectives.h"

namespace soltrain {

namespace {

#define NCCL_CHECK(call)                                                                                              \
  do {                                                                                                                \
    const ncclResult_t rc_ = (call);                                                                                  \
    if (rc_ != ncclSuccess)                                                                                           \
      throw RankFailure(::soltrain::cat(#call, " failed at ", __FILE__, ":", __LINE__, ": ", ncclGetErrorString(rc_), \
                                        " (", ncclGetLastError(nullptr), ")"));                                       \
  } while (0)

ncclDataType_t nccl_type(const Tensor& t) {
  SOLTRAIN_CHECK(t.device == Device::CUDA, "NCCL collectives take device tensors");
  switch (t.dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    default: break;
  }
  SOLTRAIN_CHECK(false, "NCCL collectives take F32, F64 or BF16");
  return ncclFloat32;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const LaunchEnv& env, Ops& ops) : ops_(ops), timeout_s_(env.timeout_s) {
    // A test seam (tests/gpu): the stream stalls before collective N, as behind a peer that never joins.
    if (const char* v = std::getenv("SOLTRAIN_TEST_NCCL_STALL")) stall_at_ = std::atoll(v);
    if (env.kind == LaunchEnv::Kind::Mpi)
      host_ = make_mpi_communicator();
    else if (env.world_size > 1)
      host_ = make_tcp_communicator(env);
    else
      host_ = make_single_communicator();
    rank_ = host_->rank();
    size_ = host_->size();
    ncclUniqueId id{};
    static_assert(sizeof id % sizeof(float) == 0);
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    host_->broadcast(Tensor{&id, DType::F32, {int64_t(sizeof id / sizeof(float))}, Device::CPU}, 0);
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclCommunicator() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    for (cudaEvent_t e : pending_.drain()) cudaEventDestroy(e);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (std::uncaught_exceptions() > 0)
      ncclCommAbort(comm_);  // peers may be gone: do not wait for them
    else
      ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  bool shards_in_place() const override { return true; }

  void all_reduce_sum(Tensor t) override {
    before("all_reduce_sum");
    NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t), ncclSum, comm_, stream()));
    after("all_reduce_sum", t.numel());
  }
  void all_reduce_max(Tensor t) override {
    before("all_reduce_max");
    NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t), ncclMax, comm_, stream()));
    after("all_reduce_max", t.numel());
  }
  void reduce_scatter_sum(Tensor out, const Tensor& in) override {
    SOLTRAIN_CHECK(in.numel() == out.numel() * size_ && in.dtype == out.dtype);
    before("reduce_scatter_sum");
    NCCL_CHECK(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in), ncclSum, comm_, stream()));
    after("reduce_scatter_sum", in.numel());
  }
  void all_gather(Tensor out, const Tensor& in) override {
    SOLTRAIN_CHECK(out.numel() == in.numel() * size_ && in.dtype == out.dtype);
    before("all_gather");
    // Moved, not summed: other dtypes as their bytes (a sharded frozen base's codes and scales are U8).
    const bool raw = in.dtype != DType::F32 && in.dtype != DType::F64 && in.dtype != DType::BF16;
    SOLTRAIN_CHECK(in.device == Device::CUDA, "NCCL collectives take device tensors");
    NCCL_CHECK(ncclAllGather(in.data, out.data, raw ? in.bytes() : size_t(in.numel()), raw ? ncclUint8 : nccl_type(in),
                             comm_, stream()));
    after("all_gather", out.numel());
  }
  void broadcast(Tensor t, int root) override {
    before("broadcast");
    NCCL_CHECK(ncclBroadcast(t.data, t.data, size_t(t.numel()), nccl_type(t), root, comm_, stream()));
    after("broadcast", t.numel());
  }
  void barrier() override { host_->barrier(); }
  int64_t all_max_host(int64_t v) override { return host_->all_max_host(v); }

 private:
  cudaStream_t stream() { return static_cast<cudaStream_t>(ops_.native_stream(Ops::Stream::Side)); }

  static void CUDART_CB stall_forever(void*) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  void before(const char*) {
    if (++queued_ == stall_at_) cudaLaunchHostFunc(stream(), stall_forever, nullptr);
  }
  // Queues a marker behind the collective just queued, for the watchdog's timeout.
  void after(const char* op, int64_t elements) {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> g(events_m_);
      if (!free_events_.empty()) e = free_events_.back(), free_events_.pop_back();
    }
    if (!e && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return;  // (unwatched)
    cudaEventRecord(e, stream());
    pending_.queued(e, cat(op, " of ", elements, " elements"));
  }

  // Aborts the communicator (frees its kernels and peers' connections) and ends the process, exit 2 as a
  // RankFailure; the exit comes within 5 s even when the abort itself waits on a stuck GPU.
  [[noreturn]] void abort_and_exit() {
    std::thread([c = comm_] {
      ncclCommAbort(c);
      std::_Exit(2);
    }).detach();
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(2);
  }

  void watch() {
    std::vector<cudaEvent_t> finished;
    while (!stop_) {
      ncclResult_t err = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &err) == ncclSuccess && err != ncclSuccess && err != ncclInProgress) {
        print_error_line(cat("error: NCCL failed (", ncclGetErrorString(err),
                             "): another rank stopped or the network failed; stopping"));
        abort_and_exit();
      }
      finished.clear();
      const auto late = pending_.check([](cudaEvent_t e) { return cudaEventQuery(e) != cudaErrorNotReady; },
                                       std::chrono::seconds(timeout_s_), finished);
      if (!finished.empty()) {
        std::lock_guard<std::mutex> g(events_m_);
        free_events_.insert(free_events_.end(), finished.begin(), finished.end());
      }
      if (late) {
        print_error_line(cat("error: NCCL ", late->what, " has not finished ", int64_t(late->waited_s),
                             " s after it was queued (ddp_timeout ", timeout_s_,
                             " s): another rank is stopped, hung or far behind; stopping"));
        abort_and_exit();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_s_ < 10 ? 100 : 500));
    }
  }

  Ops& ops_;
  int timeout_s_;  // ddp_timeout
  int64_t queued_ = 0, stall_at_ = -1;
  PendingCollectives<cudaEvent_t> pending_;
  std::mutex events_m_;
  std::vector<cudaEvent_t> free_events_;  // markers the GPU has passed, for reuse
  std::unique_ptr<Communicator> host_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnv& env, Ops& ops) {
  return std::make_unique<NcclCommunicator>(env, ops);
}

}  // namespace soltrain
