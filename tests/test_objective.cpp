// The model core's open interfaces: an objective other than SFT (per-document sums, weights known only
// after forward) against a transformers reference, the deferred LM-head backward against the fused one,
// and the per-layer hooks' order and the finality of the gradients they announce.
#include <string>
#include <vector>

#include "data/batch_file.h"
#include "model/checkpoint.h"
#include "objective_test_util.h"

namespace soltrain::test {
namespace {

class ObjectiveReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ObjectiveReference, PerDocumentLossMatchesTransformers) {
  const auto dir = fixtures() / "models" / GetParam();
  const auto ref_file = fixtures() / "objective" / (GetParam() + ".safetensors");
  const SafetensorsFile ref(ref_file);
  const HostBatch batch = load_batch_file(ref_file);  // packed: positions and cu_seqlens included
  ASSERT_GT(batch.cu_seqlens.size(), size_t(batch.rows) + 1) << "the reference packs several documents per row";
  auto ops = make_cpu_ops();
  auto model = load_pretrained(dir, *ops);
  model->plan(batch.rows, batch.seq_len);
  ops->zero(model->params().all_grads());
  SquaredDocumentMean objective(to_f32(ref.at("coef")));
  model->forward(batch, &objective, true);
  model->backward(objective);

  const auto ref_docs = to_f32(ref.at("doc_nll"));
  ASSERT_EQ(objective.sums_.size(), ref_docs.size());
  for (size_t d = 0; d < ref_docs.size(); ++d) EXPECT_NEAR(objective.sums_[d], ref_docs[d], 1e-5 * ref_docs[d]) << d;
  const double ref_loss = to_f32(ref.at("loss"))[0];
  EXPECT_NEAR(objective.loss, ref_loss, 1e-5 * ref_loss);
  size_t checked = 0;
  for (const Parameter& p : model->params().all()) {
    const auto want = to_f32(ref.at("grad." + p.name));
    ASSERT_EQ(want.size(), size_t(p.grad.numel())) << p.name;
    EXPECT_LE(rel_err(p.grad.f32(), want.data(), want.size()), 1e-4) << p.name;
    EXPECT_TRUE(all_close(p.grad.f32(), want.data(), want.size(), 1e-3 * rms(want), 1e-3)) << p.name;
    ++checked;
  }
  size_t ref_grads = 0;
  for (auto& [name, e] : ref.entries()) ref_grads += name.starts_with("grad.");
  EXPECT_EQ(checked, ref_grads);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ObjectiveReference,
                         ::testing::Values("qwen3-tiny", "llama-tiny", "qwen2-tiny-mqa-bias"), fixture_test_name);

TEST(Objective, DeferredHeadBackwardEqualsTheFusedOne) {
  const auto dir = fixtures() / "models" / "llama-tiny";  // untied head: its gradient is separate
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  auto ops = make_cpu_ops();
  auto model = load_pretrained(dir, *ops);
  model->plan(batch.rows, batch.seq_len);
  ops->zero(model->params().all_grads());
  const double fused_loss = model->step(batch, true).loss;
  const auto fused = all_grads(*ops, *model);

  ops->zero(model->params().all_grads());
  DeferredSft deferred(*ops);
  deferred.sft.begin_update(batch.counted());
  model->forward(batch, &deferred, true);
  model->backward(deferred);
  EXPECT_EQ(all_grads(*ops, *model), fused);
  EXPECT_EQ(deferred.sft.read_loss(*ops), fused_loss);
}

// Records the hooks' calls, and a copy of each group's gradients at the moment they are announced final.
class RecordingHooks final : public LayerHooks {
 public:
  RecordingHooks(Ops& ops, const ParameterStore& ps) : ops_(ops), ps_(ps) {}
  void before_forward(int g) override { events.push_back("forward " + std::to_string(g)); }
  void before_backward(int g) override { events.push_back("backward " + std::to_string(g)); }
  void grads_ready(int g) override {
    events.push_back("ready " + std::to_string(g));
    const Tensor t = ps_.group_grads(g);
    std::vector<float> v(size_t(t.numel()));
    ops_.copy(Tensor{v.data(), DType::F32, t.shape, Device::CPU}, t);
    at_ready[g] = v;
  }
  std::vector<std::string> events;
  std::map<int, std::vector<float>> at_ready;

 private:
  Ops& ops_;
  const ParameterStore& ps_;
};

TEST(LayerHooks, FireInLayerOrderAndAnnounceFinalContiguousGradients) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";  // 2 layers, tied embedding: group 2 is final last
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  auto ops = make_cpu_ops();
  for (Recompute rc : {Recompute::None, Recompute::Full}) {
    SCOPED_TRACE(recompute_name(rc));
    auto model = load_pretrained(dir, *ops);
    model->plan(batch.rows, batch.seq_len, rc);
    RecordingHooks hooks(*ops, model->params());
    model->set_hooks(&hooks);
    ops->zero(model->params().all_grads());
    model->step(batch, true);
    const std::vector<std::string> want = {"forward 2", "forward 0",  "forward 1", "backward 2", "backward 1",
                                           "ready 1",   "backward 0", "ready 0",   "ready 2"};
    EXPECT_EQ(hooks.events, want);
    // The groups tile the flat gradient buffer in order, and what each hook saw is what backward ended with.
    const ParameterStore& ps = model->params();
    int64_t offset = 0;
    for (int g = 0; g < ps.groups(); ++g) {
      const Tensor t = ps.group_grads(g);
      EXPECT_EQ(static_cast<float*>(t.data) - static_cast<float*>(ps.all_grads().data), offset) << g;
      offset += t.numel();
      std::vector<float> now(size_t(t.numel()));
      ops->copy(Tensor{now.data(), DType::F32, t.shape, Device::CPU}, t);
      EXPECT_EQ(hooks.at_ready.at(g), now) << "group " << g << " changed after grads_ready";
      EXPECT_GT(rms(now), 0.0) << "group " << g;
    }
    EXPECT_EQ(offset, ps.numel());
    for (const Parameter& p : ps.all())
      EXPECT_EQ(p.group, p.name.starts_with("model.layers.") ? std::stoi(p.name.substr(13)) : 2) << p.name;
  }
}

}  // namespace
}  // namespace soltrain::test
