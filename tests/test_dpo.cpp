// Preference training's objective (model/dpo_objective.h): the pair loss and its derivative against finite
// differences, step 0 (policy = reference: the sigmoid loss is ln 2, every reward 0) with LoRA (reference =
// adapters off) and full fine-tuning (reference sums computed first), and the loss and every gradient for
// each loss_type against torch (tests/tools/make_dpo_reference.py writes tests/fixtures/dpo/).
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/batch_file.h"
#include "data/pair_loader.h"
#include "kernels/preference_math.h"
#include "model/checkpoint.h"
#include "model/dpo_objective.h"
#include "objective_test_util.h"
#include "train/run_dpo.h"
#include "train/train_step.h"

namespace soltrain::test {
namespace {

// The fixture batch cut into two pairs of documents (row 0 at token 10, row 1 at 7, as
// make_dpo_reference.py cuts it), the first 3 targets of each document not counted (its "prompt").
HostBatch pair_batch(const std::filesystem::path& model_dir) {
  HostBatch b = load_batch_file(model_dir / "batch.safetensors");
  const int T = b.seq_len;
  b.positions.assign(size_t(b.rows) * T, 0);
  b.cu_seqlens = {0};
  const int cuts[2] = {10, 7};
  for (int r = 0; r < 2; ++r)
    for (auto [a, e] : {std::pair{0, cuts[r]}, std::pair{cuts[r], T}}) {
      for (int i = a; i < e; ++i) {
        b.positions[size_t(r * T + i)] = i - a;
        if (i - a < 3) b.targets[size_t(r * T + i)] = -100;
      }
      b.cu_seqlens.push_back(r * T + e);
    }
  b.pairs = {0, 1, 2, 3};
  return b;
}

int64_t chosen_tokens(const HostBatch& b) {
  const auto n = counted_per_document(b);
  int64_t c = 0;
  for (size_t i = 0; i < b.pairs.size(); i += 2) c += n[size_t(b.pairs[i])];
  return c;
}

TEST(PreferencePair, DerivativeMatchesFiniteDifferences) {
  // SimPO and ORPO on mean log-probs (−4/3 and −3/5 for the first: ORPO's log(1 − p) on both sides of −ln 2)
  for (PreferenceLoss l : {PreferenceLoss::Sigmoid, PreferenceLoss::Ipo, PreferenceLoss::Hinge, PreferenceLoss::Simpo,
                           PreferenceLoss::Orpo}) {
    SCOPED_TRACE(preference_loss_name(l));
    PreferenceParams p;
    p.loss = l;
    p.beta = 0.3f;
    p.simpo_gamma = 0.4f;
    p.label_smoothing = l == PreferenceLoss::Sigmoid || l == PreferenceLoss::Simpo ? 0.1f : 0.0f;
    // nll_c, nll_r, ref_c, ref_r, len_c, len_r: z = −1.5 (hinge active), 2.5, and around 0
    for (auto [nc, nr, rc, rr] :
         {std::array{4.0, 3.0, 3.5, 4.0}, std::array{2.0, 5.0, 2.5, 3.0}, std::array{3.0, 3.1, 3.0, 3.0}}) {
      const PairResult q = preference_pair(p, nc, nr, rc, rr, 3, 5);
      const double h = 1e-6;
      const double dc =
          (preference_pair(p, nc + h, nr, rc, rr, 3, 5).loss - preference_pair(p, nc - h, nr, rc, rr, 3, 5).loss) /
          (2 * h);
      const double dr =
          (preference_pair(p, nc, nr + h, rc, rr, 3, 5).loss - preference_pair(p, nc, nr - h, rc, rr, 3, 5).loss) /
          (2 * h);
      EXPECT_NEAR(q.dz * q.dnll_c, dc, 1e-6);
      EXPECT_NEAR(q.dz * q.dnll_r, dr, 1e-6);
      EXPECT_NE(dc, 0.0);
    }
  }
  // KTO's example against finite differences in its NLL (the KL estimate held, as TRL detaches it)
  PreferenceParams k;
  k.loss = PreferenceLoss::Kto;
  k.beta = 0.4f;
  k.desirable_weight = 1.25f;
  k.undesirable_weight = 0.5f;
  for (bool desirable : {true, false})
    for (auto [nll, ref, kl] : {std::array{4.0, 5.0, 0.3}, std::array{6.0, 3.5, 0.0}}) {
      const PairResult q = kto_example(k, nll, ref, kl, desirable);
      const double h = 1e-6;
      const double d =
          (kto_example(k, nll + h, ref, kl, desirable).loss - kto_example(k, nll - h, ref, kl, desirable).loss) /
          (2 * h);
      EXPECT_NEAR(q.dz * q.dnll_c, d, 1e-7);
      EXPECT_NE(d, 0.0);
      EXPECT_EQ(q.dnll_r, 0.0) << "the KL document gets no gradient";
    }
  // at x = kl the loss is half its weight
  EXPECT_NEAR(kto_example(k, 4.0, 4.3, 0.3, true).loss, 0.625, 1e-12);
  EXPECT_NEAR(kto_example(k, 4.0, 4.3, 0.3, false).loss, 0.25, 1e-12);
  // The published values at z = 0: sigmoid ln 2, ipo 1/(4β²), hinge 1.
  PreferenceParams p;
  p.beta = 0.25f;
  EXPECT_NEAR(preference_pair(p, 1, 1, 1, 1, 1, 1).loss, std::log(2.0), 1e-12);
  p.loss = PreferenceLoss::Ipo;
  EXPECT_NEAR(preference_pair(p, 1, 1, 1, 1, 1, 1).loss, 4.0, 1e-12);
  p.loss = PreferenceLoss::Hinge;
  EXPECT_NEAR(preference_pair(p, 1, 1, 1, 1, 1, 1).loss, 1.0, 1e-12);
  // Without a reference the reference sums are not read: SimPO at equal answers is −logσ(−γ), ORPO −β·logσ(0).
  p.simpo_gamma = 0.5f;
  p.loss = PreferenceLoss::Simpo;
  EXPECT_NEAR(preference_pair(p, 1, 1, 7, -3, 1, 1).loss, -log_sigmoid(-0.5), 1e-12);
  p.loss = PreferenceLoss::Orpo;
  EXPECT_NEAR(preference_pair(p, 1, 1, 7, -3, 1, 1).loss, 0.25 * std::log(2.0), 1e-12);
}

// At step 0 the policy is the reference: z = 0 for every pair, so the sigmoid loss is ln 2, every reward
// and margin 0, and no pair is counted as won (TRL's accuracy is chosen > rejected, strictly).
void expect_step_zero(Transformer& model, const HostBatch& b) {
  auto& ops = model.ops();
  DpoObjective dpo(ops, DpoConfig{}, int64_t(b.rows) * b.seq_len);
  dpo.begin_update(int64_t(b.pairs.size() / 2), chosen_tokens(b));
  ops.zero(model.params().all_grads());
  dpo_micro_batch(model, dpo, b, true);
  const DpoMetrics m = dpo.read(ops);
  EXPECT_EQ(m.pairs, 2);
  EXPECT_NEAR(m.loss, std::log(2.0), 1e-6);
  EXPECT_EQ(m.reward_chosen, 0.0);
  EXPECT_EQ(m.reward_rejected, 0.0);
  EXPECT_EQ(m.margin, 0.0);
  EXPECT_EQ(m.accuracy, 0.0);
  EXPECT_LT(m.logp_chosen, 0.0);
  EXPECT_GT(rms(all_grads(ops, model)), 0.0) << "DPO's gradient at z = 0 is β/2 · d(π_c − π_r), not zero";
}

TEST(Dpo, StepZeroIsLn2WithLoraReference) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  const HostBatch b = pair_batch(dir);
  auto ops = make_cpu_ops();
  LoraConfig lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  auto model = load_pretrained(dir, *ops, lora);
  model->plan(b.rows, b.seq_len);
  expect_step_zero(*model, b);
}

TEST(Dpo, StepZeroIsLn2WithPrecomputedReference) {
  const auto dir = fixtures() / "models" / "llama-tiny";
  HostBatch b = pair_batch(dir);
  auto ops = make_cpu_ops();
  auto model = load_pretrained(dir, *ops);
  model->plan(b.rows, b.seq_len);
  b.ref_nll = reference_nll(*model, b);
  ASSERT_EQ(b.ref_nll.size(), 4u);
  expect_step_zero(*model, b);
}

// With the adapters trained away from zero, turning them off must give the base model's sums exactly.
TEST(Dpo, AdaptersOffIsTheBaseModel) {
  const auto dir = fixtures() / "models" / "qwen3-tiny";
  const HostBatch b = pair_batch(dir);
  auto ops = make_cpu_ops();
  auto base = load_pretrained(dir, *ops);
  base->plan(b.rows, b.seq_len);
  const std::vector<float> want = reference_nll(*base, b);
  LoraConfig lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  auto model = load_pretrained(dir, *ops, lora);
  model->plan(b.rows, b.seq_len);
  for (Parameter& p : model->params().all())
    if (p.name.find("lora_B") != std::string::npos) ops->fill(p.value, 0.05f);
  const std::vector<float> adapted = reference_nll(*model, b);
  model->enable_adapters(false);
  EXPECT_EQ(reference_nll(*model, b), want);
  model->enable_adapters(true);
  EXPECT_NE(adapted, want) << "the adapters changed nothing: the test would pass without enable_adapters";
}

// The variants the torch tool computes (same names, same settings).
struct Variant {
  const char* name;
  DpoConfig cfg;
};
const Variant kVariants[] = {
    {"sigmoid", {PreferenceLoss::Sigmoid, 0.1f, 0.0f, 0.0f}},
    {"sigmoid_smooth_rpo", {PreferenceLoss::Sigmoid, 0.2f, 0.1f, 0.5f}},
    {"ipo", {PreferenceLoss::Ipo, 0.1f, 0.0f, 0.0f}},
    {"hinge", {PreferenceLoss::Hinge, 0.5f, 0.0f, 0.0f}},
};

// Until the torch fixture exists, the whole model's DPO gradient is checked against central differences of
// the loss on a few of its largest entries (fp32: to 2%, which a sign or scale error is far outside).
TEST(Dpo, GradientMatchesFiniteDifferences) {
  const auto dir = fixtures() / "models" / "llama-tiny";
  HostBatch b = pair_batch(dir);
  auto ops = make_cpu_ops();
  auto model = load_pretrained(dir, *ops);
  model->plan(b.rows, b.seq_len);
  b.ref_nll = reference_nll(*model, b);
  const float offsets[4] = {0.7f, -0.4f, -0.3f, 0.9f};  // z != 0, as the torch fixture has it
  for (size_t i = 0; i < 4; ++i) b.ref_nll[i] += offsets[i];
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    auto loss = [&](bool backward) {
      DpoObjective dpo(*ops, v.cfg, int64_t(b.rows) * b.seq_len);
      dpo.begin_update(2, chosen_tokens(b));
      dpo_micro_batch(*model, dpo, b, backward);
      return dpo.read(*ops).loss;
    };
    ops->zero(model->params().all_grads());
    loss(true);
    int checked = 0;
    for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
                             "lm_head.weight", "model.embed_tokens.weight"}) {
      Parameter& p = model->params().at(name);
      float* w = p.value.f32();
      const float* g = p.grad.f32();
      const int64_t at =
          std::max_element(g, g + p.grad.numel(), [](float x, float y) { return std::fabs(x) < std::fabs(y); }) - g;
      const float keep = w[at], h = 1e-2f;
      w[at] = keep + h;
      const double up = loss(false);
      w[at] = keep - h;
      const double down = loss(false);
      w[at] = keep;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(g[at], fd, 0.02 * std::fabs(fd) + 1e-6) << name << "[" << at << "]";
      ++checked;
    }
    EXPECT_EQ(checked, 4);
  }
}

