// The fp8-hybrid recipe on the CPU twin: the FP8 ops against independent references written here from the
// formats' definitions (nearest representable value by search over all 256 codes; TransformerEngine's
// delayed-scaling update; fp64 GEMMs on decoded values), then whole runs: FP8 training tracks fp32 training
// on the demo task, and bad recipe settings are one line.
#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "cli/config.h"
#include "cli_test_util.h"
#include "demo_run_util.h"
#include "kernels/quant.h"
#include "model/checkpoint.h"
#include "model/transformer.h"
#include "test_util.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

// The smallest |decode(c) − v| over every finite code of the format, found by search; saturating: beyond
// the largest finite value the largest finite value is the answer.
double nearest_error(float v, bool e5m2) {
  double best = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const float d = quant::fp8_decode(uint8_t(c), e5m2);
    if (std::isfinite(d)) best = std::min(best, std::fabs(double(d) - v));
  }
  return best;
}

std::vector<float> randn(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}
Tensor host(std::vector<float>& v, Shape s) {
  return Tensor{v.data(), DType::F32, std::move(s), Device::CPU};
}
Tensor host8(std::vector<uint8_t>& v, Shape s, DType t) {
  return Tensor{v.data(), t, std::move(s), Device::CPU};
}

TEST(Fp8Ops, CurrentScalingCodesAreTheNearestValuesInBothLayouts) {
  const uint32_t seed = test::test_seed(std::random_device{}());
  SCOPED_TRACE(test::seed_message(seed));
  std::mt19937 rng(seed);
  auto ops = make_cpu_ops();
  for (const bool e5 : {false, true}) {
    const int64_t R = 24, C = 40;
    std::vector<float> x = randn(size_t(R * C), rng, e5 ? 1e-6f : 3.0f);  // E5M2 holds output gradients: tiny
    std::vector<float> scale{7.0f, 7.0f, 0.0f, 0.0f}, amax{0.0f};         // {scale_inv, scale, -, -}
    std::vector<uint8_t> q(size_t(R * C)), qt(size_t(R * C));
    const DType t = e5 ? DType::F8E5M2 : DType::F8E4M3;
    ops->fp8_quantize(host8(q, {R, C}, t), host8(qt, {C, R}, t), host(x, {R, C}),
                      Ops::Fp8Scaling{host(scale, {4}), host(amax, {1}), true});
    float m = 0;
    for (float v : x) m = std::max(m, std::fabs(v));
    const float fmax = e5 ? 57344.0f : 448.0f;
    EXPECT_EQ(amax[0], m);
    EXPECT_EQ(scale[1], fmax / m);
    EXPECT_EQ(scale[0], 1.0f / scale[1]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const float v = x[size_t(r * C + c)] * scale[1];
        const uint8_t code = q[size_t(r * C + c)];
        ASSERT_EQ(qt[size_t(c * R + r)], code) << r << "," << c;
        ASSERT_EQ(std::fabs(double(quant::fp8_decode(code, e5)) - v), nearest_error(v, e5)) << v;
      }
  }
}

TEST(Fp8Ops, DelayedScalingUsesTheStoredScaleSaturatesAndKeepsTheLargerAmax) {
  auto ops = make_cpu_ops();
  std::vector<float> x{1.0f, -300.0f, 1000.0f, 0.01f, -5.0f, 2.0f, 0.0f, 3.0f};
  std::vector<float> scale{0.5f, 2.0f, 0.0f, 0.0f}, amax{2000.0f};
  std::vector<uint8_t> q(8);
  ops->fp8_quantize(host8(q, {1, 8}, DType::F8E4M3), {}, host(x, {1, 8}),
                    Ops::Fp8Scaling{host(scale, {4}), host(amax, {1}), false});
  EXPECT_EQ(scale[1], 2.0f);    // delayed: untouched
  EXPECT_EQ(amax[0], 2000.0f);  // max with what the slot held
  EXPECT_EQ(quant::fp8_decode(q[0], false), 2.0f);
  EXPECT_EQ(quant::fp8_decode(q[1], false), -448.0f);  // -600 saturates
  EXPECT_EQ(quant::fp8_decode(q[2], false), 448.0f);
  EXPECT_EQ(quant::fp8_decode(q[6], false), 0.0f);
  amax[0] = 0;
  ops->fp8_quantize(host8(q, {1, 8}, DType::F8E4M3), {}, host(x, {1, 8}),
                    Ops::Fp8Scaling{host(scale, {4}), host(amax, {1}), false});
  EXPECT_EQ(amax[0], 1000.0f);
}

