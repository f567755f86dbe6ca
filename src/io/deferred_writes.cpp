#include "io/deferred_writes.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/host_memory.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {
thread_local DeferredWrites* g_active = nullptr;
constexpr std::string_view kNoSnapshotHint =
    "set background_checkpoints: false to write checkpoints from the device directly";
}  // namespace

DeferredWrites::Capture::Capture(DeferredWrites& d) : previous_(g_active) {
  g_active = &d;
}

DeferredWrites::Capture::~Capture() {
  g_active = previous_;
}

DeferredWrites* DeferredWrites::active() {
  return g_active;
}

Buffer SnapshotPool::take(size_t bytes, const std::string& what) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (const auto it = free_.find(bytes); it != free_.end()) {
      Buffer b = std::move(it->second);
      free_.erase(it);
      return b;
    }
  }
  check_host_memory(bytes, what, kNoSnapshotHint);
  return alloc_(bytes);
}

void SnapshotPool::give(Buffer b) {
  std::lock_guard<std::mutex> l(mu_);
  free_.emplace(b.bytes(), std::move(b));
}

DeferredWrites::~DeferredWrites() {
  release();
}

void DeferredWrites::add(const fs::path& path, const std::vector<StreamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  uint64_t bytes = 0;
  for (const StreamedTensor& t : tensors) bytes += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
  const std::string what = cat("the snapshot of ", path.filename().string(), " for a background checkpoint");
  if (!pool_) check_host_memory(bytes, what, kNoSnapshotHint);
  File f{path, {}, {}, metadata};
  // One buffer per file (a slab, tensors 64-byte aligned in it): a handful of pinned allocations per
  // checkpoint, not one per tensor (cudaHostAlloc costs far more than the copy of a small tensor).
  auto aligned = [](size_t n) { return (n + 63) / 64 * 64; };
  size_t slab = 64;
  for (const StreamedTensor& t : tensors) slab += aligned(size_t(shape_numel(t.shape)) * dtype_size(t.dtype));
  Buffer& d = f.data.emplace_back(pool_ ? pool_->take(slab, what) : Buffer::host(slab));
  char* at = static_cast<char*>(d.data());
  for (const StreamedTensor& t : tensors) {
    const size_t n = size_t(shape_numel(t.shape)) * dtype_size(t.dtype);
    t.fill(at);
    const char* src = at;
    f.tensors.push_back({t.name, t.dtype, t.shape, [src, n](void* dst) { std::memcpy(dst, src, n); }});
    at += aligned(n);
  }
  bytes_ += bytes;
  files_.push_back(std::move(f));
}

void DeferredWrites::release() {
  if (pool_)
    for (File& f : files_)
      for (Buffer& b : f.data) pool_->give(std::move(b));
  files_.clear();
  bytes_ = 0;
}

void DeferredWrites::moved(const fs::path& from, const fs::path& to) {
  for (File& f : files_) {
    const fs::path rel = f.path.lexically_relative(from);
    if (!rel.empty() && *rel.begin() != "..") f.path = to / rel;
  }
}

void DeferredWrites::write_all() {
  for (File& f : files_) write_safetensors_streamed(f.path, f.tensors, f.metadata);
  release();
}

}  // namespace soltrain
