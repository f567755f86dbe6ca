// Mixture-of-Experts (model/moe.h; Qwen3-MoE, Qwen2-MoE) beside the live transformers comparison
// (python/tests/test_moe.py): every recompute level gives the same bits with less memory, with LoRA on the experts or
// the shared expert too; adapters PEFT cannot hold refused; the routing and permutation ops against their definitions
// (the CPU twins the CUDA kernels will be held to); Qwen3-MoE's config fields; settings that do not cover experts
// refused in one line.
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/format.h"
#include "dp_test_util.h"
#include "model/fp8_recipe.h"
#include "model/transformer.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

template <typename F>
void expect_user_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error with '" << needle << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

template <typename T>
Tensor host_tensor(std::vector<T>& v, Shape s) {
  return Tensor{v.data(), std::is_same_v<T, float> ? DType::F32 : DType::I32, std::move(s), Device::CPU};
}

nlohmann::json moe_json() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 96, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
    "mlp_only_layers": [1], "output_router_logits": true, "router_aux_loss_coef": 0.05, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": false})");
}

// Qwen2-MoE's variant: a shared expert with its sigmoid gate, q/k/v biases, no q/k norm.
nlohmann::json qwen2_moe_json() {
  nlohmann::json j = moe_json();
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  j["model_type"] = "qwen2_moe";
  j["shared_expert_intermediate_size"] = 48;
  return j;
}

// The tiny model above with fresh random weights (norms near 1), and a random batch for it.
std::unique_ptr<Transformer> moe_model(Ops& ops, std::optional<LoraConfig> lora = std::nullopt,
                                       const nlohmann::json& config = moe_json()) {
  auto m = std::make_unique<Transformer>(parse_model_config(config), ops, lora);
  std::mt19937 rng(7);
  for (Parameter& p : m->params().all()) {
    if (p.name.find("lora_") != std::string::npos) continue;  // the adapters keep PEFT's initialisation
    std::vector<float> v = random_vec(size_t(shape_numel(p.shape)), rng, p.shape.size() == 1 ? 0.3f : 0.1f);
    if (p.shape.size() == 1)
      for (float& x : v) x += 1.0f;
    m->params().upload(ops, p, v.data());
  }
  return m;
}

HostBatch random_batch(int rows, int len, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  HostBatch b;
  b.rows = rows;
  b.seq_len = len;
  for (int i = 0; i < rows * len; ++i) b.input_ids.push_back(int32_t(rng() % uint32_t(vocab)));
  b.targets = b.input_ids;
  std::rotate(b.targets.begin(), b.targets.begin() + 1, b.targets.end());
  for (int r = 0; r < rows; ++r) b.targets[size_t(r * len + len - 1)] = -100;
  return b;
}

struct Pass {
  double loss = 0;
  std::vector<float> logits;
  std::vector<std::vector<float>> grads;
  size_t activation_bytes = 0;
};

Pass pass(Recompute rc, std::optional<LoraConfig> lora = std::nullopt, const nlohmann::json& config = moe_json()) {
  auto ops = make_cpu_ops();
  auto m = moe_model(*ops, lora, config);
  const HostBatch b = random_batch(2, 20, 96, 3);
  m->plan(b.rows, b.seq_len, rc);
  Pass p;
  p.logits.resize(size_t(b.rows * b.seq_len * 96));
  ops->zero(m->params().all_grads());
  p.loss = m->step(b, true, p.logits.data()).loss;
  for (const Parameter& q : m->params().all())
    if (q.trainable) p.grads.emplace_back(q.grad.f32(), q.grad.f32() + q.grad.numel());
  p.activation_bytes = m->activation_bytes();
  return p;
}

TEST(Moe, EveryRecomputeLevelIsBitwiseIdenticalAndSmaller) {
  for (const nlohmann::json& config : {moe_json(), qwen2_moe_json()}) {
    const std::string family = config["model_type"];
    const Pass none = pass(Recompute::None, std::nullopt, config);
    const Pass elem = pass(Recompute::Elementwise, std::nullopt, config);
    const Pass sel = pass(Recompute::Selective, std::nullopt, config);
    const Pass full = pass(Recompute::Full, std::nullopt, config);
    ASSERT_TRUE(std::isfinite(none.loss));
    for (const Pass* r : {&elem, &sel, &full}) {
      EXPECT_EQ(r->loss, none.loss) << family;
      EXPECT_EQ(r->logits, none.logits) << family;
      ASSERT_EQ(r->grads.size(), none.grads.size());
      for (size_t i = 0; i < none.grads.size(); ++i)
        EXPECT_EQ(r->grads[i], none.grads[i]) << family << " gradient " << i;
    }
    EXPECT_LT(elem.activation_bytes, none.activation_bytes) << family;
    EXPECT_LT(sel.activation_bytes, elem.activation_bytes) << family;
    EXPECT_LT(full.activation_bytes, sel.activation_bytes) << family;
  }
}