class DpoReference : public ::testing::TestWithParam<std::string> {};

TEST_P(DpoReference, LossAndEveryGradientMatchTorch) {
  const auto dir = fixtures() / "models" / GetParam();
  const auto ref_file = fixtures() / "dpo" / (GetParam() + ".safetensors");
  if (!std::filesystem::exists(ref_file))
    GTEST_SKIP() << ref_file.string() << " is missing: make it on a machine with torch + transformers with "
                 << "`python3 tests/tools/make_dpo_reference.py tests/fixtures/models tests/fixtures/dpo`";
  const SafetensorsFile ref(ref_file);
  HostBatch b = load_batch_file(ref_file);
  b.pairs = read_as_i32(ref.at("pairs"), "pairs");
  b.ref_nll = to_f32(ref.at("ref_nll"));
  ASSERT_EQ(b.pairs.size(), b.ref_nll.size());
  auto ops = make_cpu_ops();
  auto model = load_pretrained(dir, *ops);  // full fine-tuning: the reference is the fixture's ref_nll
  model->plan(b.rows, b.seq_len);
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const std::string pre = std::string(v.name) + ".";
    DpoObjective dpo(*ops, v.cfg, int64_t(b.rows) * b.seq_len);
    dpo.begin_update(int64_t(b.pairs.size() / 2), chosen_tokens(b));
    ops->zero(model->params().all_grads());
    dpo_micro_batch(*model, dpo, b, true);
    const DpoMetrics m = dpo.read(*ops);
    auto near = [&](double got, const char* key) {
      const double want = to_f32(ref.at(pre + key))[0];
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want))) << key;
    };
    near(m.loss, "loss");
    near(m.reward_chosen, "rewards_chosen");
    near(m.reward_rejected, "rewards_rejected");
    near(m.accuracy, "rewards_accuracies");
    near(m.logp_chosen, "logps_chosen");
    near(m.logp_rejected, "logps_rejected");
    size_t checked = 0, ref_grads = 0;
    for (const Parameter& p : model->params().all()) {
      const auto want = to_f32(ref.at(pre + "grad." + p.name));
      ASSERT_EQ(want.size(), size_t(p.grad.numel())) << p.name;
      EXPECT_LE(rel_err(p.grad.f32(), want.data(), want.size()), 1e-5) << p.name;
      EXPECT_TRUE(all_close(p.grad.f32(), want.data(), want.size(), 1e-5 * rms(want), 1e-4)) << p.name;
      ++checked;
    }
    for (auto& [name, e] : ref.entries()) ref_grads += name.starts_with(pre + "grad.");
    EXPECT_EQ(checked, ref_grads);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DpoReference, ::testing::Values("qwen3-tiny", "llama-tiny"), fixture_test_name);

}  // namespace
}  // namespace soltrain::test

