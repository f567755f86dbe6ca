// The frozen-base formats' CPU twins (kernels/quant.h, kernels/cpu/quantize.h): E4M3 / E5M2 rounding on
// hand-checked bit patterns (max, overflow, subnormals, ties) and against a brute-force nearest-value search;
// NF4 (nibble order, codes, ties, double quantisation), FP8 blocks and LLM.int8 rows on fresh random inputs.
#include <cmath>
#include <limits>

#include "kernels/blockwise8.h"
#include "kernels/cpu/quantize.h"
#include "kernels/quant.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

using namespace soltrain::quant;

TEST(Fp8Rounding, E4m3HandCheckedBitPatterns) {
  struct Case {
    float x;
    uint8_t bits;
  };
  const Case cases[] = {
      {1.0f, 0x38},           // exponent 7 (the bias), mantissa 0
      {-2.0f, 0xc0},          // sign, exponent 8
      {448.0f, 0x7e},         // the largest finite: 1.75 · 2^8
      {464.0f, 0x7e},         // the tie between 448 and 480 goes to the even mantissa (448)
      {470.0f, 0x7f},         // nearer 480, which E4M3 spends on NaN: torch gives NaN
      {480.0f, 0x7f},         // overflow: NaN (torch does not saturate)
      {INFINITY, 0x7f},       // no inf in E4M3fn: NaN
      {-INFINITY, 0xff},      //
      {0.015625f, 0x08},      // 2^-6, the smallest normal
      {0.001953125f, 0x01},   // 2^-9, the smallest subnormal
      {0.0009765625f, 0x00},  // 2^-10: the tie between 0 and 2^-9 goes to 0 (even)
      {0.0029296875f, 0x02},  // 3·2^-10: the tie between 1 and 2 subnormal steps goes to 2
      {0.013671875f, 0x07},   // 7·2^-9, the largest subnormal
      {1.0625f, 0x38},        // 1 + 1/16: the tie between 1.0 and 1.125 goes to 1.0 (even)
      {1.1875f, 0x3a},        // 1 + 3/16: the tie between 1.125 and 1.25 goes to 1.25 (even)
      {-0.0f, 0x80},          //
      {1e-30f, 0x00},         // underflow to zero
  };
  for (const Case& c : cases) EXPECT_EQ(int(f32_to_e4m3(c.x, false)), int(c.bits)) << c.x;
  EXPECT_EQ(int(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN(), false)), 0x7f);
  // Saturating: finite overflow and inf clamp to ±448; NaN stays NaN.
  EXPECT_EQ(int(f32_to_e4m3(470.0f, true)), 0x7e);
  EXPECT_EQ(int(f32_to_e4m3(1e9f, true)), 0x7e);
  EXPECT_EQ(int(f32_to_e4m3(-INFINITY, true)), 0xfe);
  EXPECT_EQ(int(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN(), true)), 0x7f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);
  EXPECT_EQ(e4m3_to_f32(0xc0), -2.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(Fp8Rounding, E5m2HandCheckedBitPatterns) {
  struct Case {
    float x;
    uint8_t bits;
  };
  const Case cases[] = {
      {1.0f, 0x3c},                 // exponent 15 (the bias)
      {57344.0f, 0x7b},             // the largest finite: 1.75 · 2^15
      {61439.0f, 0x7b},             // below the tie
      {61440.0f, 0x7c},             // the tie between 57344 (odd mantissa) and 65536 rounds up: inf
      {65536.0f, 0x7c},             // overflow: inf (torch does not saturate)
      {INFINITY, 0x7c},             //
      {-INFINITY, 0xfc},            //
      {6.103515625e-05f, 0x04},     // 2^-14, the smallest normal
      {1.52587890625e-05f, 0x01},   // 2^-16, the smallest subnormal
      {7.62939453125e-06f, 0x00},   // 2^-17: tie to 0 (even)
      {2.288818359375e-05f, 0x02},  // 3·2^-17: tie to 2 subnormal steps (even)
      {1.125f, 0x3c},               // 1 + 1/8: tie between 1.0 and 1.25 goes to 1.0
      {1.375f, 0x3e},               // 1 + 3/8: tie between 1.25 and 1.5 goes to 1.5
  };
  for (const Case& c : cases) EXPECT_EQ(int(f32_to_e5m2(c.x, false)), int(c.bits)) << c.x;
  EXPECT_EQ(int(f32_to_e5m2(std::numeric_limits<float>::quiet_NaN(), false)), 0x7f);
  EXPECT_EQ(int(f32_to_e5m2(61440.0f, true)), 0x7b);
  EXPECT_EQ(int(f32_to_e5m2(-INFINITY, true)), 0xfb);
  EXPECT_EQ(e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(0x01), 1.52587890625e-05f);
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0x7c)));
  EXPECT_TRUE(std::isnan(e5m2_to_f32(0x7d)));
}