TEST(Moe, TheLoadBalancingLossIsInTheLossOnlyWhenTheConfigAsksForIt) {
  auto ops = make_cpu_ops();
  nlohmann::json off = moe_json();
  off["output_router_logits"] = false;
  auto with = moe_model(*ops), without = moe_model(*ops, std::nullopt, off);
  const HostBatch b = random_batch(2, 20, 96, 3);
  with->plan(b.rows, b.seq_len);
  without->plan(b.rows, b.seq_len);
  const double a = with->step(b, true).loss, c = without->step(b, true).loss;
  // coef 0.05 × the aux loss E·Σ_e f_e·P_e (Σ f = top_k, Σ P = 1): ≥ top_k = 2 when the counts f follow the
  // probabilities P, as top-k routing makes them (Chebyshev's sum inequality), < E·top_k
  EXPECT_GE(a - c, 0.05 * 2 - 1e-6);
  EXPECT_LT(a - c, 0.05 * 8 * 2);
  EXPECT_EQ(without->read_aux_loss(), 0.0);
}

TEST(Moe, LoraPassesAreBitwiseUnderRecomputeAndTrainTheAdaptersAlone) {
  // Qwen3-MoE: the experts' adapters (fused gate_up, down) and attention's; Qwen2-MoE: the shared expert's, with
  // dropout (PEFT takes none on experts, but the shared expert is a plain nn.Linear there)
  const LoraConfig experts{4, 8.0f, 0.0f, {"q_proj", "gate_proj", "up_proj", "down_proj"}, false, 3};
  const LoraConfig shared{4, 8.0f, 0.1f, {"v_proj", "gate_proj", "down_proj"}, false, 3};
  for (const auto& [config, lora, tensors] :
       {std::tuple{moe_json(), experts, 3 * 2 + 2 * 4}, std::tuple{qwen2_moe_json(), shared, 3 * 2 + 2 * 4 + 4}}) {
    const Pass none = pass(Recompute::None, lora, config), full = pass(Recompute::Full, lora, config);
    const Pass sel = pass(Recompute::Selective, lora, config);
    EXPECT_EQ(none.loss, full.loss);
    EXPECT_EQ(none.grads, full.grads);
    EXPECT_EQ(none.grads, sel.grads);
    // Qwen3-MoE: q in 3 layers + gate_up and down in its 2 MoE layers; Qwen2-MoE: v in 3 layers + the shared
    // expert's gate and down in its 2 MoE layers + the dense layer's gate and down
    EXPECT_EQ(none.grads.size(), size_t(tensors)) << config["model_type"];
    auto ops = make_cpu_ops();
    auto m = moe_model(*ops, lora, config);
    for (const Parameter& p : m->params().all()) EXPECT_EQ(p.trainable, is_lora_name(p.name)) << p.name;
  }
}

TEST(Moe, ExpertAdapterBIsStoredOneMatrixPerExpertAndReadBackInPeftsOrder) {
  // PEFT's B [parts·out, R·E] (expert e's column i at i·E + e) lives in the store as [parts][E][out][R]: what
  // upload writes there, and what download (the adapter file) and download_grad (`soltrain dump`) give back
  const LoraConfig lora{4, 8.0f, 0.0f, {"gate_proj", "up_proj", "down_proj"}, false, 3};
  auto ops = make_cpu_ops();
  auto m = moe_model(*ops, lora);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  int checked = 0;
  for (Parameter& p : m->params().all()) {
    if (p.name.find(".experts.") == std::string::npos || p.name.find("lora_B") == std::string::npos) continue;
    const bool gate_up = p.name.find(".base_layer.") != std::string::npos;  // (both: gate_up is the inner wrapper)
    const int64_t E = 8, parts = gate_up ? 2 : 1, R = gate_up ? 8 : 4, out = p.shape[0] / parts;
    ASSERT_EQ(p.order.experts, E) << p.name;
    ASSERT_EQ(p.order.parts, parts) << p.name;
    ASSERT_EQ(p.shape[1], R * E) << p.name;
    std::vector<float> named(size_t(shape_numel(p.shape)));
    for (float& v : named) v = nd(rng);
    m->params().upload(*ops, p, named.data());
    for (int64_t part = 0; part < parts; ++part)
      for (int64_t e = 0; e < E; ++e)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < R; ++i)
            ASSERT_EQ(p.master.f32()[((part * E + e) * out + o) * R + i],
                      named[size_t((part * out + o) * R * E + i * E + e)])
                << p.name;
    std::vector<float> back(named.size(), 0.0f), grad(named.size(), 0.0f);
    m->params().download(*ops, p, back.data());
    EXPECT_EQ(back, named) << p.name;
    ops->copy(p.grad, p.master);  // a gradient in the stored order reads back as PEFT holds it too
    m->params().download_grad(*ops, p, grad.data());
    EXPECT_EQ(grad, named) << p.name;
    ++checked;
  }
  EXPECT_EQ(checked, 4);  // gate_up's and down's B in each of the two MoE layers
}

