// The NCCL communicator: CUDA ranks. Collectives are queued on the Side stream (Ops::native_stream); the
// caller orders them against Main with events (Ops::wait). The unique id travels through the host
// communicator of the launch (MPI under mpirun / srun, the TCP rendezvous at MASTER_ADDR:MASTER_PORT under
// torchrun's variables or `gpus: N`), which also carries barriers and host flags. A watchdog thread polls
// NCCL's asynchronous error state: a peer that died or a failed collective aborts the communicator and ends
// this rank with a message, instead of leaving it waiting on the GPU forever.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "core/error.h"
#include "dist/launch.h"

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
  NcclCommunicator(const LaunchEnv& env, Ops& ops) : ops_(ops) {
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
    NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t), ncclSum, comm_, stream()));
  }
  void all_reduce_max(Tensor t) override {
    NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t), ncclMax, comm_, stream()));
  }
  void reduce_scatter_sum(Tensor out, const Tensor& in) override {
    SOLTRAIN_CHECK(in.numel() == out.numel() * size_ && in.dtype == out.dtype);
    NCCL_CHECK(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in), ncclSum, comm_, stream()));
  }
  void all_gather(Tensor out, const Tensor& in) override {
    SOLTRAIN_CHECK(out.numel() == in.numel() * size_ && in.dtype == out.dtype);
    NCCL_CHECK(ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in), comm_, stream()));
  }
  void broadcast(Tensor t, int root) override {
    NCCL_CHECK(ncclBroadcast(t.data, t.data, size_t(t.numel()), nccl_type(t), root, comm_, stream()));
  }
  void barrier() override { host_->barrier(); }
  int64_t all_max_host(int64_t v) override { return host_->all_max_host(v); }

 private:
  cudaStream_t stream() { return static_cast<cudaStream_t>(ops_.native_stream(Ops::Stream::Side)); }

  void watch() {
    while (!stop_) {
      ncclResult_t err = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &err) == ncclSuccess && err != ncclSuccess && err != ncclInProgress) {
        std::fprintf(stderr, "%serror: NCCL failed (%s): another rank stopped or the network failed; stopping\n",
                     error_prefix().c_str(), ncclGetErrorString(err));
        ncclCommAbort(comm_);
        std::_Exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }

  Ops& ops_;
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