// Every finite code decodes and encodes back to itself.
TEST(Fp8Rounding, EveryFiniteCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const float x4 = e4m3_to_f32(uint8_t(b)), x5 = e5m2_to_f32(uint8_t(b));
    if (std::isfinite(x4)) {
      EXPECT_EQ(int(f32_to_e4m3(x4, false)), b) << "e4m3 " << b;
    }
    if (std::isfinite(x5)) {
      EXPECT_EQ(int(f32_to_e5m2(x5, false)), b) << "e5m2 " << b;
    }
  }
}

// Against a search over all finite codes: the nearest value, a tie going to the even code (the even
// mantissa), for random magnitudes across the whole range, subnormals included.
TEST(Fp8Rounding, RandomValuesRoundToTheNearestCode) {
  SOLTRAIN_SEEDED_RNG(rng, 20261201);
  std::uniform_real_distribution<float> exponent(-22.0f, 9.0f), sign(-1.0f, 1.0f);
  for (bool e4 : {true, false}) {
    const float max = e4 ? kE4m3Max : kE5m2Max;
    for (int i = 0; i < 20000; ++i) {
      const float x = std::copysign(std::exp2(exponent(rng) + (e4 ? 0.0f : 7.0f)), sign(rng));
      if (std::fabs(x) >= max) continue;
      int best = -1;
      double best_d = INFINITY;
      for (int b = 0; b < 256; ++b) {
        const float v = e4 ? e4m3_to_f32(uint8_t(b)) : e5m2_to_f32(uint8_t(b));
        if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
        const double d = std::fabs(double(v) - double(x));
        if (d < best_d || (d == best_d && (b & 1) == 0)) best_d = d, best = b;
      }
      const int got = e4 ? f32_to_e4m3(x, false) : f32_to_e5m2(x, false);
      ASSERT_EQ(got, best) << (e4 ? "e4m3 " : "e5m2 ") << x;
    }
  }
}

// bitsandbytes' layout on a block whose values are the codes times 2.5: every code once per 16 values, the
// even element in the high nibble, and (one block: the absmaxes' mean is the absmax) exact values back.
TEST(Nf4, HandCheckedBlockAndNibbleOrder) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[size_t(i)] = nf4_code((i * 15) % 16) * 2.5f;  // 0, 15, 14, ... so high = 0
  const Nf4Layout l(64);
  std::vector<uint8_t> data(size_t(l.data_bytes())), scale(size_t(l.scale_bytes()));
  nf4_quantize(x.data(), 64, data.data(), scale.data());
  EXPECT_EQ(int(data[0]), 0x0f);  // x[0] = code 0 (-1), x[1] = code 15 (+1)
  EXPECT_EQ(int(data[1]), 0xed);  // codes 14, 13
  std::vector<float> back(64);
  nf4_dequantize(data.data(), scale.data(), 64, back.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(back[size_t(i)], x[size_t(i)]) << i;
  EXPECT_EQ(reinterpret_cast<const float*>(scale.data())[0], 2.5f);  // the mean of the one absmax
  // The map of the nested quantisation is bitsandbytes' signed dynamic map.
  const auto map = dynamic_quant_map(true);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(reinterpret_cast<const float*>(scale.data())[1 + i], map[size_t(i)]);
}

