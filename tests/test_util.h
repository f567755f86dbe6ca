// Shared helpers for tests: relative errors, fixture paths, random tensors, temporary folders.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace soltrain::test {

inline std::filesystem::path fixtures() {
  return SOLTRAIN_FIXTURES;
}

// The reference model fixtures every whole-model test runs on (tests/fixtures/models).
inline const auto kReferenceModels =
    ::testing::Values("qwen3-tiny", "llama-tiny", "qwen2-tiny-mqa-bias", "llama3-tiny-scaled", "qwen3-tiny-linear");
// A fixture name as a test name (gtest allows only letters, digits and '_').
inline std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

// ‖a − b‖₂ / ‖b‖₂; NaN anywhere gives infinity so it can never pass a tolerance.
inline double rel_err(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

inline std::vector<float> to_f32(const TensorEntry& e) {
  std::vector<float> v(size_t(shape_numel(e.shape)));
  read_as_f32(e, e.shape, v.data(), "test");
  return v;
}

inline std::vector<float> random_vec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A fresh empty folder under the system temp dir, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("soltrain-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

}  // namespace soltrain::test
