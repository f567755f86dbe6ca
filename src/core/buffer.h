// Buffer: owns one allocation on a device (RAII); Arena hands out tensors from it, planned up front.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace soltrain {

class Buffer {
 public:
  Buffer() = default;
  // Host memory, 64-byte aligned and zeroed. From kCheckedHostBytes on, refused (UserError, with the
  // figures) when it exceeds the host memory still available under the cgroup limit (core/host_memory.h).
  // `release` frees it (std::free unless a caller tracks it: core/device_memory.h).
  static Buffer host(size_t bytes, void (*release)(void*) = nullptr);
  static constexpr size_t kCheckedHostBytes = size_t(64) << 20;
  // Takes ownership of memory a backend allocated; `release` frees it.
  Buffer(void* ptr, size_t bytes, Device device, void (*release)(void*))
      : ptr_(ptr, release), bytes_(bytes), device_(device) {}

  void* data() const { return ptr_.get(); }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  std::unique_ptr<void, void (*)(void*)> ptr_{nullptr, [](void*) {}};
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
};

// Two passes: `plan` records each tensor's size, then `bind` places all of them in one buffer. The step
// itself then allocates nothing; the total is known (and printed) before the first step.
class Arena {
 public:
  // Returns a handle; the tensor is usable after bind().
  size_t plan(Shape shape, DType dtype);
  size_t total_bytes() const { return total_; }
  void bind(Buffer buffer);
  Tensor get(size_t handle) const;

 private:
  struct Slot {
    Shape shape;
    DType dtype;
    size_t offset;
  };
  std::vector<Slot> slots_;
  size_t total_ = 0;
  Buffer buffer_;
};

}  // namespace soltrain