namespace soltrain::test {
namespace {

// Packed micro-batches keep both answers of a pair together, visit every pair once per epoch, use fewer rows
// than one document per row, and give the same log-probs (documents never attend to one another).
TEST(PairLoader, PackingKeepsPairsTogetherAndChangesNoLogProb) {
  ShardSet docs;
  std::mt19937 rng(3);
  const int pairs = 10, T = 16;
  for (int d = 0; d < 2 * pairs; ++d) {
    const int len = 3 + int(rng() % 10);
    for (int i = 0; i < len; ++i) {
      docs.tokens.push_back(int32_t(1 + rng() % 40));
      docs.mask.push_back(i >= 2);  // a 2-token prompt
    }
    docs.doc_offsets.push_back(int64_t(docs.tokens.size()));
  }
  auto ops = make_cpu_ops();
  auto model = load_pretrained(fixtures() / "models" / "qwen3-tiny", *ops);
  model->plan(4, T);
  std::map<bool, DpoMetrics> metrics;
  std::map<bool, int> batches;
  for (bool pack : {false, true}) {
    PairLoader l(docs, std::vector<float>(size_t(2 * pairs), 0.0f), 2, T, 0, false, pack);
    DpoObjective dpo(*ops, DpoConfig{}, 4 * T);
    dpo.begin_update(pairs, 1);
    std::set<int32_t> seen;
    for (HostBatch b = l.next(true); !b.pairs.empty(); b = l.next(true)) {
      ++batches[pack];
      ASSERT_EQ(b.cu_seqlens.back(), 4 * T);
      for (size_t i = 1; i < b.cu_seqlens.size(); ++i) ASSERT_LT(b.cu_seqlens[i - 1], b.cu_seqlens[i]);
      for (size_t i = 0; i < b.pairs.size(); i += 2) {
        // the chosen document's first token identifies its source document (prompt tokens differ by draw)
        const int32_t at = b.cu_seqlens[size_t(b.pairs[i])];
        for (int32_t d = 0; d < 2 * pairs; d += 2)
          if (docs.tokens[size_t(docs.doc_offsets[size_t(d)])] == b.input_ids[size_t(at)] &&
              docs.tokens[size_t(docs.doc_offsets[size_t(d)]) + 1] == b.input_ids[size_t(at) + 1])
            seen.insert(d / 2);
      }
      dpo_micro_batch(*model, dpo, b, false);
    }
    EXPECT_EQ(int(seen.size()), pairs) << "pack " << pack;
    metrics[pack] = dpo.read(*ops);
  }
  EXPECT_EQ(batches[false], 5);
  EXPECT_LT(batches[true], batches[false]);
  EXPECT_EQ(metrics[true].pairs, pairs);
  EXPECT_NEAR(metrics[true].logp_chosen, metrics[false].logp_chosen, 1e-5 * std::fabs(metrics[false].logp_chosen));
  EXPECT_NEAR(metrics[true].logp_rejected, metrics[false].logp_rejected,
              1e-5 * std::fabs(metrics[false].logp_rejected));
  EXPECT_NEAR(metrics[true].loss, metrics[false].loss, 1e-6);
}

// The settings as the peers read them: Axolotl's orpo_alpha is beta for any method when beta is not given; the
// NLL term is rpo_alpha (DPO), cpo_alpha (SimPO), 1 (ORPO), none (KTO); a loss_type against rl: is one line.
TEST(PreferenceObjective, SettingsReadAsAxolotlAndTrl) {
  DpoSettings s;
  s.orpo_alpha = 0.3;
  s.rpo_alpha = 0.2;
  EXPECT_FLOAT_EQ(preference_objective(s).beta, 0.3f);
  EXPECT_FLOAT_EQ(preference_objective(s).nll_alpha, 0.2f);
  s.beta = 0.5, s.beta_given = true;
  EXPECT_FLOAT_EQ(preference_objective(s).beta, 0.5f);
  // another method's setting is one line, not silently unused (rpo_alpha is DPO's; cpo_alpha SimPO's)
  const auto refused = [](const DpoSettings& x, const std::string& why) {
    try {
      preference_objective(x);
      ADD_FAILURE() << why << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  s.method = PreferenceLoss::Orpo;
  refused(s, "rpo_alpha is DPO's NLL term (SimPO's is cpo_alpha, ORPO's is built in); this run trains orpo");
  s.rpo_alpha = 0;
  EXPECT_EQ(preference_objective(s).loss, PreferenceLoss::Orpo);
  EXPECT_FLOAT_EQ(preference_objective(s).nll_alpha, 1.0f);
  s.method = PreferenceLoss::Simpo;
  s.cpo_alpha = 0.7;
  EXPECT_FLOAT_EQ(preference_objective(s).nll_alpha, 0.7f);
  s.method = PreferenceLoss::Kto;
  refused(s, "simpo_gamma / cpo_alpha are SimPO's (rl: simpo); this run trains kto");
  s.cpo_alpha = 1;
  EXPECT_FLOAT_EQ(preference_objective(s).nll_alpha, 0.0f);
  s.method.reset();
  s.desirable_weight = 2;
  refused(s, "desirable_weight / undesirable_weight weigh KTO's examples (rl: kto); this run trains sigmoid");
  s.desirable_weight = 1;
  s.method = PreferenceLoss::Kto;
  s.loss_given = true;  // loss_type sigmoid with rl: kto
  try {
    preference_objective(s);
    ADD_FAILURE() << "a loss_type that disagrees with rl: is refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("loss_type sigmoid is not one rl: kto trains"), std::string::npos) << e.what();
  }
}

// ORPO's batches: the chosen answer's prompt tokens are targets too (its NLL term trains them), counted per pair
// in prompt_targets; the rejected answer's are not. Its loss and log-probs are the same packed or not.
TEST(PairLoader, OrpoChosenPromptsAreTargetsCountedApart) {
  ShardSet docs;
  std::mt19937 rng(5);
  const int pairs = 8, T = 16;
  std::vector<int> prompt_len;
  for (int d = 0; d < 2 * pairs; ++d) {
    if (d % 2 == 0) prompt_len.push_back(2 + int(rng() % 3));
    const int len = prompt_len.back() + 1 + int(rng() % 6);
    for (int i = 0; i < len; ++i) {
      docs.tokens.push_back(int32_t(1 + rng() % 40));
      docs.mask.push_back(i >= prompt_len.back());
    }
    docs.doc_offsets.push_back(int64_t(docs.tokens.size()));
  }
  auto ops = make_cpu_ops();
  auto model = load_pretrained(fixtures() / "models" / "qwen3-tiny", *ops);
  model->plan(4, T);
  std::map<bool, DpoMetrics> metrics;
  for (bool pack : {false, true}) {
    PairLoader l(docs, {}, 2, T, 0, false, pack, /*chosen_prompt_targets=*/true);
    DpoConfig cfg;
    cfg.loss = PreferenceLoss::Orpo;
    cfg.nll_alpha = 1;
    DpoObjective dpo(*ops, cfg, 4 * T);
    std::vector<HostBatch> all;
    for (HostBatch b = l.next(true); !b.pairs.empty(); b = l.next(true)) all.push_back(std::move(b));
    DpoStep step(dpo);
    step.begin_update(all);
    for (const HostBatch& b : all) {
      ASSERT_EQ(b.prompt_targets.size() * 2, b.pairs.size());
      const std::vector<int32_t> counted = counted_per_document(b);
      for (size_t i = 0; i < b.prompt_targets.size(); ++i) {
        const int32_t c = b.pairs[2 * i], r = b.pairs[2 * i + 1];
        const int32_t len_c = b.cu_seqlens[size_t(c) + 1] - b.cu_seqlens[size_t(c)];
        EXPECT_EQ(counted[size_t(c)], len_c - 1) << "every next token of the chosen answer is a target";
        // the source pair: the one whose chosen document starts with these tokens
        const int32_t at = b.cu_seqlens[size_t(c)];
        int src = -1;
        for (int d = 0; d < 2 * pairs; d += 2)
          if (std::equal(docs.tokens.begin() + docs.doc_offsets[size_t(d)],
                         docs.tokens.begin() + docs.doc_offsets[size_t(d) + 1], b.input_ids.begin() + at))
            src = d / 2;
        ASSERT_GE(src, 0);
        EXPECT_EQ(b.prompt_targets[i], prompt_len[size_t(src)] - 1);
        EXPECT_EQ(b.targets[size_t(b.cu_seqlens[size_t(r)])], -100) << "the rejected answer's prompt is no target";
      }
      step.train_micro_batch(*model, b);
    }
    metrics[pack] = dpo.read(*ops);
    EXPECT_EQ(metrics[pack].pairs, pairs);
  }
  EXPECT_NEAR(metrics[true].loss, metrics[false].loss, 1e-5 * metrics[false].loss);
  EXPECT_NEAR(metrics[true].nll, metrics[false].nll, 1e-5 * metrics[false].nll);
  EXPECT_GT(metrics[false].nll, 0.0);
}

}  // namespace
}  // namespace soltrain::test