TEST(Fp8Ops, MatmulIsTheFp64ProductOfTheDecodedOperands) {
  const uint32_t seed = test::test_seed(std::random_device{}());
  SCOPED_TRACE(test::seed_message(seed));
  std::mt19937 rng(seed);
  auto ops = make_cpu_ops();
  const int64_t M = 16, N = 32, K = 48;
  std::vector<uint8_t> a(size_t(M * K)), b(size_t(N * K));
  for (auto& v : a) v = uint8_t(rng() & 0x7e);  // finite codes of either sign below NaN
  for (auto& v : b) v = uint8_t(rng() & 0xfb);
  for (auto& v : a) v = (v & 0x7f) == 0x7f ? 0 : v;
  std::vector<float> sa{0.03f, 0, 0, 0}, sb{1.5e-4f, 0, 0, 0}, bias = randn(size_t(N), rng, 1.0f);
  std::vector<float> y0 = randn(size_t(M * N), rng, 1.0f), y = y0;
  ops->fp8_matmul(host(y, {M, N}), host8(a, {M, K}, DType::F8E4M3), host(sa, {4}), host8(b, {N, K}, DType::F8E5M2),
                  host(sb, {4}), nullptr, 0.5f, /*accumulate=*/true, true);
  // The reference in fp64; an fp32 sum of K exact products may be off by K·2^-24·Σ|products| (cancellation
  // makes that large next to the result), so each element is held to that bound.
  std::vector<double> ref(size_t(M * N)), mag(size_t(M * N));
  const double factor = double(sa[0]) * double(sb[0]);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a_s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p =
            double(quant::fp8_decode(a[size_t(m * K + k)], false)) * quant::fp8_decode(b[size_t(n * K + k)], true);
        s += p, a_s += std::fabs(p);
      }
      ref[size_t(m * N + n)] = factor * s;
      mag[size_t(m * N + n)] = factor * a_s;
    }
  auto check = [&](double alpha, const std::vector<float>& add, const std::vector<float>* b_add) {
    int bad = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = size_t(m * N + n);
        const double want = alpha * ref[i] + add[i] + (b_add ? (*b_add)[size_t(n)] : 0.0);
        const double allowed =
            alpha * double(K + 2) * 0x1p-24 * mag[i] + 0x1p-22 * (std::fabs(want) + std::fabs(add[i]));
        if (!(std::fabs(double(y[i]) - want) <= allowed)) ++bad;
      }
    return bad;
  };
  EXPECT_EQ(check(0.5, y0, nullptr), 0);
  const Tensor tb = host(bias, {N});
  ops->fp8_matmul(host(y, {M, N}), host8(a, {M, K}, DType::F8E4M3), host(sa, {4}), host8(b, {N, K}, DType::F8E5M2),
                  host(sb, {4}), &tb, 1.0f, false, false);
  EXPECT_EQ(check(1.0, std::vector<float>(size_t(M * N), 0.0f), &bias), 0);
}

// TransformerEngine's DelayedScaling update as its docs state it, written out here on its own.
TEST(Fp8Ops, UpdateScalesRollsTheHistoryAndScalesFromItsMax) {
  const uint32_t seed = test::test_seed(std::random_device{}());
  SCOPED_TRACE(test::seed_message(seed));
  std::mt19937 rng(seed);
  auto ops = make_cpu_ops();
  const int Q = 4, H = 5, margin = 1;
  std::vector<float> hist(size_t(Q * H)), scales;
  for (int q = 0; q < Q; ++q) scales.insert(scales.end(), {1.f / 3, 3, 0, 0});
  std::uniform_real_distribution<float> u(0.0f, 10.0f);
  for (float& h : hist) h = u(rng);
  for (int i = 0; i < H; ++i) hist[size_t(2 * H + i)] = 0;  // tensor 2 never seen: keeps its scale
  hist[size_t(3 * H)] = 1e9f;                               // tensor 3: this step's amax dominates
  const std::vector<float> before = hist, before_scales = scales;
  ops->fp8_update_scales(host(hist, {Q, H}), host(scales, {Q, 4}), 448.0f, margin);
  for (int q = 0; q < Q; ++q) {
    const float* old = before.data() + q * H;
    const float amax = *std::max_element(old, old + H);
    std::vector<float> rolled(static_cast<size_t>(H));
    rolled[0] = 0;
    for (int i = 1; i < H - 1; ++i) rolled[size_t(i)] = old[i + 1];
    rolled[size_t(H - 1)] = old[0];
    for (int i = 0; i < H; ++i) EXPECT_EQ(hist[size_t(q * H + i)], rolled[size_t(i)]) << q << " " << i;
    if (amax > 0) {
      EXPECT_EQ(scales[size_t(4 * q + 1)], 224.0f / amax) << q;
      EXPECT_EQ(scales[size_t(4 * q)], 1.0f / scales[size_t(4 * q + 1)]) << q;
    } else {
      EXPECT_EQ(scales[size_t(4 * q + 1)], before_scales[size_t(4 * q + 1)]);
      EXPECT_EQ(scales[size_t(4 * q)], before_scales[size_t(4 * q)]);
    }
  }
}

