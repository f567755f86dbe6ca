#include "io/deferred_writes.h"

#include <cstring>

#include "core/error.h"
#include "core/host_memory.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {
thread_local DeferredWrites* g_active = nullptr;
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

void DeferredWrites::add(const fs::path& path, const std::vector<StreamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  uint64_t bytes = 0;
  for (const StreamedTensor& t : tensors) bytes += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
  check_host_memory(bytes, cat("the snapshot of ", path.filename().string(), " for a background checkpoint"),
                    "set background_checkpoints: false to write checkpoints from the device directly");
  File f{path, {}, {}, metadata};
  f.data.reserve(tensors.size());
  for (const StreamedTensor& t : tensors) {
    std::vector<char>& d = f.data.emplace_back(size_t(shape_numel(t.shape)) * dtype_size(t.dtype));
    t.fill(d.data());
    const char* src = d.data();
    const size_t n = d.size();
    f.tensors.push_back({t.name, t.dtype, t.shape, [src, n](void* dst) { std::memcpy(dst, src, n); }});
  }
  bytes_ += bytes;
  files_.push_back(std::move(f));
}

void DeferredWrites::moved(const fs::path& from, const fs::path& to) {
  for (File& f : files_) {
    const fs::path rel = f.path.lexically_relative(from);
    if (!rel.empty() && *rel.begin() != "..") f.path = to / rel;
  }
}

void DeferredWrites::write_all() {
  for (File& f : files_) write_safetensors_streamed(f.path, f.tensors, f.metadata);
  files_.clear();
  bytes_ = 0;
}

}  // namespace soltrain