// A value exactly on the midpoint between two codes takes the lower code (torch.bucketize, right=False);
// one ulp above it, the upper.
TEST(Nf4, MidpointTiesGoToTheLowerCode) {
  std::vector<float> x(64, 0.0f);
  x[0] = 1.0f;  // absmax 1: the scaled values are the values
  const float mid = (nf4_code(7) + nf4_code(8)) / 2.0f;
  x[2] = mid;
  x[3] = std::nextafter(mid, 1.0f);
  const Nf4Layout l(64);
  std::vector<uint8_t> data(size_t(l.data_bytes())), scale(size_t(l.scale_bytes()));
  nf4_quantize(x.data(), 64, data.data(), scale.data());
  EXPECT_EQ(int(data[1]), 0x78);
}

// Fresh normal weights over several nested blocks and a ragged tail: every code is the nearest to x / absmax
// (a search over the 16), and every absmax comes back within the 8-bit map's half-step of itself.
TEST(Nf4, RandomRoundTripPicksNearestCodesAndKeepsAbsmax) {
  SOLTRAIN_SEEDED_RNG(rng, 4242);
  const int64_t n = 64 * 600 + 37;  // 601 blocks: three nested blocks, the last block 37 long
  std::vector<float> x = random_vec(size_t(n), rng, 0.02f);
  for (int64_t i = 0; i < n; i += 997) x[size_t(i)] *= 8.0f;  // outliers: absmaxes that differ
  const Nf4Layout l(n);
  std::vector<uint8_t> data(size_t(l.data_bytes())), scale(size_t(l.scale_bytes()));
  nf4_quantize(x.data(), n, data.data(), scale.data());
  EXPECT_EQ(data.back() & 15, 0);  // n is odd: the pad nibble is code index 0, as bitsandbytes pads
  const auto map = dynamic_quant_map(true);
  double widest_gap = 0;  // of the map, near its ends, where the absmaxes less their mean fall
  for (int i = 0; i + 1 < 256; ++i) widest_gap = std::max(widest_gap, double(map[size_t(i) + 1]) - map[size_t(i)]);
  const float* nested = reinterpret_cast<const float*>(scale.data() + l.nested_offset());
  std::vector<float> back(static_cast<size_t>(n));
  nf4_dequantize(data.data(), scale.data(), n, back.data());
  for (int64_t b = 0; b < l.blocks; ++b) {
    const int64_t begin = b * kNf4Block, end = std::min(n, begin + kNf4Block);
    float absmax = 0;
    for (int64_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(x[size_t(i)]));
    const float got = nf4_absmax(scale.data(), l, b);
    ASSERT_LE(std::fabs(double(got) - absmax), widest_gap / 2 * nested[b / kNf4NestedBlock] + 1e-7) << "block " << b;
    for (int64_t i = begin; i < end; ++i) {
      const float s = std::clamp(x[size_t(i)] * (1.0f / absmax), -1.0f, 1.0f);
      int best = 0;
      for (int k = 1; k < 16; ++k)
        if (std::fabs(nf4_code(k) - s) < std::fabs(nf4_code(best) - s)) best = k;
      const uint8_t byte = data[size_t(i / 2)];
      ASSERT_EQ((i & 1) ? (byte & 15) : (byte >> 4), best) << "element " << i;
      ASSERT_EQ(back[size_t(i)], nf4_code(best) * got) << "element " << i;
    }
  }
}

