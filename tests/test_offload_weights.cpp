// `offload_weights`: a frozen LoRA base's decoder layers live in host memory and pass through two device
// slots a layer at a time (model/weight_stream.h). The CPU backend runs the same code (its copies are plain
// copies), so results must equal the resident run's bit for bit: forward + backward at every recompute level
// (with offloaded checkpoints too), whole training runs (SFT with accumulation and evaluation, DPO's
// adapters-off reference passes); the ring copies exactly the layers it does not hold; the device's weight
// bytes shrink by the base's layers; the config and bench refuse what is not built, in one line, exit code 2.
#include <gtest/gtest.h>

#include <bit>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "config_test_util.h"
#include "data/batch_file.h"
#include "data_test_util.h"
#include "demo_run_util.h"
#include "model/checkpoint.h"
#include "model/weight_stream.h"
#include "run_compare_util.h"
#include "test_util.h"
#include "train/run_dpo.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
using test::config_error;
using test::read_bytes;

constexpr int kLayers = 5;  // more than the two slots: every layer is evicted and copied again in a pass

fs::path five_layer_model(const test::TempDir& t) {
  DemoModelShape s;
  s.hidden = 64, s.layers = kLayers, s.heads = 2, s.kv_heads = 1, s.head_dim = 32, s.intermediate = 128;
  write_random_model(t.path / "model", s, 5);
  return t.path / "model";
}

// Where a layer's weights are read, they must be in a slot of their own: not the host copy (on the CPU that
// would give the same numbers) and not a slot bound to another layer as well. The Transformer calls the
// stream before its hooks, so a hook sees what the layer is about to read.
struct BindingCheck : LayerHooks {
  const ParameterStore& ps;
  int layers, checks = 0;
  explicit BindingCheck(const ParameterStore& p, int l) : ps(p), layers(l) {}
  void before_forward(int g) override { check(g); }
  void before_backward(int g) override { check(g); }
  void check(int g) {
    if (g >= layers || !ps.frozen_group_on_host(g)) return;  // the head group, or a resident layer
    const Tensor home = ps.frozen_on_host(g);
    const char *h0 = static_cast<const char*>(home.data), *h1 = h0 + home.bytes();
    for (const Parameter& p : ps.all()) {
      if (p.trainable || p.group != g) continue;
      const char* at = static_cast<const char*>(p.value.data);
      EXPECT_FALSE(at >= h0 && at < h1) << p.name << " is read from its host copy";
      for (const Parameter& q : ps.all())
        if (!q.trainable && q.group != g && ps.frozen_group_on_host(q.group)) {
          EXPECT_NE(q.value.data, p.value.data) << p.name << " shares its slot with " << q.name;
        }
      ++checks;
    }
  }
};

struct Pass : test::GradPass {
  std::vector<float> logits;
  int64_t copies = -1;
};

