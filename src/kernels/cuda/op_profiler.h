// Per-op GPU time (cudaEvents around each op of the CUDA backend), for the per-kernel breakdown that
// bench prints. Off by default: then a scope costs one branch.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace soltrain {

class OpProfiler {
 public:
  ~OpProfiler();
  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  class Scope {
   public:
    Scope(OpProfiler* p, const char* name, cudaStream_t s);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler* p_;
    cudaStream_t s_;
    size_t index_ = 0;
  };

  // Waits for the stream, folds pending events into totals (milliseconds by op name) and returns them.
  std::map<std::string, double> collect(cudaStream_t s);

 private:
  struct Span {
    const char* name;
    cudaEvent_t start, stop;
  };
  cudaEvent_t event();
  bool enabled_ = false;
  std::vector<Span> spans_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, double> totals_;
};

}  // namespace soltrain
