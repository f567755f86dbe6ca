// CUDA backend: construction, memory, copies. The ops themselves live in one .cu file each.
#include "kernels/cuda/cuda_ops.h"

#include <cstdlib>
#include <cstring>

#include "core/device_memory.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "kernels/cuda/check.h"

namespace soltrain {

namespace {
void require_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    user_error("--device cuda: no CUDA GPU is visible (use --device cpu)");
  }
}
}  // namespace

std::unique_ptr<Ops> make_cuda_ops() {
  require_gpu();
  return std::make_unique<CudaOps>();
}

std::unique_ptr<Ops> make_ops_beside(Device device) {
  if (device == Device::CPU) return make_cpu_ops();
  require_gpu();
  int least = 0, greatest = 0;  // (the greatest priority is the lowest number)
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // SOLTRAIN_BESIDE_PRIORITY=0: the default priority instead (a benchmark's comparison)
  const char* prio = std::getenv("SOLTRAIN_BESIDE_PRIORITY");
  return std::make_unique<CudaOps>(prio && std::strcmp(prio, "0") == 0 ? least : greatest);
}

CudaOps::CudaOps(int stream_priority) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev));
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  // The sm_90a image runs only on 9.0 exactly. SOLTRAIN_ATTENTION=portable keeps the sm_80 kernels (tests
  // run both; benchmarks compare them).
  const char* choice = std::getenv("SOLTRAIN_ATTENTION");
  sm90_ = major == 9 && minor == 0;
  compute_capability_ = major * 10 + minor;
  hopper_attention_ = sm90_ && !(choice && std::strcmp(choice, "portable") == 0);
  // How the Hopper backward forms dQ (kernels/ops.h): the setting `attention_backward` through
  // set_attention_backward, or for a whole process (tests, benchmarks) SOLTRAIN_ATTENTION_BACKWARD, which then
  // wins over the setting.
  if (const char* form = std::getenv("SOLTRAIN_ATTENTION_BACKWARD"); form && *form) {
    attention_backward_ = parse_attention_backward(form, "SOLTRAIN_ATTENTION_BACKWARD");
    attention_backward_from_env_ = true;
  }
  if (const char* order = std::getenv("SOLTRAIN_ATTENTION_ORDER"); order && *order) {
    if (std::strcmp(order, "shortest") == 0)
      attention_order_ = cuda::LaunchOrder::ShortestFirst;
    else if (std::strcmp(order, "longest") == 0)
      attention_order_ = cuda::LaunchOrder::LongestFirst;
    else
      user_error("SOLTRAIN_ATTENTION_ORDER is '", order, "': expected shortest or longest");
  }
  for (cudaStream_t& st : streams_)
    CUDA_CHECK(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, stream_priority));
  stream_ = streams_[0];
  for (cudaEvent_t& e : marks_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming));
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  workspace_ = alloc(size_t(32) << 20);  // cuBLASLt's recommended workspace on Hopper
  reduce_out_ = alloc(64 * sizeof(double));
  void* pinned = nullptr;
  CUDA_CHECK(cudaMallocHost(&pinned, sizeof(double)));
  host_result_ = static_cast<double*>(pinned);
}

CudaOps::~CudaOps() {
  cudaDeviceSynchronize();
  plans_.clear();
  if (host_result_) cudaFreeHost(host_result_);
  if (lt_) cublasLtDestroy(lt_);
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  if (order_) cudaEventDestroy(order_);
  for (cudaStream_t st : streams_) cudaStreamDestroy(st);
}

Buffer CudaOps::alloc(size_t bytes) {
  void* p = nullptr;
  const size_t rounded = (bytes + 255) / 256 * 256;
  const cudaError_t err = cudaMalloc(&p, rounded ? rounded : 256);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    user_error("out of GPU memory: needed ", double(bytes) / (1 << 30), " GiB more, ", double(free_b) / (1 << 30),
               " GiB free of ", double(total_b) / (1 << 30),
               ": lower per_device_train_batch_size or sequence_len, set recompute: selective (or full), or use lora; "
               "host memory can hold more (offload_activations with recompute: full; with lora offload_weights; "
               "without it offload_master and offload_optimizer)");
  }
  CUDA_CHECK(err);
  CUDA_CHECK(cudaMemsetAsync(p, 0, rounded ? rounded : 256, stream_));
  device_allocated(p, rounded);
  return Buffer(p, bytes, Device::CUDA, [](void* q) {
    device_freed(q);
    cudaFree(q);
  });
}

void CudaOps::copy(Tensor dst, const Tensor& src) {
  const auto prof = profile(dst.device == Device::CPU || src.device == Device::CPU ? "copy host<->device" : "copy");
  SOLTRAIN_CHECK(dst.bytes() == src.bytes() && dst.dtype == src.dtype, "copy ", shape_str(src.shape), " -> ",
                 shape_str(dst.shape));
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, stream_));
  // A host destination must be complete when copy() returns (callers read it next).
  if (dst.device == Device::CPU || src.device == Device::CPU) CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::zero(Tensor t) {
  const auto prof = profile("zero");
  CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
}