// Forward + backward of a random batch, a forward alone (evaluation-like), then forward + backward again with
// the logits read back: LoRA with dropout on four projections, B random so every adapter's gradient flows.
Pass pass(const fs::path& model_dir, bool offload, Recompute recompute, bool offload_checkpoints, int resident = 0) {
  auto ops = make_cpu_ops();
  LoraConfig cfg{4, 8.0f, 0.2f, {"q_proj", "v_proj", "gate_proj", "down_proj"}, false, 3};
  cfg.offload_base = offload;
  cfg.offload_resident_layers = resident;
  auto model = load_pretrained(model_dir, *ops, cfg);
  test::randomize_lora_b(*ops, model->params(), 99);
  const int rows = 2, T = 24, V = model->config().vocab_size;
  HostBatch batch{rows, T, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  std::mt19937 rng(98);
  for (int i = 0; i < rows * T; ++i) batch.input_ids.push_back(int32_t(rng() % uint32_t(V)));
  batch.targets = batch.input_ids;
  std::rotate(batch.targets.begin(), batch.targets.begin() + 1, batch.targets.end());
  model->set_token_tile(16);  // three MLP tiles a layer
  model->set_offload_checkpoints(offload_checkpoints);
  model->plan(rows, T, recompute);
  EXPECT_EQ(model->weight_stream() != nullptr, offload);
  BindingCheck binding(model->params(), model->config().num_layers);
  if (offload) model->set_hooks(&binding);
  Pass r;
  model->step(batch, true);
  model->step(batch, false);
  r.logits.resize(size_t(rows) * T * size_t(V));
  r.loss = model->step(batch, true, r.logits.data()).loss;  // gradients of two passes, accumulated
  r.grads = test::trainable_grads(*ops, model->params());
  if (model->weight_stream()) r.copies = model->weight_stream()->copies();
  if (offload) {
    EXPECT_GT(binding.checks, 0);
  }
  return r;
}

TEST(OffloadWeights, ForwardBackwardEqualsResidentBitwiseAtEveryRecompute) {
  test::TempDir t;
  const fs::path dir = five_layer_model(t);
  for (Recompute rc : {Recompute::None, Recompute::Elementwise, Recompute::Selective, Recompute::Full})
    for (int variant = 0; variant < 3; ++variant) {
      const bool ckpt = variant == 1;         // with offloaded checkpoints
      const int kept = variant == 2 ? 2 : 0;  // two layers resident: layers 0, 2 and 4 stream
      if (ckpt && rc != Recompute::Full) continue;
      SCOPED_TRACE(cat("recompute ", recompute_name(rc), ckpt ? ", checkpoints offloaded" : "",
                       kept ? ", two layers resident" : ""));
      const Pass resident = pass(dir, false, rc, ckpt), streamed = pass(dir, true, rc, ckpt, kept);
      test::expect_same_grads(resident, streamed);
      ASSERT_EQ(0, std::memcmp(resident.logits.data(), streamed.logits.data(), resident.logits.size() * 4));
      // The ring copies what it does not hold. A pass's first two streamed layers are the two the pass before
      // ended with, except at the very start and after a forward alone (which ends where the next forward does
      // not start): for S streamed layers, forward + backward S + (S - 2), forward alone S - 2, forward +
      // backward S + (S - 2).
      const int S = kLayers - kept;
      EXPECT_EQ(streamed.copies, (S + S - 2) + (S - 2) + (S + S - 2));
    }
}

// Which layers stream when some stay: spread evenly, the middle of equal spans of the depth.
TEST(OffloadWeights, StreamedLayersAreSpreadEvenly) {
  EXPECT_EQ(WeightStream::streamed_layers(5, 0), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(WeightStream::streamed_layers(5, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(WeightStream::streamed_layers(36, 29), (std::vector<int>{2, 7, 12, 18, 23, 28, 33}));
  EXPECT_EQ(WeightStream::streamed_layers(36, 35), (std::vector<int>{18}));
  for (int bad : {36, 40, -1}) {
    try {
      WeightStream::streamed_layers(36, bad);
      FAIL() << bad << " resident layers accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("must be between 0 and 35"), std::string::npos) << e.what();
    }
  }
}

// The base's layers leave the device for two slots; the host holds them, and upload/download reach them
// wherever the parameters are bound.
TEST(OffloadWeights, DeviceKeepsTwoLayersAndTheHostTheRest) {
  test::TempDir t;
  const fs::path dir = five_layer_model(t);
  auto ops = make_cpu_ops();
  LoraConfig cfg{4, 8.0f, 0.0f, {"q_proj", "o_proj"}, false, 1};
  auto resident = load_pretrained(dir, *ops, cfg);
  cfg.offload_base = true;
  auto streamed = load_pretrained(dir, *ops, cfg);
  // One decoder layer's frozen weights (all layers alike), fp32 on the CPU, each padded to 256 bytes.
  size_t layer_bytes = 0;
  for (const Parameter& p : streamed->params().all())
    if (!p.trainable && p.group == 0) layer_bytes += (size_t(shape_numel(p.shape)) * 4 + 255) / 256 * 256;
  EXPECT_EQ(streamed->params().frozen_on_host(0).bytes(), layer_bytes);
  const char* layer0 = static_cast<const char*>(streamed->params().frozen_on_host(0).data);
  for (const Parameter& p : streamed->params().all())
    if (!p.trainable && p.group == 0) {  // each 256 bytes apart from the group's start, as in the device buffer
      EXPECT_EQ((static_cast<const char*>(p.value.data) - layer0) % 256, 0) << p.name;
    }
  EXPECT_EQ(streamed->params().host_frozen_bytes(), kLayers * layer_bytes);
  EXPECT_EQ(resident->params().weight_bytes() - streamed->params().weight_bytes(), kLayers * layer_bytes);
  ASSERT_NE(streamed->weight_stream(), nullptr);
  EXPECT_EQ(streamed->weight_stream()->device_bytes(), 2 * layer_bytes);
  EXPECT_EQ(resident->params().host_frozen_bytes(), 0u);
  // Every frozen weight reads back as loaded, before and after passes moved the layers through the slots.
  auto same_base = [&](const char* when) {
    for (const Parameter& p : resident->params().all()) {
      if (p.trainable) continue;
      std::vector<float> a(size_t(shape_numel(p.shape))), b(a.size());
      resident->params().download(*ops, p, a.data());
      streamed->params().download(*ops, streamed->params().at(p.name), b.data());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << p.name << " " << when;
    }
  };
  // With two of the five layers resident, three are on the host, and the slots are as before.
  LoraConfig kept = cfg;
  kept.offload_resident_layers = 2;
  auto partly = load_pretrained(dir, *ops, kept);
  EXPECT_EQ(partly->params().host_frozen_bytes(), 3 * layer_bytes);
  EXPECT_EQ(resident->params().weight_bytes() - partly->params().weight_bytes(), 3 * layer_bytes);
  EXPECT_EQ(partly->weight_stream()->streamed(), 3);
  EXPECT_EQ(partly->weight_stream()->device_bytes(), 2 * layer_bytes);
  same_base("after loading");
  HostBatch batch{1, 16, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  for (int i = 0; i < 16; ++i) batch.input_ids.push_back(int32_t(i * 7 % streamed->config().vocab_size));
  batch.targets = batch.input_ids;
  for (Transformer* m : {resident.get(), streamed.get()}) {
    m->plan(1, 16);
    m->step(batch, true);
  }
  same_base("after a pass");
  // An upload lands in the host copy, which the next pass streams: change one layer's weight in both.
  std::vector<float> w(size_t(shape_numel(resident->params().at("model.layers.0.mlp.up_proj.weight").shape)));
  std::mt19937 rng(5);
  for (float& x : w) x = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
  for (Transformer* m : {resident.get(), streamed.get()})
    m->params().upload(*ops, m->params().at("model.layers.0.mlp.up_proj.weight"), w.data());
  const double a = resident->step(batch, false).loss, b = streamed->step(batch, false).loss;
  EXPECT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b));
}

// SFT with LoRA: accumulation, evaluation passes in between (forward alone), full recompute with offloaded
// checkpoints, some layers kept, a resume from a checkpoint, against the resident run: metrics and the adapter
// bitwise.
TEST(OffloadWeights, LoraRunEqualsResidentBitwise) {
  test::DemoRunSetup s("", kLayers);
  auto train = [&](const std::string& out, const std::string& extra) {
    auto ops = make_cpu_ops();
    const std::string keys =
        "lora: true\nlora_rank: 4\nlora_alpha: 8\nlora_dropout: 0.1\nlearning_rate: 2.0e-2\nlogging_steps: 1\n"
        "eval_steps: 2\ngradient_accumulation_steps: 2\nmax_steps: 4\nrecompute: full\nsave_steps: 2\n";
    return s.train(*ops, out, test::yaml_with(keys, extra));
  };
  train("resident", "");
  const std::string partly = "offload_weights: true\noffload_weights_resident_layers: 3\n";
  train("partly", partly);
  const std::string log = train("streamed", "offload_weights: true\noffload_activations: true\n");
  EXPECT_NE(log.find("offload_weights: 5 of the frozen base's 5 decoder layers take "), std::string::npos) << log;
  EXPECT_NE(log.find("the offloaded base's layers "), std::string::npos) << log;  // the host plan
  // Stopped after step 2 and resumed with the base streamed: the adapter and its moments come back, the base
  // is read into host memory again.
  train("resumed", partly);
  fs::remove_all(s.t.path / "resumed" / "checkpoint-4");
  fs::remove_all(s.t.path / "resumed" / "adapter");
  EXPECT_NE(train("resumed", partly + "resume_from_checkpoint: true\n").find("checkpoint-2 at step 2"),
            std::string::npos);
  const fs::path a = s.t.path / "resident";
  const std::string adapter = read_bytes(a / "adapter" / "adapter_model.safetensors");
  EXPECT_FALSE(adapter.empty());
  for (const char* other : {"streamed", "partly", "resumed"}) {
    SCOPED_TRACE(other);
    test::expect_same_metrics(a, s.t.path / other);
    EXPECT_EQ(adapter, read_bytes(s.t.path / other / "adapter" / "adapter_model.safetensors"));
  }
}

// DPO with LoRA: each micro-batch runs the reference (adapters off, a forward alone) and the policy's forward
// and backward, all reading the streamed base.
TEST(OffloadWeights, DpoLoraRunEqualsResidentBitwise) {
  test::TempDir t;
  five_layer_model(t);
  write_reversal_preferences(t.path / "train.jsonl", 48, 8);
  test::run_dpo_lora(t.path, "resident", "");
  test::run_dpo_lora(t.path, "streamed", "offload_weights: true\n");
  test::expect_same_dpo_run(t.path / "resident", t.path / "streamed");
}

TEST(OffloadWeights, ConfigRefusesWhatIsNotBuilt) {
  EXPECT_EQ(config_error("adapter: lora\noffload_weights: true\n"), "");
  EXPECT_TRUE(parse_train_config("model: m\noutput_dir: out\ndatasets: [d.jsonl]\nadapter: lora\n"
                                 "offload_weights: true\n",
                                 "cfg.yaml", {}, TrainMode::kSft)
                  .offload_weights);
  EXPECT_EQ(config_error("offload_weights: true\n"),
            "cfg.yaml:6: offload_weights streams a frozen LoRA base from host memory, and full fine-tuning trains "
            "every weight: add adapter: lora, or use offload_master / offload_optimizer");
  EXPECT_EQ(config_error("adapter: qlora\nload_in_4bit: true\noffload_weights: true\n"),
            "cfg.yaml:8: offload_weights streams a bf16 base; a quantised QLoRA base (nf4, load_in_4bit) stays on the "
            "device: drop one of them");
  EXPECT_EQ(config_error("adapter: lora\nrecipe: fp8-hybrid\noffload_weights: true\n"),
            "cfg.yaml:8: offload_weights with recipe fp8-hybrid, which keeps FP8 copies of the base's projections on "
            "the device: use one of them");
  EXPECT_EQ(config_error("adapter: lora\noffload_weights: true\ngpus: 2\nzero_stage: 3\n"), "");  // each rank streams
  EXPECT_EQ(config_error("offload_weights: false\n"), "");                                        // off needs nothing
  EXPECT_EQ(parse_train_config("model: m\noutput_dir: out\ndatasets: [d.jsonl]\nadapter: lora\n"
                               "offload_weights: true\noffload_weights_resident_layers: 20\n",
                               "cfg.yaml", {}, TrainMode::kSft)
                .offload_weights_resident_layers,
            20);
  EXPECT_EQ(config_error("adapter: lora\noffload_weights_resident_layers: 4\n"),
            "cfg.yaml:7: offload_weights_resident_layers keeps some of a streamed base's layers on the device: it "
            "needs offload_weights: true");
  EXPECT_NE(config_error("adapter: lora\noffload_weights: true\noffload_weights_resident_layers: -1\n")
                .find("offload_weights_resident_layers"),
            std::string::npos);
}

// From the command line: one line, exit code 2; bench streams a LoRA base and reports the bytes.
TEST(OffloadWeights, CliRefusesAndBenchStreams) {
  test::TempDir t;
  std::ofstream(t.path / "c.yaml") << "model: model\noutput_dir: out\ndatasets:\n  - path: d.jsonl\n"
                                      "    type: conversation\noffload_weights: true\n";
  const test::CliRun bad = test::run("sft " + (t.path / "c.yaml").string(), t);
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("offload_weights streams a frozen LoRA base"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;

  const fs::path model = five_layer_model(t);
  const std::string bench = "bench --model " + model.string() +
                            " --device cpu --batch-size 2 --seq-len 32 --steps 1 --warmup 0 --no-profile --lora-rank 4";
  const test::CliRun resident = test::run(bench, t), streamed = test::run(bench + " --offload-weights", t);
  ASSERT_EQ(resident.code, 0) << resident.err;
  ASSERT_EQ(streamed.code, 0) << streamed.err;
  const auto a = nlohmann::json::parse(resident.out), b = nlohmann::json::parse(streamed.out);
  EXPECT_TRUE(b["offload_weights"].get<bool>());
  EXPECT_EQ(a["loss"], b["loss"]);
  EXPECT_GT(b["weight_host_gib"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(b["weight_slots_gib"].get<double>(), 2.0 / kLayers * b["weight_host_gib"].get<double>());
  EXPECT_DOUBLE_EQ(a["weight_gib"].get<double>() - b["weight_gib"].get<double>(), b["weight_host_gib"].get<double>());
  const test::CliRun partly = test::run(bench + " --offload-weights --offload-weights-resident-layers 2", t);
  ASSERT_EQ(partly.code, 0) << partly.err;
  const auto c = nlohmann::json::parse(partly.out);
  EXPECT_EQ(c["streamed_layers"].get<int>(), 3);
  EXPECT_EQ(a["loss"], c["loss"]);
  const test::CliRun all_kept = test::run(bench + " --offload-weights --offload-weights-resident-layers 5", t);
  EXPECT_EQ(all_kept.code, 2);
  EXPECT_NE(all_kept.err.find("offload_weights_resident_layers 5 must be between 0 and 4"), std::string::npos)
      << all_kept.err;
  const test::CliRun full = test::run("bench --model " + model.string() + " --device cpu --offload-weights", t);
  EXPECT_EQ(full.code, 2);
  EXPECT_NE(full.err.find("--offload-weights needs --lora-rank"), std::string::npos) << full.err;
  const test::CliRun nf4 = test::run(bench + " --offload-weights --qlora nf4", t);
  EXPECT_EQ(nf4.code, 2);
  EXPECT_NE(nf4.err.find("offload_weights streams a bf16 base"), std::string::npos) << nf4.err;
}

// `bench --plan-only` sizes weights, gradients and optimizer state from config.json alone, for every placement:
// the same bytes a run then allocates (the CPU's here: fp32 compute copies are the masters).
TEST(OffloadWeights, PlanOnlySizesWhatTheRunAllocates) {
  test::TempDir t;
  const std::string model = (test::fixtures() / "models" / "llama3-tiny-scaled").string();
  const std::string common = " --model " + model + " --device cpu --batch-size 2 --seq-len 32";
  for (const std::string args :
       {"", "--optimizer adamw_8bit", "--offload master", "--offload both", "--optimizer adamw_8bit --offload both",
        "--optimizer adamw_8bit --offload optimizer", "--lora-rank 4", "--lora-rank 4 --offload-weights",
        "--lora-rank 4 --offload-weights --offload-weights-resident-layers 1", "--lora-rank 4 --qlora nf4",
        "--lora-rank 4 --qlora fp8", "--lora-rank 4 --offload optimizer"}) {
    SCOPED_TRACE(args);
    const test::CliRun plan = test::run("bench --plan-only" + common + " " + args, t);
    const test::CliRun run = test::run("bench --steps 1 --warmup 0 --no-profile" + common + " " + args, t);
    ASSERT_EQ(plan.code, 0) << plan.err;
    ASSERT_EQ(run.code, 0) << run.err;
    const auto p = nlohmann::json::parse(plan.out), r = nlohmann::json::parse(run.out);
    const double gib = double(1 << 30);
    EXPECT_EQ(p["weight_gib"].get<double>() * gib,
              (r["weight_gib"].get<double>() + r["weight_slots_gib"].get<double>()) * gib);
    EXPECT_EQ(p["weight_host_gib"].get<double>() * gib, r["weight_host_gib"].get<double>() * gib);
    EXPECT_EQ(p["optimizer_gib"].get<double>() * gib, r["optimizer_gib"].get<double>() * gib);
    EXPECT_GT(p["total_gib"].get<double>(), p["activation_gib"].get<double>());
  }
}

}  // namespace
}  // namespace soltrain