struct Fp8Setup : test::DemoRunSetup {
  Fp8Setup() : DemoRunSetup("max_steps: 60\neval_steps: 60\n") {}
  RunResult train(const std::string& out, const std::string& extra, std::string* log_text = nullptr) const {
    auto ops = make_cpu_ops();
    std::ostringstream log;
    const RunResult r =
        run_training(load_train_config(config(out, extra), {}, TrainMode::kSft), TrainMode::kSft, *ops, log);
    if (log_text) *log_text = log.str();
    return r;
  }
};

TEST(Fp8Recipe, FullAndLoraTrainingTrackFp32) {
  Fp8Setup s;
  const RunResult ref = s.train("fp32", "");
  ASSERT_LT(ref.last_eval_loss, ref.first_eval_loss - 1.0) << ref.first_eval_loss << " -> " << ref.last_eval_loss;
  for (const char* scaling : {"delayed", "current"}) {
    SCOPED_TRACE(scaling);
    std::string log;
    const RunResult f =
        s.train(std::string("fp8_") + scaling,
                std::string("recipe: fp8-hybrid\nfp8_amax_history: 16\nfp8_scaling: ") + scaling + "\n", &log);
    EXPECT_NE(log.find(std::string("recipe fp8-hybrid: the decoder layers' projections in FP8 (E4M3 forward, E5M2 "
                                   "gradients; ") +
                       (scaling == std::string("delayed") ? "delayed scaling, amax history 16" : "current scaling")),
              std::string::npos)
        << log;
    // Evaluation runs the FP8 GEMMs too: the untrained model's loss moves a little, not much.
    EXPECT_NE(f.first_eval_loss, ref.first_eval_loss);
    EXPECT_LT(std::fabs(f.first_eval_loss - ref.first_eval_loss), 0.01 * ref.first_eval_loss);
    // FP8 is in the loop (the result differs) and costs little: within 3% of fp32's final loss.
    EXPECT_NE(f.last_eval_loss, ref.last_eval_loss);
    EXPECT_LT(std::fabs(f.last_eval_loss - ref.last_eval_loss), 0.03 * ref.last_eval_loss)
        << f.last_eval_loss << " vs fp32 " << ref.last_eval_loss;
  }
  // LoRA over the FP8 base GEMMs (the base's FP8 copies are cast once).
  s.train("base", "max_steps: 30\n");
  const std::string lora = "model: base/model\nlora: true\nlora_rank: 16\nlora_alpha: 32\nlearning_rate: 1.0e-2\n";
  const RunResult lref = s.train("lora", lora);
  const RunResult lf = s.train("lora_fp8", lora + "recipe: fp8-hybrid\n");
  EXPECT_LT(lf.last_eval_loss, lf.first_eval_loss - 0.02) << lf.first_eval_loss << " -> " << lf.last_eval_loss;
  EXPECT_LT(std::fabs(lf.last_eval_loss - lref.last_eval_loss), 0.03 * lref.last_eval_loss)
      << lf.last_eval_loss << " vs bf16 LoRA " << lref.last_eval_loss;
}

// QLoRA with the FP8 recipe (Surogate's qlora_bnb / qlora_fp8 + recipe: fp8): the frozen quantised base is
// dequantised once into the FP8 copies its GEMMs read. FP8 is in the loop (the losses differ from QLoRA in bf16)
// and costs little: within 3% of it, for an NF4 and an FP8-block base.
TEST(Fp8Recipe, QloraBasesTrainThroughTheFp8Gemms) {
  Fp8Setup s;
  s.train("base", "max_steps: 30\n");
  const std::string lora = "model: base/model\nlora: true\nlora_rank: 16\nlora_alpha: 32\nlearning_rate: 1.0e-2\n";
  for (const char* base : {"qlora_nf4: true\n", "qlora_fp8: true\n"}) {
    SCOPED_TRACE(base);
    const std::string q = lora + base;
    const RunResult bf16 = s.train("q_bf16", q);
    std::string log;
    const RunResult fp8 = s.train("q_fp8", q + "recipe: fp8-hybrid\n", &log);
    EXPECT_NE(log.find("recipe fp8-hybrid: the decoder layers' projections in FP8"), std::string::npos) << log;
    EXPECT_LT(fp8.last_eval_loss, fp8.first_eval_loss - 0.02) << fp8.first_eval_loss << " -> " << fp8.last_eval_loss;
    EXPECT_NE(fp8.first_eval_loss, bf16.first_eval_loss);
    EXPECT_LT(std::fabs(fp8.last_eval_loss - bf16.last_eval_loss), 0.03 * bf16.last_eval_loss)
        << fp8.last_eval_loss << " vs QLoRA in bf16 " << bf16.last_eval_loss;
  }
}