TEST(Moe, ExpertAdaptersPeftCannotHoldAreRefused) {
  auto ops = make_cpu_ops();
  const LoraConfig gate_alone{4, 8.0f, 0.0f, {"q_proj", "gate_proj"}, false, 3};
  expect_user_error([&] { moe_model(*ops, gate_alone); }, "gate_proj and up_proj are one adapter");
  const LoraConfig dropout{4, 8.0f, 0.1f, {"q_proj", "down_proj"}, false, 3};
  expect_user_error([&] { moe_model(*ops, dropout); }, "take no dropout");
  LoraConfig all{4, 8.0f, 0.0f, all_lora_module_names(), false, 3};
  all.all_linear = true;  // Qwen3-MoE: adapts the router too; Qwen2-MoE: its shared_expert_gate (test_moe.py)
  EXPECT_NE(moe_model(*ops, all)->params().find("base_model.model.model.layers.0.mlp.gate.lora_B.weight"), nullptr);
  EXPECT_NE(moe_model(*ops, all, qwen2_moe_json())
                ->params()
                .find("base_model.model.model.layers.0.mlp.shared_expert_gate.lora_B.weight"),
            nullptr);
  all.dropout = 0.1f;  // (PEFT would apply it to the gate's adapter, a Linear's; soltrain does not yet)
  expect_user_error([&] { moe_model(*ops, all, qwen2_moe_json()); }, "the shared_expert_gate's adapter");
  LoraConfig gate_from_peft{4, 8.0f, 0.0f, {"q_proj"}, false, 3};
  gate_from_peft.shared_expert_gate = true;
  expect_user_error([&] { moe_model(*ops, gate_from_peft); }, "has no shared expert");
  LoraConfig from_peft{4, 8.0f, 0.0f, {"down_proj"}, false, 3};
  from_peft.expert_targets = true;  // read from an adapter's target_parameters
  nlohmann::json dense = moe_json();
  dense["num_experts"] = 0;
  expect_user_error([&] { moe_model(*ops, from_peft, dense); }, "the adapter targets MoE experts");
}

// The step's load figures: a router of zeros ties every expert, so each token takes the k lowest (the tie rule):
// the busiest expert holds every token, E/k times the mean, in both MoE layers; a trained-like random router is
// between even (1) and that.
TEST(Moe, LoadImbalanceIsTheBusiestExpertOverTheMean) {
  auto ops = make_cpu_ops();
  auto m = moe_model(*ops);
  const HostBatch b = random_batch(2, 20, 96, 3);
  m->plan(b.rows, b.seq_len, Recompute::None);
  m->step(b, false);
  const auto random_router = m->moe_load();
  ASSERT_EQ(random_router.size(), 2u);
  EXPECT_EQ(random_router[0].first, "moe_load_imbalance");
  EXPECT_GT(random_router[0].second, 1.0);
  EXPECT_LT(random_router[0].second, 8.0 / 2);
  EXPECT_LE(random_router[1].second, random_router[0].second);
  for (int l : {0, 2}) {
    Parameter& router = m->params().at("model.layers." + std::to_string(l) + ".mlp.gate.weight");
    const std::vector<float> zeros(size_t(shape_numel(router.shape)), 0.0f);
    m->params().upload(*ops, router, zeros.data());
  }
  m->step(b, false);
  const auto tied = m->moe_load();
  EXPECT_EQ(tied[0].second, 8.0 / 2);
  EXPECT_EQ(tied[1].second, 8.0 / 2);
}

