// Tensor: a non-owning view (dtype, shape, device, pointer). Owners are Buffer and the arenas.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace soltrain {

enum class Device { CPU, CUDA };
inline const char* device_name(Device d) {  // as configs and flags spell it
  return d == Device::CUDA ? "cuda" : "cpu";
}

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s);  // "[2, 3]"

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  int64_t numel() const { return shape_numel(shape); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  int rank() const { return int(shape.size()); }
  bool defined() const { return data != nullptr; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  float* f32() const {
    SOLTRAIN_CHECK(dtype == DType::F32, "tensor is ", dtype_name(dtype), ", expected F32");
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    SOLTRAIN_CHECK(dtype == DType::I32, "tensor is ", dtype_name(dtype), ", expected I32");
    return static_cast<int32_t*>(data);
  }
  // Elements [first, first + count) of the flat tensor, as a 1-D tensor of the same memory.
  Tensor flat_part(int64_t first, int64_t count) const {
    SOLTRAIN_CHECK(first >= 0 && count >= 0 && first + count <= numel(), "elements [", first, ", ", first + count,
                   ") of ", shape_str(shape));
    return Tensor{static_cast<char*>(data) + size_t(first) * dtype_size(dtype), dtype, {count}, device};
  }
  // Same memory, another shape with the same element count.
  Tensor view(Shape s) const {
    SOLTRAIN_CHECK(shape_numel(s) == numel(), "view ", shape_str(s), " of ", shape_str(shape));
    Tensor t = *this;
    t.shape = std::move(s);
    return t;
  }
  // Rows [begin, end) of the leading dimension.
  Tensor rows(int64_t begin, int64_t end) const {
    SOLTRAIN_CHECK(0 <= begin && begin <= end && end <= shape.at(0), "rows ", begin, "..", end);
    Tensor t = *this;
    t.shape[0] = end - begin;
    t.data = static_cast<char*>(data) + size_t(begin) * (bytes() / size_t(shape[0] ? shape[0] : 1));
    return t;
  }
};

}  // namespace soltrain