// The scaling state (scales, amax histories) is part of a checkpoint: a resumed FP8 run continues bit for bit
// as the uninterrupted one; without it the resumed first casts would scale differently.
TEST(Fp8Recipe, ResumeIsBitwiseExact) {
  Fp8Setup s;
  const std::string extra = "recipe: fp8-hybrid\nfp8_amax_history: 4\nmax_steps: 8\nsave_steps: 4\n";
  s.train("a", extra);
  s.train("b", extra);
  const fs::path a = s.t.path / "a", b = s.t.path / "b";
  ASSERT_TRUE(fs::exists(b / "checkpoint-4" / "fp8_state.safetensors"));
  fs::remove_all(b / "checkpoint-8");
  fs::remove_all(b / "model");
  std::string log;
  s.train("b", extra + "resume_from_checkpoint: true\n", &log);
  EXPECT_NE(log.find("checkpoint-4 at step 4"), std::string::npos) << log;
  const auto ma = test::read_jsonl(a / "metrics.jsonl"), mb = test::read_jsonl(b / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_EQ(ma[i].value("loss", 0.0), mb[i].value("loss", 0.0)) << i;
  EXPECT_EQ(test::read_bytes(a / "model" / "model.safetensors"), test::read_bytes(b / "model" / "model.safetensors"));
}

TEST(Fp8Recipe, BadSettingsAreOneLine) {
  Fp8Setup s;
  auto error_of = [&](const std::string& extra, bool run) -> std::string {
    try {
      if (run)
        s.train("bad", extra);
      else
        load_train_config(s.config("bad", extra), {}, TrainMode::kSft);
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(error_of("recipe: nvfp4\n", false)
                .find("recipe: \"nvfp4\": soltrain's recipes are bf16 and fp8-hybrid "
                      "(NVFP4 needs a Blackwell GPU and is not built)"),
            std::string::npos);
  EXPECT_NE(error_of("fp8_scaling: sometimes\n", false).find("fp8_scaling"), std::string::npos);
  EXPECT_NE(error_of("fp8_amax_history: 0\n", false).find("fp8_amax_history"), std::string::npos);
  EXPECT_EQ(error_of("recipe: fp8-hybrid\nskip_quant_first_layers: 2\nskip_quant_last_layers: 1\n", true),
            "skip_quant_first_layers + skip_quant_last_layers must be between 0 and the model's 2 layers");
}

}  // namespace
}  // namespace soltrain

namespace soltrain {
namespace {

// `bench --plan-only --recipe fp8-hybrid` counts what the recipe allocates (its FP8 W and Wᵀ copies, scaling state
// and cast scratch): the projections planned from config.json alone are the ones enable_fp8 registers (it checks
// that itself, skipped layers too), and their planned bytes are the recipe's device bytes once planned for the
// batch's tokens. The plan grows by them over the bf16 plan.
TEST(Fp8Recipe, ThePlanCountsWhatTheRecipeAllocates) {
  const auto dir = test::fixtures() / "models" / "qwen3-tiny";
  const ModelConfig c = load_model_config(dir);
  auto ops = make_cpu_ops();
  size_t allocated = 0;
  for (const int skip : {0, 1}) {
    auto model = load_pretrained(dir, *ops);
    Fp8Settings s;
    s.skip_first_layers = skip;
    model->enable_fp8(s);
    model->plan(2, 32);
    const auto shapes = Transformer::fp8_projection_shapes(c, s);
    EXPECT_EQ(shapes.size(), size_t(7 * (c.num_layers - skip)));
    EXPECT_EQ(Fp8Recipe::planned(shapes, s, 2 * 32).total(), model->fp8()->device_bytes()) << skip;
    if (skip == 0) allocated = model->fp8()->device_bytes();
  }
  const auto plan = [&](const std::string& extra) {
    test::TempDir t;
    const test::CliRun r = test::run(
        "bench --plan-only --device cpu --model " + dir.string() + " --batch-size 2 --seq-len 32 " + extra, t);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto bf16 = plan(""), fp8 = plan("--recipe fp8-hybrid");
  const double gib = double(size_t(1) << 30);
  EXPECT_EQ(bf16["fp8_gib"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(fp8["fp8_gib"].get<double>(), double(allocated) / gib);
  EXPECT_NEAR(fp8["total_gib"].get<double>() - bf16["total_gib"].get<double>(), fp8["fp8_gib"].get<double>(), 1e-12);
}

}  // namespace
}  // namespace soltrain