TEST(Moe, RoutingAndPermutationFollowTheirDefinitions) {
  auto ops = make_cpu_ops();
  const int64_t N = 37, E = 6, K = 3;
  std::mt19937 rng(5);
  std::vector<float> logits = random_vec(size_t(N * E), rng, 2.0f), probs(size_t(N * E)), w(size_t(N * K));
  std::vector<float> prob_sum(size_t(E), 0.5f), counts(size_t(E), 1.0f);
  std::vector<int32_t> ex(size_t(N * K)), rows(size_t(N * K)), slot(size_t(N * K)), off(size_t(E + 1));
  auto t = [](auto& v, Shape s) { return host_tensor(v, std::move(s)); };
  ops->moe_route(t(probs, {N, E}), t(ex, {N, K}), t(w, {N, K}), t(prob_sum, {E}), t(logits, {N, E}), true);
  ops->moe_permute(t(rows, {N * K}), t(slot, {N * K}), t(off, {E + 1}), t(counts, {E}), t(ex, {N, K}));
  std::vector<int> per_expert(size_t(E), 0);
  for (int64_t n = 0; n < N; ++n) {
    double z = 0, top = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(double(logits[size_t(n * E + e)]));
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = ex[size_t(n * K + j)];
      EXPECT_NEAR(probs[size_t(n * E + e)], std::exp(double(logits[size_t(n * E + e)])) / z, 1e-6);
      top += probs[size_t(n * E + e)];
      if (j > 0) EXPECT_GE(probs[size_t(n * E + ex[size_t(n * K + j - 1)])], probs[size_t(n * E + e)]);
      ++per_expert[size_t(e)];
      // the pair sits in its expert's range, and the sorted row points back at its token
      const int32_t s = slot[size_t(n * K + j)];
      EXPECT_GE(s, off[size_t(e)]);
      EXPECT_LT(s, off[size_t(e) + 1]);
      EXPECT_EQ(rows[size_t(s)], n);
    }
    for (int64_t e = 0; e < E; ++e)  // every unchosen expert is no likelier than the last chosen one
      if (std::find(ex.begin() + n * K, ex.begin() + n * K + K, e) == ex.begin() + n * K + K)
        EXPECT_LE(probs[size_t(n * E + e)], probs[size_t(n * E + ex[size_t(n * K + K - 1)])]);
    for (int64_t j = 0; j < K; ++j)
      EXPECT_NEAR(w[size_t(n * K + j)], probs[size_t(n * E + ex[size_t(n * K + j)])] / top, 1e-6);
  }
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(off[size_t(e) + 1] - off[size_t(e)], per_expert[size_t(e)]);
    EXPECT_EQ(counts[size_t(e)], 1.0f + float(per_expert[size_t(e)]));
    double s = 0.5;
    for (int64_t n = 0; n < N; ++n) s += probs[size_t(n * E + e)];
    EXPECT_NEAR(prob_sum[size_t(e)], s, 1e-4);
    // stable: within an expert, rows ascend (token order)
    for (int32_t i = off[size_t(e)] + 1; i < off[size_t(e) + 1]; ++i) EXPECT_LT(rows[size_t(i - 1)], rows[size_t(i)]);
  }
}

// The router's backward against central differences of L = Σ c·weight + Σ a·probs through moe_route.
TEST(Moe, RouterBackwardIsTheDerivativeOfRouting) {
  auto ops = make_cpu_ops();
  const int64_t N = 5, E = 7, K = 3;
  std::mt19937 rng(9);
  for (bool norm : {false, true}) {
    std::vector<float> logits = random_vec(size_t(N * E), rng, 1.5f), c = random_vec(size_t(N * K), rng);
    std::vector<float> a = random_vec(size_t(E), rng);
    auto t = [](auto& v, Shape s) { return host_tensor(v, std::move(s)); };
    auto route = [&](std::vector<float>& x, std::vector<float>& probs, std::vector<int32_t>& ex,
                     std::vector<float>& w) {
      std::vector<float> ps(size_t(E), 0.0f);
      probs.assign(size_t(N * E), 0);
      ex.assign(size_t(N * K), 0);
      w.assign(size_t(N * K), 0);
      ops->moe_route(t(probs, {N, E}), t(ex, {N, K}), t(w, {N, K}), t(ps, {E}), t(x, {N, E}), norm);
    };
    std::vector<float> probs, w;
    std::vector<int32_t> ex;
    route(logits, probs, ex, w);
    std::vector<float> dlogits(size_t(N * E));
    ops->moe_router_backward(t(dlogits, {N, E}), t(c, {N, K}), t(probs, {N, E}), t(ex, {N, K}), t(w, {N, K}), norm,
                             t(a, {E}));
    for (int64_t i = 0; i < N * E; ++i) {
      auto loss = [&](float h) {
        std::vector<float> x = logits, p2, w2;
        std::vector<int32_t> e2;
        x[size_t(i)] += h;
        route(x, p2, e2, w2);
        EXPECT_EQ(e2, ex);  // the step is small enough not to change the choice
        double l = 0;
        for (int64_t j = 0; j < N * K; ++j) l += double(c[size_t(j)]) * w2[size_t(j)];
        for (int64_t j = 0; j < N * E; ++j) l += double(a[size_t(j % E)]) * p2[size_t(j)];
        return l;
      };
      const float h = 1e-2f;
      EXPECT_NEAR(dlogits[size_t(i)], (loss(h) - loss(-h)) / (2 * h), 2e-3) << "norm " << norm << " at " << i;
    }
  }
}

