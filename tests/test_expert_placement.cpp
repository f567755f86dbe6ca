// LLEP's placement (model/expert_placement.h) on loads traced by hand through the paper's Algorithm 2 (LLA with
// the LLAS spill rule), and its invariants on random loads: every expert's rows covered once, in order; with
// full capacity and no minimum piece no rank runs more than the group's mean (rounded up); never worse than the
// native placement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "model/expert_placement.h"

namespace soltrain::test {
namespace {

std::vector<ExpertChunk> chunks(std::initializer_list<ExpertChunk> c) {
  return c;
}

TEST(ExpertPlacement, NativeRunsEachExpertOnItsOwner) {
  const ExpertPlacement p = native_placement({5, 0, 7, 1}, 2);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_TRUE(p[0] == chunks({{0, 0, 5}}));
  EXPECT_TRUE(p[1].empty());
  EXPECT_TRUE(p[2] == chunks({{1, 0, 7}}));
  EXPECT_TRUE(p[3] == chunks({{1, 0, 1}}));
  EXPECT_EQ(placement_loads(p, 2), (std::vector<int64_t>{5, 8}));
  EXPECT_DOUBLE_EQ(placement_imbalance(p, 2), 16.0 / 13.0);
  EXPECT_DOUBLE_EQ(placement_imbalance(native_placement({0, 0}, 2), 2), 1.0);
}

// Rank 0 owns experts 0 and 1 (110 rows), rank 1 experts 2 and 3 (10): capacity 60. Expert 0 (100) keeps what
// its owner can take beside expert 1 still pending (60 - 10 = 50) and spills 50 to rank 1, whose room is 60 - 10
// (its expert 2 pending); then experts 1 and 2 fill their owners exactly.
TEST(ExpertPlacement, TheHotExpertSpillsWhatItsOwnerCannotTake) {
  const ExpertPlacement p = least_loaded_placement({100, 10, 10, 0}, 2, 1.0, 1);
  EXPECT_TRUE(p[0] == chunks({{0, 0, 50}, {1, 50, 100}}));
  EXPECT_TRUE(p[1] == chunks({{0, 0, 10}}));
  EXPECT_TRUE(p[2] == chunks({{1, 0, 10}}));
  EXPECT_TRUE(p[3].empty());
  EXPECT_EQ(placement_loads(p, 2), (std::vector<int64_t>{60, 60}));
}

// Three ranks, one expert each: 90, 0 and 6 rows, capacity 32. With pieces of any size expert 0 keeps 32 and
// fills rank 1 (effective load 0, room 32) then rank 2 (room 26). With a minimum piece of 40 both rooms are too
// small while more rows remain, so the rest (58) is forced onto the least loaded rank, rank 1.
TEST(ExpertPlacement, PiecesUnderTheMinimumAreNotSpilled) {
  EXPECT_TRUE(least_loaded_placement({90, 0, 6}, 3, 1.0, 1)[0] == chunks({{0, 0, 32}, {1, 32, 64}, {2, 64, 90}}));
  EXPECT_EQ(placement_loads(least_loaded_placement({90, 0, 6}, 3, 1.0, 1), 3), (std::vector<int64_t>{32, 32, 32}));
  const ExpertPlacement forced = least_loaded_placement({90, 0, 6}, 3, 1.0, 40);
  EXPECT_TRUE(forced[0] == chunks({{0, 0, 32}, {1, 32, 90}}));
  EXPECT_EQ(placement_loads(forced, 3), (std::vector<int64_t>{32, 58, 6}));
  // a capacity of 1.1 leaves the owner 36 (ceil(1.1 · 32)) and the rest as before
  EXPECT_TRUE(least_loaded_placement({90, 0, 6}, 3, 1.1, 1)[0] == chunks({{0, 0, 36}, {1, 36, 72}, {2, 72, 90}}));
}

TEST(ExpertPlacement, RandomLoadsAreCoveredAndBalanced) {
  std::mt19937 gen(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int P = 1 << (trial % 4);  // 1, 2, 4, 8 ranks
    const int E = P * (1 + int(gen() % 8));
    std::vector<int64_t> rows(static_cast<size_t>(E));
    // skewed: a few hot experts, many cold or empty
    for (auto& r : rows) r = gen() % 4 == 0 ? int64_t(gen() % 2000) : int64_t(gen() % 20);
    const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t(0));
    const double alpha = trial % 2 ? 1.0 : 1.1;
    const ExpertPlacement p = least_loaded_placement(rows, P, alpha, 1);
    for (int e = 0; e < E; ++e) {
      int64_t at = 0;
      for (const ExpertChunk& c : p[size_t(e)]) {
        EXPECT_EQ(c.begin, at) << "trial " << trial << " expert " << e;
        EXPECT_GT(c.end, c.begin);
        EXPECT_GE(c.rank, 0);
        EXPECT_LT(c.rank, P);
        at = c.end;
      }
      EXPECT_EQ(at, rows[size_t(e)]) << "trial " << trial << " expert " << e;
    }
    const std::vector<int64_t> loads = placement_loads(p, P), native = placement_loads(native_placement(rows, P), P);
    const int64_t cap = std::max<int64_t>(int64_t(std::ceil(alpha * double(total) / P)), 1);
    EXPECT_LE(*std::max_element(loads.begin(), loads.end()), std::max(cap, total > 0 ? int64_t(1) : int64_t(0)))
        << "trial " << trial;
    EXPECT_LE(*std::max_element(loads.begin(), loads.end()), *std::max_element(native.begin(), native.end()))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace soltrain::test
