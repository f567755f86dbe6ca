#include "kernels/cuda/op_profiler.h"

#include "kernels/cuda/check.h"

namespace soltrain {

OpProfiler::~OpProfiler() {
  for (auto& s : spans_) pool_.push_back(s.start), pool_.push_back(s.stop);
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::event() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

OpProfiler::Scope::Scope(OpProfiler* p, const char* name, cudaStream_t s) : p_(p->enabled_ ? p : nullptr), s_(s) {
  if (!p_) return;
  index_ = p_->spans_.size();
  p_->spans_.push_back({name, p_->event(), p_->event()});
  CUDA_CHECK(cudaEventRecord(p_->spans_.back().start, s_));
}

OpProfiler::Scope::~Scope() {
  if (p_) cudaEventRecord(p_->spans_[index_].stop, s_);
}

std::map<std::string, double> OpProfiler::collect(cudaStream_t s) {
  CUDA_CHECK(cudaStreamSynchronize(s));
  for (auto& span : spans_) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, span.start, span.stop));
    totals_[span.name] += ms;
    pool_.push_back(span.start);
    pool_.push_back(span.stop);
  }
  spans_.clear();
  auto out = totals_;
  totals_.clear();
  return out;
}

}  // namespace soltrain