// A ragged FP8 matrix (tiles cut at both edges) and an all-zero tile: each tile's absmax lands on ±448,
// its scale_inv is 1 / (448 / amax), each code is the saturating E4M3 of x · scale, and dequantised values
// sit within E4M3's half-ulp (2^-4 relative) or its subnormal step.
TEST(Fp8Block, RandomRoundTrip) {
  SOLTRAIN_SEEDED_RNG(rng, 777);
  const int64_t rows = 300, cols = 200, T = kFp8Tile, tc = (cols + T - 1) / T;
  std::vector<float> x = random_vec(size_t(rows * cols), rng, 0.05f);
  for (int64_t r = 256; r < rows; ++r)
    for (int64_t c = 128; c < cols; ++c) x[size_t(r * cols + c)] = 0.0f;  // the last tile: all zero
  std::vector<uint8_t> q(x.size());
  std::vector<float> s(size_t(3 * tc)), back(x.size());
  fp8_block_quantize(x.data(), rows, cols, q.data(), s.data());
  fp8_block_dequantize(q.data(), s.data(), rows, cols, back.data());
  EXPECT_EQ(s[size_t(2 * tc + 1)], 1.0f);
  for (int64_t bi = 0; bi < 3; ++bi)
    for (int64_t bj = 0; bj < tc; ++bj) {
      float amax = 0;
      int max_code = 0;
      for (int64_t r = bi * T; r < std::min(rows, (bi + 1) * T); ++r)
        for (int64_t c = bj * T; c < std::min(cols, (bj + 1) * T); ++c) {
          amax = std::max(amax, std::fabs(x[size_t(r * cols + c)]));
          max_code = std::max(max_code, q[size_t(r * cols + c)] & 0x7f);
        }
      if (amax == 0) continue;
      const float scale = (1.0f / amax) * kE4m3Max;  // transformers' 448 / amax in torch: reciprocal, then times
      EXPECT_EQ(s[size_t(bi * tc + bj)], 1.0f / scale);
      EXPECT_EQ(max_code, 0x7e) << "tile " << bi << "," << bj;
      for (int64_t r = bi * T; r < std::min(rows, (bi + 1) * T); ++r)
        for (int64_t c = bj * T; c < std::min(cols, (bj + 1) * T); ++c) {
          const size_t i = size_t(r * cols + c);
          ASSERT_EQ(q[i], f32_to_e4m3(x[i] * scale, true)) << r << "," << c;
          ASSERT_LE(std::fabs(back[i] - x[i]), std::fabs(x[i]) / 16 + 0.001f / scale) << r << "," << c;
        }
    }
}

