// Packed documents through the whole model: a document packed after another in one row gives the same
// logits and loss contributions as the document alone (positions restart, attention stays inside it).
#include "data/batch_file.h"
#include "model/checkpoint.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

TEST(PackedModel, APackedDocumentEqualsTheDocumentAlone) {
  SOLTRAIN_SEEDED_RNG(rng, 401u);
  auto ops = make_cpu_ops();
  auto model = load_pretrained(fixtures() / "models" / "qwen3-tiny", *ops);
  const int V = model->config().vocab_size, A = 9, B = 15;
  HostBatch packed{1, A + B, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  for (int i = 0; i < A + B; ++i) packed.input_ids.push_back(int32_t(rng() % uint32_t(V)));
  for (int i = 0; i < A + B; ++i)
    packed.targets.push_back(i == A - 1 || i == A + B - 1 ? -100 : packed.input_ids[i + 1]);
  for (int i = 0; i < A + B; ++i) packed.positions.push_back(i < A ? i : i - A);
  packed.cu_seqlens = {0, A, A + B};
  HostBatch alone{1,
                  B,
                  {packed.input_ids.begin() + A, packed.input_ids.end()},
                  {packed.targets.begin() + A, packed.targets.end()},
                  {},
                  {},
                  {},
                  {},
                  {},
                  {},
                  {}};

  std::vector<float> lp(size_t(A + B) * V), la(size_t(B) * V);
  model->plan(1, A + B);
  model->step(packed, false, lp.data());
  model->plan(1, B);
  model->step(alone, false, la.data());
  EXPECT_LE(rel_err(lp.data() + size_t(A) * V, la.data(), la.size()), 1e-6);
  // and without the layout, the second document would see the first: the logits differ
  HostBatch unpacked = packed;
  unpacked.positions.clear();
  unpacked.cu_seqlens.clear();
  std::vector<float> lu(lp.size());
  model->plan(1, A + B);
  model->step(unpacked, false, lu.data());
  EXPECT_GT(rel_err(lu.data() + size_t(A) * V, la.data(), la.size()), 1e-2);
}

}  // namespace
}  // namespace soltrain::test