TEST(Moe, ConfigFieldsAsTransformersReadsThem) {
  const ModelConfig c = parse_model_config(moe_json());
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.sparse, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(c.moe_index(2), 1);
  EXPECT_EQ(c.dense_mlp_index(1), 0);
  EXPECT_FLOAT_EQ(c.moe.aux_loss_coef, 0.05f);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.moe.shared_intermediate_size, 0);
  const ModelConfig q2 = parse_model_config(qwen2_moe_json());
  EXPECT_STREQ(q2.spec->architecture, "Qwen2MoeForCausalLM");
  EXPECT_EQ(q2.moe.shared_intermediate_size, 48);
  EXPECT_TRUE(q2.qkv_bias && !q2.o_bias && !q2.qk_norm);
  nlohmann::json j = moe_json();
  j.erase("num_experts");
  j["num_local_experts"] = 4;  // what transformers 5 writes
  j.erase("mlp_only_layers");
  j["decoder_sparse_step"] = 2;
  j.erase("output_router_logits");
  const ModelConfig d = parse_model_config(j);
  EXPECT_EQ(d.moe.num_experts, 4);
  EXPECT_EQ(d.moe.sparse, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(d.moe.aux_loss_coef, 0.0f);  // output_router_logits defaults to false: no aux loss, as transformers
  auto refused = [](const char* key, nlohmann::json v, const char* says) {
    nlohmann::json k = moe_json();
    k[key] = std::move(v);
    expect_user_error([&] { parse_model_config(k); }, says);
  };
  refused("num_experts_per_tok", 9, "num_experts_per_tok\" must be from 1 to num_experts (8)");
  refused("num_experts_per_tok", 0, "num_experts_per_tok");
  refused("decoder_sparse_step", 0, "decoder_sparse_step\" must be at least 1");
  refused("mlp_only_layers", "all", "mlp_only_layers\" must be a list");
  refused("router_aux_loss_coef", -1, "router_aux_loss_coef");
}

TEST(Moe, SettingsThatDoNotCoverExpertsAreRefusedInOneLine) {
  auto ops = make_cpu_ops();
  auto m = moe_model(*ops);
  m->set_token_tile(1024);
  expect_user_error([&] { m->plan(1, 16); }, "token_tile: Mixture-of-Experts layers run");
  expect_user_error([&] { m->enable_fp8(Fp8Settings{}); }, "recipe fp8-hybrid does not cover Mixture-of-Experts");
}

// The same settings in a run are refused by its early checks, from the model's config.json, before the run makes
// its output folder.
TEST(Moe, SettingsThatDoNotCoverExpertsAreRefusedBeforeAnyOutput) {
  DpSetup s(/*experts=*/4);
  const std::pair<const char*, const char*> cases[] = {
      {"--set recipe=fp8-hybrid",
       "recipe fp8-hybrid does not cover Mixture-of-Experts layers yet (Qwen3MoeForCausalLM)"},
      {"--set token_tile=1024", "token_tile: Mixture-of-Experts layers run all of a micro-batch's tokens at once"}};
  for (const auto& [set, want] : cases) {
    const CliRun r = s.sft(0, "out", set);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(s.t.path / "out")) << set;
  }
}

