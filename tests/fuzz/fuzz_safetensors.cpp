// Fuzz target: the safetensors header parser (and reading every tensor it accepts).
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  const auto path = fuzz::write_scratch("f.safetensors", data, size);
  fuzz::expect_only_user_errors([&] {
    const SafetensorsFile f(path);
    std::vector<float> buf;
    for (const auto& [name, e] : f.entries()) {
      if (e.dtype != DType::F32 && e.dtype != DType::BF16 && e.dtype != DType::F16) continue;
      const auto n = shape_numel(e.shape);
      if (n > (int64_t(1) << 24)) continue;  // accepted sizes are backed by the file; keep the fuzzer fast
      buf.resize(size_t(n));
      read_as_f32(e, e.shape, buf.data(), name);
    }
  });
  return 0;
}
