// Shared helpers for tests: relative errors, fixture paths, random tensors, temporary folders.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace soltrain::test {

// The UserError `f` throws (its one line), or "no error".
inline std::string user_error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

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

// Element by element: |a − b| ≤ atol + rtol·|b| everywhere. A whole-tensor L2 error can hide one wrong row
// among thousands; this cannot. On failure it says how many elements fail and shows the worst.
inline ::testing::AssertionResult all_close(const float* a, const float* b, size_t n, double atol, double rtol) {
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(double(a[i]) - b[i]), allowed = atol + rtol * std::fabs(double(b[i]));
    const double excess = std::isfinite(err) ? err - allowed : INFINITY;
    if (excess > 0) ++bad;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements differ by more than " << atol << " + "
                                       << rtol << "·|ref|; worst at [" << worst << "]: " << a[worst] << " vs "
                                       << b[worst];
}
inline ::testing::AssertionResult all_close(const std::vector<float>& a, const std::vector<float>& b, double atol,
                                            double rtol) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  return all_close(a.data(), b.data(), a.size(), atol, rtol);
}
// Root mean square, the scale per-element tolerances are set against.
inline double rms(const float* v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(v[i]) * v[i];
  return n ? std::sqrt(s / double(n)) : 0.0;
}
inline double rms(const std::vector<float>& v) {
  return rms(v.data(), v.size());
}

// The seed a randomised test draws from: SOLTRAIN_TEST_SEED when set (to replay a failure), else the test's
// own fixed `fallback`, so a run is repeatable. Keep the returned trace alive in the test's scope: every
// failure then prints the seed.
inline uint32_t test_seed(uint32_t fallback) {
  const char* env = std::getenv("SOLTRAIN_TEST_SEED");
  return env && *env ? uint32_t(std::strtoul(env, nullptr, 10)) : fallback;
}
inline std::string seed_message(uint32_t seed) {
  return "random inputs from seed " + std::to_string(seed) + " (replay: SOLTRAIN_TEST_SEED=" + std::to_string(seed) +
         ")";
}
// A std::mt19937 named `name` from test_seed(fallback), with the seed printed on any failure in this scope.
#define SOLTRAIN_SEEDED_RNG(name, fallback)                           \
  const uint32_t name##_seed = ::soltrain::test::test_seed(fallback); \
  SCOPED_TRACE(::soltrain::test::seed_message(name##_seed));          \
  std::mt19937 name(name##_seed)

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
