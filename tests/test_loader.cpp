// The packing loader: positions restart per document, cu_seqlens, no target across documents, masked
// targets, truncate vs drop, deterministic shuffle, and resume giving the same batches.
#include <gtest/gtest.h>

#include "data/loader.h"

namespace soltrain {
namespace {

// Documents of the given lengths; token values are 100 * (doc + 1) + position, every token trained
// except each document's second token.
ShardSet make_set(const std::vector<int>& lengths) {
  ShardSet s;
  for (size_t d = 0; d < lengths.size(); ++d) {
    for (int k = 0; k < lengths[d]; ++k) {
      s.tokens.push_back(int32_t(100 * (d + 1) + size_t(k)));
      s.mask.push_back(k == 1 ? 0 : 1);
    }
    s.doc_offsets.push_back(int64_t(s.tokens.size()));
  }
  return s;
}

LoaderOptions opts(int rows, int seq_len, bool shuffle = false, uint64_t seed = 0) {
  LoaderOptions o;
  o.rows = rows;
  o.seq_len = seq_len;
  o.shuffle = shuffle;
  o.seed = seed;
  o.pad_id = 7;
  return o;
}

TEST(Loader, PacksGreedilyWithPositionsCuSeqlensAndTargets) {
  Loader l(make_set({3, 4, 5, 2}), opts(2, 8));
  const HostBatch b = l.next();
  ASSERT_EQ(b.rows, 2);
  ASSERT_EQ(b.seq_len, 8);
  // Row 0: doc 0 (3) + doc 1 (4) + 1 pad; row 1: doc 2 (5) + doc 3 (2) + 1 pad.
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{100, 101, 102, 200, 201, 202, 203, 7,  //
                                               300, 301, 302, 303, 304, 400, 401, 7}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 0, 1, 0}));
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 3, 7, 8, 13, 15, 16}));
  // Next token within the document; -100 where the next token is masked (position 1), at document ends
  // and on padding.
  EXPECT_EQ(b.targets, (std::vector<int32_t>{-100, 102, -100, -100, 202, 203, -100, -100,  //
                                             -100, 302, 303, 304, -100, -100, -100, -100}));
  // Looking for a third document for row 1 already started epoch 1 (document 0 did not fit).
  EXPECT_EQ(l.state(), (LoaderState{1, 0}));
}

TEST(Loader, NoTargetCrossesADocumentBoundary) {
  Loader l(make_set({5, 1, 7, 3, 9, 2, 6, 4, 8}), opts(3, 10, true, 42));
  for (int step = 0; step < 20; ++step) {
    const HostBatch b = l.next();
    for (size_t i = 0; i < b.targets.size(); ++i) {
      if (b.targets[i] == -100) continue;
      ASSERT_LT(i + 1, b.input_ids.size());
      EXPECT_EQ(b.targets[i], b.input_ids[i + 1]);
      EXPECT_EQ(b.positions[i + 1], b.positions[i] + 1) << "target inside one document";
      EXPECT_EQ(b.targets[i] / 100, b.input_ids[i] / 100);
    }
    EXPECT_EQ(b.cu_seqlens.back(), 30);
    for (int r = 1; r < 3; ++r)
      EXPECT_NE(std::find(b.cu_seqlens.begin(), b.cu_seqlens.end(), 10 * r), b.cu_seqlens.end());
  }
}

TEST(Loader, OverlongTruncatedOrDropped) {
  Loader t(make_set({2, 6, 2}), opts(1, 4));
  EXPECT_EQ(t.dropped(), 0);
  EXPECT_EQ(t.next().input_ids, (std::vector<int32_t>{100, 101, 7, 7}));  // doc 1 (4 after cut) doesn't fit
  const HostBatch b = t.next();
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{200, 201, 202, 203}));
  EXPECT_EQ(b.targets[3], -100) << "no target for the cut-off token";

  LoaderOptions o = opts(1, 4);
  o.overlong = OverlongPolicy::kDrop;
  Loader d(make_set({2, 6, 2}), o);
  EXPECT_EQ(d.dropped(), 1);
  EXPECT_EQ(d.documents(), 2);
  EXPECT_EQ(d.next().input_ids, (std::vector<int32_t>{100, 101, 300, 301}));

  EXPECT_THROW(Loader(make_set({9}), o), UserError);
}

TEST(Loader, ShuffleIsDeterministicPerSeedAndEpoch) {
  std::vector<int> lengths(50, 3);
  Loader a(make_set(lengths), opts(1, 8, true, 1)), b(make_set(lengths), opts(1, 8, true, 1)),
      c(make_set(lengths), opts(1, 8, true, 2));
  EXPECT_EQ(a.epoch_order(0), b.epoch_order(0));
  EXPECT_NE(a.epoch_order(0), c.epoch_order(0));
  EXPECT_NE(a.epoch_order(0), a.epoch_order(1));
  auto sorted = a.epoch_order(3);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[size_t(i)], i) << "a permutation";
  // Pinned: the order must not change between builds or machines (resume depends on it).
  const std::vector<int64_t> order = a.epoch_order(0);
  EXPECT_EQ(std::vector<int64_t>(order.begin(), order.begin() + 5), (std::vector<int64_t>{48, 46, 18, 28, 37}));
}

TEST(Loader, ResumeFromSavedStateGivesTheSameBatches) {
  const std::vector<int> lengths = {5, 1, 7, 3, 9, 2, 6, 4, 8, 3, 3, 5};
  Loader straight(make_set(lengths), opts(2, 10, true, 7));
  std::vector<HostBatch> want;
  nlohmann::json saved;
  for (int i = 0; i < 12; ++i) {  // several epochs
    if (i == 5) saved = straight.state().to_json();
    want.push_back(straight.next());
  }
  Loader resumed(make_set(lengths), opts(2, 10, true, 7));
  resumed.restore(LoaderState::from_json(nlohmann::json::parse(saved.dump())));
  for (int i = 5; i < 12; ++i) {
    const HostBatch b = resumed.next();
    EXPECT_EQ(b.input_ids, want[size_t(i)].input_ids) << "batch " << i;
    EXPECT_EQ(b.targets, want[size_t(i)].targets) << "batch " << i;
    EXPECT_EQ(b.positions, want[size_t(i)].positions) << "batch " << i;
    EXPECT_EQ(b.cu_seqlens, want[size_t(i)].cu_seqlens) << "batch " << i;
  }
  EXPECT_EQ(resumed.state(), straight.state());
  EXPECT_GE(straight.state().epoch, 2);
  EXPECT_THROW(resumed.restore(LoaderState{0, 99}), UserError);
}

}  // namespace
}  // namespace soltrain