void CudaOps::synchronize() {
  for (cudaStream_t st : streams_) CUDA_CHECK(cudaStreamSynchronize(st));
}

void CudaOps::wait(Stream waiter, Stream on) {
  if (waiter == on) return;
  CUDA_CHECK(cudaEventRecord(order_, streams_[int(on)]));
  CUDA_CHECK(cudaStreamWaitEvent(streams_[int(waiter)], order_, 0));
}

Buffer CudaOps::alloc_host(size_t bytes) {
  // Pinned pages cannot be swapped or reclaimed: one past the cgroup limit gets the process killed, so every
  // pinned buffer (few, all planned) is checked against the real limit first.
  check_host_memory(bytes, "pinned host memory");
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
  std::memset(p, 0, bytes);
  return Buffer(p, bytes, Device::CPU, [](void* q) { cudaFreeHost(q); });
}

void CudaOps::upload_async(Tensor dst, const Tensor& src) {
  const auto prof = profile("copy host->device (async)");
  SOLTRAIN_CHECK(dst.bytes() == src.bytes() && dst.dtype == src.dtype && src.device == Device::CPU, "upload_async");
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaOps::download_async(Tensor dst, const Tensor& src) {
  const auto prof = profile("copy device->host (async)");
  SOLTRAIN_CHECK(dst.bytes() == src.bytes() && dst.dtype == src.dtype && dst.device == Device::CPU, "download_async");
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
}

std::function<void()> CudaOps::fence() {
  // An event of its own (marks_ are recycled and read by this thread only), waited for and freed by the caller.
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(e, stream_));
  return [e] {
    CUDA_CHECK(cudaEventSynchronize(e));
    CUDA_CHECK(cudaEventDestroy(e));
  };
}

uint64_t CudaOps::mark() {
  ++marks_made_;
  CUDA_CHECK(cudaEventRecord(marks_[marks_made_ % kMarks], stream_));
  return marks_made_;
}

void CudaOps::host_wait(uint64_t mark) {
  if (mark == 0 || mark > marks_made_) return;
  if (marks_made_ - mark >= uint64_t(kMarks)) return synchronize();  // its event was recorded again since
  CUDA_CHECK(cudaEventSynchronize(marks_[mark % kMarks]));
}

void CudaOps::wait_mark(uint64_t mark) {
  if (mark == 0 || mark > marks_made_) return;
  if (marks_made_ - mark >= uint64_t(kMarks)) {  // its event was recorded again since: wait for every stream
    for (cudaStream_t st : streams_)
      if (st != stream_) {
        CUDA_CHECK(cudaEventRecord(order_, st));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, order_, 0));
      }
    return;
  }
  CUDA_CHECK(cudaStreamWaitEvent(stream_, marks_[mark % kMarks], 0));
}

double CudaOps::memory_used_gib() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return double(total_b - free_b) / double(1u << 30);
}

double CudaOps::memory_total_gib() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return double(total_b) / double(1u << 30);
}

double CudaOps::memory_free_gib() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return double(free_b) / double(1u << 30);
}

namespace {
// One instantiated CUDA graph, replayed on the stream it was recorded from.
class CudaRecorded final : public Ops::Recorded {
 public:
  CudaRecorded(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaRecorded() override { cudaGraphExecDestroy(exec_); }
  void replay() override { CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};
}  // namespace

std::unique_ptr<Ops::Recorded> CudaOps::record(const std::function<void()>& ops, std::string* why) {
  auto refuse = [&](std::string reason) -> std::unique_ptr<Recorded> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  // The profiler times each op with events around it: recorded, they would time nothing.
  if (profiler_.enabled()) return refuse("ops are being profiled");
  const cudaStream_t s = stream_;
  // ThreadLocal: this thread's calls that would break the recording (a host sync, cudaMalloc) fail, other
  // threads (a background checkpoint's writer) go on as usual.
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::string failed;
  try {
    ops();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  cudaGetLastError();  // a failed recording leaves its error behind
  if (!failed.empty() || ended != cudaSuccess || stream_ != s) {
    if (graph) cudaGraphDestroy(graph);
    return refuse(!failed.empty()        ? failed
                  : ended != cudaSuccess ? cudaGetErrorString(ended)
                                         : "the ops switched streams");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    return refuse(cudaGetErrorString(made));
  }
  return std::make_unique<CudaRecorded>(exec, s);
}

void* CudaOps::scratch(size_t bytes) {
  if (scratch_.bytes() < bytes) {
    synchronize();  // the old scratch may still be in use
    scratch_ = alloc(bytes);
  }
  return scratch_.data();
}

}  // namespace soltrain