// LLM.int8 rows (bitsandbytes' int8_vectorwise_quant / _dequant): codes round(x · (127 / absmax)) in fp32 with
// ties to even (127 / absmax as torch's rdiv: reciprocal, then times 127), so a row's absmax is ±127 and a value
// landing on k + 0.5 goes to the even neighbour; an all-zero row keeps zeros; dequantised (code · absmax) ·
// fp32(1/127). python/tests/test_int8_base.py checks the same against bitsandbytes itself.
TEST(Int8Row, CodesRoundToEvenAndDequantiseAsBitsandbytes) {
  SOLTRAIN_SEEDED_RNG(rng, 127);
  const int64_t rows = 5, cols = 300;
  std::vector<float> x = random_vec(size_t(rows * cols), rng, 0.05f);
  for (int64_t c = 0; c < cols; ++c) x[size_t(3 * cols + c)] = 0.0f;  // row 3: all zero
  // row 4: absmax 127 (scale 1): ties at 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, and 126.5 -> 126
  for (int64_t c = 0; c < cols; ++c) x[size_t(4 * cols + c)] = 0.25f * float(c % 9);
  x[size_t(4 * cols + 0)] = 127.0f, x[size_t(4 * cols + 1)] = 2.5f, x[size_t(4 * cols + 2)] = 3.5f;
  x[size_t(4 * cols + 3)] = -2.5f, x[size_t(4 * cols + 4)] = 126.5f;
  std::vector<uint8_t> q(x.size());
  std::vector<float> absmax(static_cast<size_t>(rows)), back(x.size());
  int8_row_quantize(x.data(), rows, cols, q.data(), absmax.data());
  int8_row_dequantize(q.data(), absmax.data(), rows, cols, back.data());
  auto code = [&](int64_t r, int64_t c) { return int(int8_t(q[size_t(r * cols + c)])); };
  EXPECT_EQ(absmax[3], 0.0f);
  EXPECT_EQ(code(4, 0), 127);
  EXPECT_EQ(code(4, 1), 2);
  EXPECT_EQ(code(4, 2), 4);
  EXPECT_EQ(code(4, 3), -2);
  EXPECT_EQ(code(4, 4), 126);
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, std::fabs(x[size_t(r * cols + c)]));
    EXPECT_EQ(absmax[size_t(r)], m) << r;
    int extreme = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[size_t(r * cols + c)], scaled = m > 0 ? v * ((1.0f / m) * 127.0f) : 0.0f;  // torch's rdiv
      // the nearest integer, the even one on a tie
      const double lo = std::floor(double(scaled)), frac = double(scaled) - lo;
      const double want = frac > 0.5 ? lo + 1 : frac < 0.5 ? lo : (std::fmod(lo, 2.0) == 0 ? lo : lo + 1);
      ASSERT_EQ(code(r, c), int(want)) << r << "," << c;
      extreme = std::max(extreme, std::abs(code(r, c)));
      ASSERT_EQ(back[size_t(r * cols + c)], (float(code(r, c)) * m) * 7.874015718698502e-3f) << r << "," << c;
    }
    EXPECT_EQ(extreme, m > 0 ? 127 : 0) << r;
  }
}

// Large weights are quantised on several threads (chunks of blocks or tiles): the codes must be those of the
// same weight quantised in independent halves (blocks and tiles do not depend on each other).
TEST(QuantThreads, LargeWeightsQuantiseAsTheirIndependentHalves) {
  SOLTRAIN_SEEDED_RNG(rng, 31);
  const int64_t rows = 1024, cols = 2048, n = rows * cols, half = n / 2;
  const std::vector<float> x = random_vec(size_t(n), rng, 0.02f);
  const Nf4Layout whole(n), part(half);
  std::vector<uint8_t> data(size_t(whole.data_bytes())), scale(size_t(whole.scale_bytes()));
  nf4_quantize(x.data(), n, data.data(), scale.data());
  std::vector<uint8_t> halves, hd(size_t(part.data_bytes())), hs(size_t(part.scale_bytes()));
  for (int64_t h = 0; h < 2; ++h) {
    nf4_quantize(x.data() + h * half, half, hd.data(), hs.data());
    halves.insert(halves.end(), hd.begin(), hd.end());
  }
  EXPECT_EQ(data, halves);
  std::vector<uint8_t> q(x.size()), qh(x.size());
  std::vector<float> s(size_t((rows / 128) * (cols / 128))), sh(s.size());
  fp8_block_quantize(x.data(), rows, cols, q.data(), s.data());
  for (int64_t h = 0; h < 2; ++h)
    fp8_block_quantize(x.data() + h * half, rows / 2, cols, qh.data() + h * half, sh.data() + h * s.size() / 2);
  EXPECT_EQ(q, qh);
  EXPECT_EQ(s, sh);
  std::vector<float> a(static_cast<size_t>(rows)), ah(a.size());
  int8_row_quantize(x.data(), rows, cols, q.data(), a.data());
  for (int64_t h = 0; h < 2; ++h)
    int8_row_quantize(x.data() + h * half, rows / 2, cols, qh.data() + h * half, ah.data() + h * rows / 2);
  EXPECT_EQ(q, qh);
  EXPECT_EQ(a, ah);
}

}  // namespace
}  // namespace soltrain::test
