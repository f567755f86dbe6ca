#include "core/buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/host_memory.h"

namespace soltrain {

Buffer Buffer::host(size_t bytes, void (*release)(void*)) {
  // Under a container's cgroup limit malloc succeeds (overcommit) and the memset below gets the process
  // killed without a word; so a large buffer is checked against the real limit first. Small ones are not:
  // reading the limit costs a few file reads, and they cannot decide whether a run fits.
  if (bytes >= kCheckedHostBytes) check_host_memory(bytes, "the next host buffer");
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded < bytes ? nullptr : std::aligned_alloc(64, rounded ? rounded : 64);
  // What the input asked for does not fit this machine: the user's to fix (smaller batch, sequence, model).
  if (!p)
    user_error("out of memory: cannot allocate ", double(bytes) / double(1u << 30),
               " GiB of host memory (a smaller batch, sequence length or model needs less)");
  std::memset(p, 0, rounded);
  return Buffer(
      p, bytes, Device::CPU, release ? release : [](void* q) { std::free(q); });
}

size_t Arena::plan(Shape shape, DType dtype) {
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  slots_.push_back({std::move(shape), dtype, total_});
  total_ += (bytes + 255) / 256 * 256;  // 256-byte alignment suits vector loads on every backend
  return slots_.size() - 1;
}

void Arena::bind(Buffer buffer) {
  SOLTRAIN_CHECK(buffer.bytes() >= total_, "arena needs ", total_, " bytes, got ", buffer.bytes());
  buffer_ = std::move(buffer);
}

Tensor Arena::get(size_t handle) const {
  const Slot& s = slots_.at(handle);
  SOLTRAIN_CHECK(buffer_.data(), "arena used before bind()");
  return Tensor{static_cast<char*>(buffer_.data()) + s.offset, s.dtype, s.shape, buffer_.device()};
}

}  // namespace soltrain