// QLoRA over an MoE model: the experts' (and Qwen2-MoE's shared expert's) projections stored in NF4 or FP8
// blocks (the quantisers checked against bitsandbytes' and the FP8 checkpoints' fixtures elsewhere) train as a
// dense base holding exactly their dequantised values: loss, logits and every adapter gradient, without and
// with full recompute; the base's expert weights hold 4 bits (NF4) or 8 (FP8) per value, plus their scales.
TEST(Moe, QuantisedExpertsTrainAsTheirDequantisedValues) {
  const LoraConfig experts{4, 8.0f, 0.0f, {"q_proj", "gate_proj", "up_proj", "down_proj"}, false, 3};
  const LoraConfig shared{4, 8.0f, 0.0f, {"v_proj", "gate_proj", "down_proj"}, false, 3};
  for (const auto& [config, lora] : {std::pair{moe_json(), experts}, std::pair{qwen2_moe_json(), shared}})
    for (WeightFormat format : {WeightFormat::Nf4, WeightFormat::Fp8Block}) {
      const std::string what = cat(config["model_type"].get<std::string>(), " ", weight_format_name(format));
      auto ops = make_cpu_ops();
      LoraConfig quantised_lora = lora;
      quantised_lora.base_format = format;
      auto quantised = moe_model(*ops, quantised_lora, config);  // (the same random values, quantised on upload)
      auto dense = moe_model(*ops, lora, config);
      int expert_weights = 0;
      size_t value_bytes = 0, quantised_bytes = 0, dense_bytes = 0;
      for (const Parameter& q : quantised->params().all()) {
        if (q.format == WeightFormat::Dense) continue;
        Parameter& d = dense->params().at(q.name);
        std::vector<float> values(size_t(shape_numel(q.shape)));
        ops->dequantize(Tensor{values.data(), DType::F32, q.shape, Device::CPU},
                        Weight(q.value, q.format, q.scale, q.shape));
        dense->params().upload(*ops, d, values.data());
        if (q.name.find(".mlp.experts.") != std::string::npos) {
          ++expert_weights;
          value_bytes += q.value.bytes();
          quantised_bytes += q.value.bytes() + q.scale.bytes();
          dense_bytes += d.value.bytes();
        }
      }
      EXPECT_EQ(expert_weights, 2 * 8 * 3) << what << ": 2 MoE layers x 8 experts x 3 projections quantised";
      std::mt19937 rng(11);  // adapters away from PEFT's B = 0 (every gradient then nonzero), the same in both
      for (const Parameter& q : quantised->params().all())
        if (q.trainable) {
          const std::vector<float> v = random_vec(size_t(shape_numel(q.shape)), rng, 0.1f);
          quantised->params().upload(*ops, quantised->params().at(q.name), v.data());
          dense->params().upload(*ops, dense->params().at(q.name), v.data());
        }
      // the values: 4 bits (NF4) or 8 (FP8) for fp32's 32; the scales on top stay small even at these tiny shapes
      EXPECT_EQ(value_bytes * (format == WeightFormat::Nf4 ? 8 : 4), dense_bytes) << what;
      EXPECT_LT(quantised_bytes * 10, dense_bytes * 3) << what;
      const HostBatch b = random_batch(2, 20, 96, 3);
      for (Recompute rc : {Recompute::None, Recompute::Full}) {
        for (auto* m : {quantised.get(), dense.get()}) m->plan(b.rows, b.seq_len, rc);
        std::vector<float> lq(size_t(b.rows * b.seq_len * 96)), ld(lq.size());
        ops->zero(quantised->params().all_grads());
        ops->zero(dense->params().all_grads());
        const double loss_q = quantised->step(b, true, lq.data()).loss, loss_d = dense->step(b, true, ld.data()).loss;
        ASSERT_TRUE(std::isfinite(loss_q)) << what;
        EXPECT_NEAR(loss_q, loss_d, 1e-6 * std::abs(loss_d)) << what;
        for (size_t i = 0; i < lq.size(); ++i) ASSERT_NEAR(lq[i], ld[i], 1e-5) << what << " logit " << i;
        int adapters = 0;
        for (const Parameter& q : quantised->params().all()) {
          if (!q.trainable) continue;
          const Parameter& d = dense->params().at(q.name);
          double worst = 0, scale = 0;
          for (int64_t i = 0; i < q.grad.numel(); ++i) {
            worst = std::max(worst, double(std::abs(q.grad.f32()[i] - d.grad.f32()[i])));
            scale = std::max(scale, double(std::abs(d.grad.f32()[i])));
          }
          EXPECT_GT(scale, 0) << what << " " << q.name;
          EXPECT_LE(worst, 1e-5 * scale) << what << " " << q.name;
          ++adapters;
        }
        EXPECT_GT(adapters, 0) << what;
      }
    }
}

}  // namespace
}  // namespace soltrain::test
