// LoRA against PEFT 0.21 (fixture tests/fixtures/peft/qwen3-tiny: r 4, alpha 8, all seven projections):
// logits, loss and adapter gradients of the adapted model, the merged model, and our adapter files.
#include <fstream>

#include "data/batch_file.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "model/lora_merge.h"
#include "model/peft_adapter.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

std::filesystem::path base_dir() {
  return fixtures() / "models" / "qwen3-tiny";
}
std::filesystem::path peft_dir() {
  return fixtures() / "peft" / "qwen3-tiny";
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(LoraPeft, ReadsPeftConfig) {
  const LoraConfig c = read_adapter_config(peft_dir() / "adapter");
  EXPECT_EQ(c.r, 4);
  EXPECT_EQ(c.alpha, 8.0f);
  EXPECT_FALSE(c.use_rslora);
  EXPECT_EQ(c.scale(), 2.0f);
  for (int t = 0; t < kLoraTargets; ++t) EXPECT_TRUE(c.targets(LoraTarget(t))) << kLoraModuleNames[size_t(t)];
}

TEST(LoraPeft, LogitsLossAndAdapterGradientsMatchPeft) {
  auto ops = make_cpu_ops();
  auto model = load_pretrained_with_adapter(base_dir(), peft_dir() / "adapter", *ops);
  const HostBatch batch = load_batch_file(base_dir() / "batch.safetensors");
  const SafetensorsFile expected(peft_dir() / "expected_lora.safetensors");
  model->plan(batch.rows, batch.seq_len);
  std::vector<float> logits(size_t(batch.rows) * batch.seq_len * model->config().vocab_size);
  ops->zero(model->params().all_grads());
  const StepResult r = model->step(batch, true, logits.data());

  const auto ref_logits = to_f32(expected.at("logits"));
  ASSERT_EQ(ref_logits.size(), logits.size());
  EXPECT_LE(rel_err(logits.data(), ref_logits.data(), logits.size()), 1e-4);
  const float ref_loss = to_f32(expected.at("loss"))[0];
  EXPECT_LE(std::abs(r.loss - ref_loss) / ref_loss, 1e-5) << r.loss << " vs " << ref_loss;
  // The base logits differ: the adapter is not a no-op, so this comparison can fail.
  const auto base_logits = to_f32(SafetensorsFile(base_dir() / "expected.safetensors").at("logits"));
  EXPECT_GT(rel_err(base_logits.data(), ref_logits.data(), logits.size()), 1e-2);

  size_t checked = 0;
  for (const Parameter& p : model->params().all()) {
    if (!p.trainable) {
      EXPECT_FALSE(p.grad.defined()) << p.name;
      continue;
    }
    ASSERT_TRUE(is_lora_name(p.name)) << p.name;
    const auto ref = to_f32(expected.at("grad." + p.name));
    ASSERT_EQ(ref.size(), size_t(p.grad.numel())) << p.name;
    EXPECT_LE(rel_err(p.grad.f32(), ref.data(), ref.size()), 1e-3) << p.name;
    ++checked;
  }
  size_t ref_grads = 0;
  for (auto& [name, e] : expected.entries()) ref_grads += name.starts_with("grad.");
  EXPECT_EQ(checked, ref_grads);
  EXPECT_EQ(checked, size_t(2 * 7 * 2));
}

TEST(LoraPeft, FrozenBaseHasNoMasterOrGradient) {
  auto ops = make_cpu_ops();
  auto model = load_pretrained_with_adapter(base_dir(), peft_dir() / "adapter", *ops);
  const ParameterStore& ps = model->params();
  int64_t lora = 0;
  for (const Parameter& p : ps.all()) {
    EXPECT_EQ(p.trainable, is_lora_name(p.name)) << p.name;
    if (p.trainable) {
      lora += shape_numel(p.shape);
    } else {
      EXPECT_FALSE(p.master.defined() || p.grad.defined()) << p.name;
    }
  }
  EXPECT_EQ(ps.numel(), lora);  // what the optimizer allocates moments for
  EXPECT_EQ(ps.all_grads().numel(), lora);
  EXPECT_EQ(ps.decayed_numel(), lora);  // every adapter tensor is a matrix: all decayed
  EXPECT_GT(ps.frozen_numel(), 0);
}

TEST(LoraPeft, MergeMatchesMergeAndUnload) {
  TempDir t;
  merge_adapter(base_dir(), peft_dir() / "adapter", t.path / "merged");
  const CheckpointReader ours(t.path / "merged"), ref(peft_dir() / "merged"), base(base_dir());
  EXPECT_EQ(ours.names(), ref.names());
  int changed = 0;
  for (const std::string& n : ref.names()) {
    ASSERT_TRUE(ours.has(n)) << n;
    EXPECT_EQ(ours.entry(n).dtype, ref.entry(n).dtype) << n;
    const auto a = to_f32(ours.entry(n)), b = to_f32(ref.entry(n)), w = to_f32(base.entry(n));
    ASSERT_EQ(a.size(), b.size()) << n;
    EXPECT_LE(rel_err(a.data(), b.data(), a.size()), 1e-6) << n;
    changed += rel_err(w.data(), b.data(), w.size()) > 1e-3;
  }
  EXPECT_EQ(changed, 2 * 7);  // every adapted weight moved, and only those
  EXPECT_TRUE(std::filesystem::exists(t.path / "merged" / "config.json"));
}

TEST(LoraPeft, MergedModelGivesTheAdaptedLogits) {
  TempDir t;
  merge_adapter(base_dir(), peft_dir() / "adapter", t.path / "merged");
  auto ops = make_cpu_ops();
  auto model = load_pretrained(t.path / "merged", *ops);
  const HostBatch batch = load_batch_file(base_dir() / "batch.safetensors");
  model->plan(batch.rows, batch.seq_len);
  std::vector<float> logits(size_t(batch.rows) * batch.seq_len * model->config().vocab_size);
  model->step(batch, false, logits.data());
  const auto ref = to_f32(SafetensorsFile(peft_dir() / "expected_lora.safetensors").at("logits"));
  EXPECT_LE(rel_err(logits.data(), ref.data(), ref.size()), 1e-4);
}

TEST(LoraPeft, SavedAdapterHasPeftNamesAndConfigAndRoundTripsBitExactly) {
  TempDir t;
  auto ops = make_cpu_ops();
  auto model = load_pretrained_with_adapter(base_dir(), peft_dir() / "adapter", *ops);
  save_adapter(*model, t.path / "a1", {"qwen3-tiny"});

  // Tensors: PEFT's names, dtype and values, bit for bit.
  const SafetensorsFile ours(t.path / "a1" / "adapter_model.safetensors");
  const SafetensorsFile ref(peft_dir() / "adapter" / "adapter_model.safetensors");
  ASSERT_EQ(ours.entries().size(), ref.entries().size());
  for (const auto& [name, e] : ref.entries()) {
    const TensorEntry* o = ours.find(name);
    ASSERT_TRUE(o) << name;
    EXPECT_EQ(o->dtype, e.dtype) << name;
    EXPECT_EQ(o->shape, e.shape) << name;
    ASSERT_EQ(o->bytes, e.bytes) << name;
    EXPECT_EQ(std::memcmp(o->data, e.data, e.bytes), 0) << name;
  }
  EXPECT_EQ(ours.metadata(), ref.metadata());

  // Config: the same keys as PEFT writes, the same values (target_modules is a set in PEFT).
  auto ours_cfg = read_json_file(t.path / "a1" / "adapter_config.json");
  auto ref_cfg = read_json_file(peft_dir() / "adapter" / "adapter_config.json");
  auto sorted = [](nlohmann::json j) {
    auto v = j.get<std::vector<std::string>>();
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(ours_cfg["target_modules"]), sorted(ref_cfg["target_modules"]));
  ours_cfg.erase("target_modules");
  ref_cfg.erase("target_modules");
  EXPECT_EQ(ours_cfg, ref_cfg) << ours_cfg.dump(1) << "\nvs\n" << ref_cfg.dump(1);

  // Load what we saved, save again: identical files.
  auto again = load_pretrained_with_adapter(base_dir(), t.path / "a1", *ops);
  save_adapter(*again, t.path / "a2", {"qwen3-tiny"});
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json"})
    EXPECT_EQ(slurp(t.path / "a1" / f), slurp(t.path / "a2" / f)) << f;
}

// Writes a copy of the fixture adapter with one config key changed.
std::filesystem::path adapter_with(const TempDir& t, const std::string& key, const nlohmann::json& value) {
  static int n = 0;
  const auto dir = t.path / ("adapter-" + key + "-" + std::to_string(n++));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(peft_dir() / "adapter" / "adapter_model.safetensors", dir / "adapter_model.safetensors");
  auto cfg = read_json_file(peft_dir() / "adapter" / "adapter_config.json");
  cfg[key] = value;
  std::ofstream(dir / "adapter_config.json") << cfg.dump(2);
  return dir;
}

TEST(LoraPeft, UnsupportedAdapterFeaturesAreUserErrors) {
  TempDir t;
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {{"use_dora", true},
                                                                     {"modules_to_save", {"classifier"}},
                                                                     {"bias", "all"},
                                                                     {"rank_pattern", {{"q_proj", 8}}},
                                                                     {"alpha_pattern", {{"q_proj", 8}}},
                                                                     {"peft_type", "IA3"},
                                                                     {"target_modules", ".*proj"},
                                                                     {"target_modules", {"q_proj", "lm_head"}},
                                                                     {"layers_to_transform", {0}},
                                                                     {"alora_invocation_tokens", {1, 2}},
                                                                     {"fan_in_fan_out", true}};
  for (const auto& [key, value] : cases) {
    const auto dir = adapter_with(t, key, value);
    try {
      read_adapter_config(dir);
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(key == "peft_type" ? "LORA" : key), std::string::npos) << e.what();
    }
  }
}

TEST(LoraPeft, AdapterTensorsMustMatchTheConfig) {
  TempDir t;
  auto ops = make_cpu_ops();
  // The config claims only q_proj, the file has all seven: the extra tensors are named in the error.
  const auto dir = adapter_with(t, "target_modules", {"q_proj"});
  EXPECT_THROW(load_pretrained_with_adapter(base_dir(), dir, *ops), UserError);
  // Rank 8 in the config, rank-4 tensors in the file.
  const auto dir2 = adapter_with(t, "r", 8);
  EXPECT_THROW(load_pretrained_with_adapter(base_dir(), dir2, *ops), UserError);
}

}  // namespace
}  // namespace soltrain::test
