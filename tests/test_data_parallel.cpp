// Data parallel on CPU ranks: N MPI ranks (and `gpus: N` workers over TCP) train the same trajectory as one
// process with N× the gradient accumulation, for full fine-tuning and LoRA, ZeRO stages 0-3; 4 ranks resume a
// 2-rank checkpoint (its optimizer shards re-sharded; ZeRO-3's weights too) and save the model one process
// does; ZeRO-3 holds 1/world of every persistent piece; a rank that dies or raises ends the job with a message
// naming it; bad launch input is one line and exit 2. Small on purpose: a tiny model, three updates a run.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cli/demo_kit.h"
#include "cli_test_util.h"
#include "core/format.h"
#include "data_test_util.h"
#include "dist/launch.h"
#include "dp_test_util.h"
#include "io/safetensors.h"
#include "train/data_parallel.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

// Every step of `got` within 1e-6 relative of `want` (and the same steps); from step `loose_from` on within
// `loose` relative instead.
void expect_same_losses(const std::map<int64_t, double>& want, const std::map<int64_t, double>& got,
                        const std::string& what, int64_t loose_from = INT64_MAX, double loose = 1e-6) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << what << ": step " << step;
    EXPECT_NEAR(got.at(step), loss, (step >= loose_from ? loose : 1e-6) * loss) << what << ": step " << step;
  }
}

const std::string kLora = "--set adapter=lora --set lora_r=4 --set lora_alpha=8 --set lora_dropout=0.1";

// Every tensor of two saved models (one safetensors file each) within `tolerance` (1e-5) of each other: the same
// training with its sums in another order, not merely the same names and shapes.
void expect_same_model(const fs::path& want, const fs::path& got, const std::string& what, double tolerance = 1e-5) {
  const SafetensorsFile a(want), b(got);
  ASSERT_EQ(a.entries().size(), b.entries().size()) << what;
  for (const auto& [name, e] : a.entries()) {
    const TensorEntry* f = b.find(name);
    ASSERT_TRUE(f) << what << ": " << name;
    std::vector<float> x(size_t(shape_numel(e.shape))), y(x.size());
    read_as_f32(e, e.shape, x.data(), name);
    read_as_f32(*f, e.shape, y.data(), name);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
    EXPECT_LT(worst, tolerance) << what << ": " << name;
  }
}

// ZeRO-3's line of the memory plan (exact bytes as allocated) on `ranks` ranks: every persistent piece is this
// rank's slices, 1/ranks of the model plus at most one element of padding per rank and group.
void expect_sharded_memory(const std::string& err, int ranks, int groups) {
  const std::regex line(
      "ZeRO-3 per rank: (\\d+) of the model's (\\d+) trainable elements held: masters (\\d+) B, compute copy (\\d+) B"
      "[^,]*, gradients (\\d+) B, AdamW moments (\\d+) B; while a pass runs, gather buffers (\\d+) B");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, line)) << err;
  const int64_t held = std::stoll(m[1]), model = std::stoll(m[2]);
  EXPECT_GE(held * ranks, model);
  EXPECT_LE(held * ranks, model + int64_t(groups) * (ranks - 1));
  EXPECT_EQ(std::stoll(m[3]), 4 * held) << "fp32 masters: the slices only";
  EXPECT_EQ(std::stoll(m[4]), 0) << "on the CPU the masters are the compute copy";
  EXPECT_EQ(std::stoll(m[5]), 4 * held) << "fp32 gradients: the slices only";
  EXPECT_EQ(std::stoll(m[6]), 8 * held) << "rank 0's moments: its full chunks";
  EXPECT_GT(std::stoll(m[7]), 0);
}

TEST(DataParallel, MpiRanksMatchOneProcessWithTheMatchingAccumulation) {
  DpSetup s;
  for (const std::string& kind : {std::string(), kLora}) {
    const std::string name = kind.empty() ? "full" : "lora";
    const CliRun one = s.sft(0, name + "-1", kind + " --set gradient_accumulation_steps=4");
    ASSERT_EQ(one.code, 0) << one.err;
    const auto want = s.losses(name + "-1");
    ASSERT_EQ(want.size(), 3u);
    for (int ranks : {2, 4})
      for (int zero : {0, 1, 2, 3}) {
        if (kind == kLora && ranks == 4 && zero < 2) continue;  // LoRA: each stage on 2 ranks, stages 2-3 on 4 too
        const std::string out = name + "-" + std::to_string(ranks) + "-z" + std::to_string(zero);
        const CliRun r = s.sft(ranks, out,
                               kind + " --set gradient_accumulation_steps=" + std::to_string(4 / ranks) +
                                   " --set zero_stage=" + std::to_string(zero) +
                                   // (recompute gathers each layer a second time before its backward)
                                   (zero == 3 && ranks == 4 ? " --set recompute=full" : ""));
        ASSERT_EQ(r.code, 0) << out << "\n" << r.err;
        expect_same_losses(want, s.losses(out), out);
        // Rank 0 alone talks and writes: one plan line, one final line.
        EXPECT_NE(r.err.find("data parallel over " + std::to_string(ranks) + " ranks (mpi), ZeRO stage " +
                             std::to_string(zero)),
                  std::string::npos)
            << r.err;
        EXPECT_EQ(r.err.find("rank 1"), std::string::npos) << r.err;
        EXPECT_TRUE(fs::exists(s.t.path / out / (kind.empty() ? "model" : "adapter")));
        if (zero == 3) expect_sharded_memory(r.err, ranks, /*groups: 3 layers + embedding/head*/ 4);
        // What rank 0 saved is what the one process trained (ZeRO-3: gathered from every rank's slices).
        const fs::path file =
            kind.empty() ? fs::path("model") / "model.safetensors" : fs::path("adapter") / "adapter_model.safetensors";
        expect_same_model(s.t.path / (name + "-1") / file, s.t.path / out / file, out);
      }
  }
}

// A Qwen3-MoE (4 experts, 2 per token, the load-balancing loss on) over 2 CPU ranks equals one process with the
// matching accumulation: the experts' gradients reduced like any other, each rank's load-balancing loss in the
// loss (HF Trainer sums every micro-batch's), full and LoRA on attention and experts, ZeRO 0 and 2.
TEST(DataParallel, MoeRanksMatchOneProcess) {
  DpSetup s(/*experts=*/4);
  for (const std::string& kind :
       {std::string(), std::string(" --set adapter=lora --set lora_r=4 --set lora_alpha=8")}) {
    const std::string name = kind.empty() ? "moe-full" : "moe-lora";
    const CliRun one = s.sft(0, name + "-1", kind + " --set gradient_accumulation_steps=2");
    ASSERT_EQ(one.code, 0) << one.err;
    const auto want = s.losses(name + "-1");
    ASSERT_EQ(want.size(), 3u);
    for (int zero : {0, 2}) {
      const std::string out = name + "-2-z" + std::to_string(zero);
      const CliRun r = s.sft(2, out, kind + " --set zero_stage=" + std::to_string(zero));
      ASSERT_EQ(r.code, 0) << out << "\n" << r.err;
      expect_same_losses(want, s.losses(out), out);
      const fs::path file =
          kind.empty() ? fs::path("model") / "model.safetensors" : fs::path("adapter") / "adapter_model.safetensors";
      expect_same_model(s.t.path / (name + "-1") / file, s.t.path / out / file, out);
    }
  }
}

// PEFT's "trainable params: .. || all params: N || .." line's N (what the rank that logs holds).
int64_t all_params(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("all params: ([0-9,]+)"))) return -1;
  std::string digits = m[1];
  std::erase(digits, ',');
  return std::stoll(digits);
}

// The one-process run an expert-parallel run must equal: `kind` ("" full fine-tuning, else LoRA settings) with
// the accumulation of 4 ranks, into output_dir name + "-1": its saved weights' file, losses and log.
struct OneProcess {
  fs::path file;
  std::map<int64_t, double> losses;
  std::string err;
};
OneProcess one_process(const DpSetup& s, const std::string& name, const std::string& kind) {
  OneProcess o{kind.empty() ? fs::path("model") / "model.safetensors"
                            : fs::path("adapter") / "adapter_model.safetensors"};
  const CliRun r = s.sft(0, name + "-1", kind + " --set gradient_accumulation_steps=4");
  EXPECT_EQ(r.code, 0) << r.err;
  o.losses = s.losses(name + "-1");
  o.err = r.err;
  return o;
}

// Expert parallelism (ep_size) on CPU ranks: each group of ep_size ranks splits the 4 experts, the pairs go to
// their experts' ranks and back by all-to-all, and the run is one process's with the matching accumulation:
// EP 2 on 2 and 4 ranks, EP 4 on 4, ZeRO 0 and 2, full and LoRA on every linear (experts and router included).
// A checkpoint saved at EP 2 resumes at EP 4 and in one process; over a LoRA base each rank holds only its
// experts' base weights; what cannot run is refused in one line.
TEST(DataParallel, ExpertParallelRanksMatchOneProcess) {
  DpSetup s(/*experts=*/4);
  // (LoRA with a validation split: every rank joins each evaluation's passes, which reach every rank's experts)
  const std::string lora =
      " --set adapter=lora --set lora_r=4 --set lora_alpha=8 --set lora_target_linear=true --set val_set_size=0.05 "
      "--set eval_steps=2";
  for (const std::string& kind : {std::string(), lora}) {
    const std::string name = kind.empty() ? "ep-full" : "ep-lora";
    const OneProcess one = one_process(s, name, kind);
    ASSERT_EQ(one.losses.size(), 3u);
    const fs::path& file = one.file;
    const auto& want = one.losses;
    std::map<int, int64_t> held = {{1, all_params(one.err)}};  // ep_size → the weights rank 0 holds
    struct Case {
      int ranks, ep, zero;
    };
    // (ZeRO-3 over a LoRA base whose ranks hold different experts keeps the frozen base whole: not one base to gather)
    for (const Case c : {Case{2, 2, 0}, Case{2, 2, 2}, Case{2, 2, 3}, Case{4, 2, 0}, Case{4, 4, 0}, Case{4, 4, 2}}) {
      const std::string out = cat(name, "-", c.ranks, "-ep", c.ep, "-z", c.zero);
      const CliRun r = s.sft(c.ranks, out,
                             cat(kind, " --set gradient_accumulation_steps=", 4 / c.ranks, " --set zero_stage=", c.zero,
                                 " --set ep_size=", c.ep, c.ranks == 2 && c.zero == 0 ? " --set save_steps=1" : "",
                                 // (backward's recompute runs each layer's exchange again)
                                 c.ranks == 4 && c.zero == 2 ? " --set recompute=full" : ""));
      ASSERT_EQ(r.code, 0) << out << "\n" << r.err;
      EXPECT_NE(r.err.find(cat("expert parallel in groups of ", c.ep, " ranks, ", 4 / c.ep, " of 4 experts run on each",
                               kind.empty() ? " (full fine-tuning: every expert's weights kept on every rank)"
                                            : ", which holds only their base weights")),
                std::string::npos)
          << r.err;
      held[c.ep] = all_params(r.err);
      expect_same_losses(want, s.losses(out), out);
      expect_same_model(s.t.path / (name + "-1") / file, s.t.path / out / file, out);
      // the group's load in each logged step: between even (1) and one rank taking every row (ep_size)
      const auto ep_load = s.losses(out, "ep_load_imbalance");
      EXPECT_EQ(ep_load.size(), 3u) << out;
      for (const auto& [step, v] : ep_load) {
        EXPECT_GE(v, 1.0) << out;
        EXPECT_LE(v, double(c.ep)) << out;
      }
      if (!kind.empty()) {
        const auto evals = s.losses(name + "-1", "eval_loss");
        ASSERT_EQ(evals.size(), 3u) << "evaluated before training and at steps 2 and 3";
        expect_same_losses(evals, s.losses(out, "eval_loss"), out + " evaluation");
      }
    }
    // Over a LoRA base each rank holds its share of the experts: EP 2 drops 2 of the 4 experts' weights, EP 4 3.
    if (kind.empty()) {
      EXPECT_EQ(held[2], held[1]);
      EXPECT_EQ(held[4], held[1]);
    } else {
      EXPECT_GT(held[1], held[2]);
      EXPECT_EQ((held[1] - held[2]) * 3, (held[1] - held[4]) * 2);
    }
    // EP 2's checkpoint after update 1, resumed at EP 4 (ZeRO 2) and in one process
    const fs::path ck = s.t.path / (name + "-2-ep2-z0") / "checkpoint-1";
    ASSERT_TRUE(fs::exists(ck)) << ck;
    auto rest = want;
    rest.erase(1);
    const CliRun four = s.sft(4, name + "-resumed-ep4",
                              kind + " --set gradient_accumulation_steps=1 --set zero_stage=2 --set ep_size=4 " +
                                  "--set resume_from_checkpoint=" + ck.string());
    ASSERT_EQ(four.code, 0) << four.err;
    expect_same_losses(rest, s.losses(name + "-resumed-ep4"), name + ": EP 4 from an EP 2 checkpoint");
    expect_same_model(s.t.path / (name + "-1") / file, s.t.path / (name + "-resumed-ep4") / file, name + " resumed");
    const CliRun alone =
        s.sft(0, name + "-resumed-1",
              kind + " --set gradient_accumulation_steps=4 --set resume_from_checkpoint=" + ck.string());
    ASSERT_EQ(alone.code, 0) << alone.err;
    expect_same_losses(rest, s.losses(name + "-resumed-1"), name + ": one process from an EP 2 checkpoint");
  }
  // QLoRA: each rank holds its experts' NF4 base
  const std::string qlora = lora + " --set qlora_nf4=true";
  ASSERT_EQ(s.sft(0, "ep-qlora-1", qlora + " --set gradient_accumulation_steps=4").code, 0);
  const CliRun q = s.sft(2, "ep-qlora-2", qlora + " --set gradient_accumulation_steps=2 --set ep_size=2");
  ASSERT_EQ(q.code, 0) << q.err;
  expect_same_losses(s.losses("ep-qlora-1"), s.losses("ep-qlora-2"), "QLoRA NF4 at EP 2");
  EXPECT_NE(s.losses("ep-qlora-1"), s.losses("ep-lora-1")) << "the NF4 base is not the dense one";
  auto refused = [&](const CliRun& r, const std::string& want) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  };
  refused(s.sft(0, "ep-alone", "--set ep_size=2"), "ep_size 2 needs an sft or pt run over a multiple of 2 ranks");
  refused(s.sft(2, "ep-3", "--set ep_size=3"), "ep_size 3 needs an sft or pt run over a multiple of 3 ranks");
  DpSetup six(/*experts=*/6);
  refused(six.sft(4, "ep-4-of-6", "--set ep_size=4 --set gradient_accumulation_steps=1"),
          "ep_size 4 must divide the model's 6 experts");
  DpSetup dense;
  refused(dense.sft(2, "ep-dense", "--set ep_size=2"), "has no Mixture-of-Experts layers");
}

// LLEP (ep_llep) on CPU ranks: with the threshold at 1 and full capacity every imbalanced layer is re-placed, the
// busiest experts' excess rows run on other ranks, and the run is still one process's (full and LoRA, ZeRO 0 and
// 2): only where rows run changes. The metrics show the balance it reached next to the native placement's, and
// every rank holds every expert (a LoRA base is not shared out). Its settings outside it are one line each.
TEST(DataParallel, LeastLoadedExpertParallelMatchesOneProcess) {
  DpSetup s(/*experts=*/4);
  const std::string llep =
      " --set ep_llep=true --set ep_llep_threshold=1 --set ep_llep_capacity=1 --set ep_llep_min_rows=1";
  const std::string lora = " --set adapter=lora --set lora_r=4 --set lora_alpha=8 --set lora_target_linear=true";
  for (const std::string& kind : {std::string(), lora}) {
    const std::string name = kind.empty() ? "llep-full" : "llep-lora";
    const OneProcess one = one_process(s, name, kind);
    ASSERT_EQ(one.losses.size(), 3u);
    const fs::path& file = one.file;
    const auto& want = one.losses;
    struct Case {
      int ranks, ep, zero;
    };
    for (const Case c : {Case{2, 2, 0}, Case{4, 4, 2}}) {
      const std::string out = cat(name, "-", c.ranks, "-ep", c.ep, "-z", c.zero);
      const CliRun r = s.sft(c.ranks, out,
                             cat(kind, llep, " --set gradient_accumulation_steps=", 4 / c.ranks,
                                 " --set zero_stage=", c.zero, " --set ep_size=", c.ep));
      ASSERT_EQ(r.code, 0) << out << "\n" << r.err;
      EXPECT_NE(r.err.find("LLEP moves rows of the busiest experts to the least loaded ranks"), std::string::npos)
          << r.err;
      EXPECT_EQ(all_params(r.err), all_params(one.err)) << out << ": every rank holds every expert's weights";
      expect_same_losses(want, s.losses(out), out);
      expect_same_model(s.t.path / (name + "-1") / file, s.t.path / out / file, out);
      const auto placed = s.losses(out, "ep_load_imbalance"), native = s.losses(out, "ep_load_imbalance_native");
      ASSERT_EQ(placed.size(), 3u) << out;
      ASSERT_EQ(native.size(), 3u) << out;
      bool moved = false;
      for (const auto& [step, v] : placed) {
        EXPECT_GE(v, 1.0) << out;
        EXPECT_LE(v, native.at(step) + 1e-12) << out << ": LLEP never worsens the balance";
        moved = moved || v < native.at(step) - 1e-9;
      }
      EXPECT_TRUE(moved) << out << ": no step was re-placed, so the test proves nothing";
    }
  }
  auto refused = [&](const CliRun& r, const std::string& want) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  };
  refused(s.sft(0, "llep-alone", "--set ep_llep=true"),
          "ep_llep balances expert parallelism's ranks: it needs ep_size > 1");
  refused(s.sft(0, "llep-threshold", "--set ep_llep_threshold=1.5"),
          "ep_llep_threshold tunes LLEP, which is off: set ep_llep: true");
}

// `bench --plan-only --gpus N --data-parallel Z` prints, without loading anything, the bytes each rank then
// allocates: ZeRO-3's line of a real 2-rank run (full, LoRA, full with 8-bit moments: its chunks moved onto the
// embedding's blocks), ZeRO-2's sharded moments (fp32 and 8-bit), and one rank alone (ZeRO-3's slices whole: no
// pass buffers).
TEST(DataParallel, PlanOnlyIsWhatEachRankAllocates) {
  DpSetup s;
  const auto plan = [&](int gpus, int zero, const std::string& extra) {
    const CliRun r = run("bench --plan-only --device cpu --model " + (s.t.path / "model").string() +
                             " --batch-size 2 --seq-len 48 --gpus " + std::to_string(gpus) + " --data-parallel " +
                             std::to_string(zero) + extra,
                         s.t);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out)["data_parallel"];
  };
  const std::regex line(
      "ZeRO-3 per rank: \\d+ of the model's \\d+ trainable elements held: masters (\\d+) B, compute copy \\d+ B[^,]*, "
      "gradients (\\d+) B, AdamW moments (\\d+) B; while a pass runs, gather buffers (\\d+) B and gradient scratch "
      "(\\d+) B");
  for (const auto& [name, sets, flag] :
       {std::tuple{"full", std::string(), std::string()},
        std::tuple{"lora", kLora + " --set lora_dropout=0", std::string(" --lora-rank 4")},
        std::tuple{"full-8bit", std::string(" --set optimizer=adamw_8bit"), std::string(" --optimizer adamw_8bit")}}) {
    SCOPED_TRACE(name);
    const CliRun r =
        s.sft(2, std::string(name) + "-z3", sets + " --set gradient_accumulation_steps=1 --set zero_stage=3");
    ASSERT_EQ(r.code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, line)) << r.err;
    const auto p = plan(2, 3, flag);
    EXPECT_EQ(p["master_bytes"].get<int64_t>(), std::stoll(m[1]));
    EXPECT_EQ(p["grad_bytes"].get<int64_t>(), std::stoll(m[2]));
    EXPECT_EQ(p["moment_bytes"].get<int64_t>(), std::stoll(m[3]));
    EXPECT_EQ(p["gather_bytes"].get<int64_t>(), std::stoll(m[4]));
    EXPECT_EQ(p["grad_scratch_bytes"].get<int64_t>(), std::stoll(m[5]));
  }
  // ZeRO-2 on 2 ranks: the moments are rank 0's chunks (the run prints their size).
  const CliRun z2 = s.sft(2, "z2", "--set gradient_accumulation_steps=1 --set zero_stage=2");
  ASSERT_EQ(z2.code, 0) << z2.err;
  const auto p2 = plan(2, 2, "");
  EXPECT_TRUE(std::regex_search(
      z2.err, std::regex("\n  AdamW moments +" + format_bytes(p2["moment_bytes"].get<double>()) + "\n")))
      << z2.err;
  EXPECT_LT(p2["moment_bytes"].get<int64_t>(), plan(1, 0, "")["moment_bytes"].get<int64_t>());
  const auto alone = plan(1, 3, "");
  EXPECT_EQ(alone["gather_bytes"].get<int64_t>() + alone["grad_scratch_bytes"].get<int64_t>(), 0);
  // 8-bit moments over 2 ranks, ZeRO-2: rank 0's pieces, codes and absmax, planned as the run allocates them.
  const CliRun z2q =
      s.sft(2, "z2-8bit", "--set gradient_accumulation_steps=1 --set zero_stage=2 --set optimizer=adamw_8bit");
  ASSERT_EQ(z2q.code, 0) << z2q.err;
  const auto p2q = plan(2, 2, " --optimizer adamw_8bit");
  EXPECT_TRUE(std::regex_search(
      z2q.err, std::regex("\n  AdamW moments +" + format_bytes(p2q["moment_bytes"].get<double>()) + "  8-bit\n")))
      << z2q.err;
  // (this model's layers are under 4096 elements a tensor, so only the embedding's moments are 8-bit)
  EXPECT_LT(p2q["moment_bytes"].get<int64_t>(), p2["moment_bytes"].get<int64_t>());
  // Over a cluster: rank 0's collectives per update (train/comm_volume.h; what a rank calls is
  // tests/test_comm_volume.cpp's), timed over the slowest link its rings cross: NVLink in one node, InfiniBand across.
  const auto one_node = plan(4, 3, " --nodes 1"), two_nodes = plan(4, 3, " --nodes 2 --ib-gbs 25");
  const auto& c1 = one_node["communication"];
  const auto& c2 = two_nodes["communication"];
  EXPECT_EQ(c1["link"], "nvlink");
  EXPECT_EQ(c2["link"], "infiniband");
  EXPECT_EQ(c2["link_gb_per_s"].get<double>(), 25.0);
  const double bytes = (c1["all_gather_gib"].get<double>() + c1["reduce_scatter_gib"].get<double>() +
                        c1["all_reduce_gib"].get<double>()) *
                       double(1 << 30);
  EXPECT_GT(c1["reduce_scatter_gib"].get<double>(), 0);
  EXPECT_NEAR(c2["comm_ms"].get<double>(), bytes / 25e9 * 1e3, 1e-9 * bytes);
  EXPECT_NEAR(c1["comm_ms"].get<double>(), bytes / 360e9 * 1e3, 1e-9 * bytes);
  const CliRun uneven = run("bench --plan-only --device cpu --model " + (s.t.path / "model").string() +
                                " --gpus 4 --nodes 3 --data-parallel 3",
                            s.t);
  EXPECT_EQ(uneven.code, 2);
  EXPECT_EQ(uneven.err, "error: bench --nodes 3 needs --gpus a multiple of it (got --gpus 4)\n");
  // bench itself trains with them at ZeRO-2 (it refused them before they were sharded).
  const CliRun bench8 =
      run("bench --device cpu --model " + (s.t.path / "model").string() +
              " --batch-size 1 --seq-len 32 --steps 1 --warmup 0 --optimizer adamw_8bit --data-parallel 2",
          s.t);
  EXPECT_EQ(bench8.code, 0) << bench8.err;
}

// A shape whose low-bit parameters start off block boundaries of their layer (q_proj is 72 x 72 = 5184 elements,
// 20.25 blocks of 256, and o_proj starts 10368 elements in), so the shard plan must move its cuts onto blocks.
DemoModelShape odd_blocks_shape() {
  DemoModelShape s;
  s.hidden = 72, s.layers = 2, s.heads = 2, s.kv_heads = 1, s.head_dim = 36, s.intermediate = 136;
  return s;
}

// Low-bit AdamW under ZeRO 1-3 is the unsharded update's bits: each rank's pieces hold exactly the blocks (and
// absmax) one process holds. Two ranks without clipping and with one micro-batch sum the same two gradients
// whatever the stage, so ZeRO 1, 2 and 3 save the model ZeRO 0 saves bit for bit (bitsandbytes' 8-bit, torchao's
// 8-bit and 4-bit); with clipping and accumulation over 2 and 4 ranks, the run is one process's within the
// data-parallel tolerance.
TEST(DataParallel, LowBitMomentsShardedAreTheUnshardedUpdate) {
  DpSetup s(odd_blocks_shape());
  const fs::path model = fs::path("model") / "model.safetensors";
  const std::string plain = " --set max_grad_norm=0 --set gradient_accumulation_steps=1";
  auto same_bits = [&](int ranks, const std::string& opt, int zero, const std::string& want) {
    const std::string out = cat(opt, "-", ranks, "-z", zero);
    const CliRun r = s.sft(ranks, out, cat("--set optimizer=", opt, plain, " --set zero_stage=", zero));
    ASSERT_EQ(r.code, 0) << out << "\n" << r.err;
    EXPECT_EQ(s.losses(out), s.losses(want)) << out;
    EXPECT_TRUE(s.read(s.t.path / out / model) == s.read(s.t.path / want / model)) << out << " is not " << want;
  };
  for (const std::string opt : {"adamw_8bit", "adamw_torch_8bit", "adamw_torch_4bit"}) {
    const std::string want = opt + "-2-z0";
    ASSERT_EQ(s.sft(2, want, cat("--set optimizer=", opt, plain, " --set zero_stage=0")).code, 0);
    for (int zero : {1, 2, 3})
      if (opt == "adamw_8bit" || zero == 3) same_bits(2, opt, zero, want);
  }
  // One MPI rank alone (its shard is the whole model): each stage is the single process's 8-bit run, bit for bit.
  ASSERT_EQ(s.sft(0, "adamw_8bit-single", cat("--set optimizer=adamw_8bit", plain)).code, 0);
  ::setenv("SOLTRAIN_COMMUNICATOR", "mpi", 1);
  for (int zero : {1, 2, 3})
    ASSERT_EQ(
        s.sft(0, cat("adamw_8bit-1-z", zero), cat("--set optimizer=adamw_8bit", plain, " --set zero_stage=", zero))
            .code,
        0);
  ::unsetenv("SOLTRAIN_COMMUNICATOR");
  for (int zero : {1, 2, 3}) {
    EXPECT_EQ(s.losses(cat("adamw_8bit-1-z", zero)), s.losses("adamw_8bit-single")) << zero;
    EXPECT_TRUE(s.read(s.t.path / cat("adamw_8bit-1-z", zero) / model) ==
                s.read(s.t.path / "adamw_8bit-single" / model))
        << "one rank, ZeRO " << zero;
  }
  // Clipped, accumulated, 4 ranks: one process's trajectory (its sums in another order; a sum's last bit can move an
  // 8-bit code a step, so the weights agree to a tenth of one update, 5e-3 · 0.1).
  const double low_bit = 5e-4;
  const std::string clipped = " --set optimizer=adamw_8bit";
  ASSERT_EQ(s.sft(0, "one", clipped + " --set gradient_accumulation_steps=4").code, 0);
  for (const auto& [ranks, zero] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{4, 3}}) {
    const std::string out = cat("clipped-", ranks, "-z", zero);
    const CliRun r =
        s.sft(ranks, out, cat(clipped, " --set gradient_accumulation_steps=", 4 / ranks, " --set zero_stage=", zero));
    ASSERT_EQ(r.code, 0) << r.err;
    expect_same_losses(s.losses("one"), s.losses(out), out);
    expect_same_model(s.t.path / "one" / model, s.t.path / out / model, out, low_bit);
  }
}

// Sharded low-bit moments checkpoint as pieces of each parameter (optimizer-shard-<r>-of-<n>), which any rank
// count reads: a 2-rank ZeRO-2 checkpoint resumed by 4 ZeRO-3 ranks and by one process, and one process's whole
// 8-bit file resumed by 2 ZeRO-1 ranks, each continue the uninterrupted run; a missing shard is one line.
TEST(DataParallel, LowBitShardsResumeAtAnyRankCount) {
  DpSetup s(odd_blocks_shape());
  const std::string opt = " --set optimizer=adamw_8bit";
  ASSERT_EQ(s.sft(0, "one", opt + " --set gradient_accumulation_steps=4 --set save_steps=1").code, 0);
  auto want = s.losses("one");
  want.erase(1);
  const CliRun two =
      s.sft(2, "two", opt + " --set gradient_accumulation_steps=2 --set zero_stage=2 --set save_steps=1");
  ASSERT_EQ(two.code, 0) << two.err;
  const fs::path ck = s.t.path / "two" / "checkpoint-1";
  ASSERT_TRUE(fs::exists(ck / "optimizer-shard-1-of-2.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "optimizer.safetensors"));
  {
    const SafetensorsFile shard(ck / "optimizer-shard-1-of-2.safetensors");
    EXPECT_EQ(shard.metadata().at("format"), "soltrain-adamw-8bit-shard-1");
    EXPECT_NE(shard.metadata().at("pieces").find("model.embed_tokens.weight"), std::string::npos);
  }
  const CliRun four = s.sft(
      4, "four",
      opt + " --set gradient_accumulation_steps=1 --set zero_stage=3 --set resume_from_checkpoint=" + ck.string());
  ASSERT_EQ(four.code, 0) << four.err;
  expect_same_losses(want, s.losses("four"), "4 ZeRO-3 ranks from a 2-rank 8-bit checkpoint");
  expect_same_model(s.t.path / "one" / "model" / "model.safetensors", s.t.path / "four" / "model" / "model.safetensors",
                    "4 ZeRO-3 ranks' final model", 5e-4);
  ASSERT_EQ(
      s.sft(0, "again", opt + " --set gradient_accumulation_steps=4 --set resume_from_checkpoint=" + ck.string()).code,
      0);
  expect_same_losses(want, s.losses("again"), "1 process from a 2-rank 8-bit checkpoint");
  // One process's whole file, read by two ZeRO-1 ranks.
  const fs::path whole = s.t.path / "one" / "checkpoint-1";
  ASSERT_TRUE(fs::exists(whole / "optimizer.safetensors"));
  const CliRun z1 = s.sft(
      2, "z1",
      opt + " --set gradient_accumulation_steps=2 --set zero_stage=1 --set resume_from_checkpoint=" + whole.string());
  ASSERT_EQ(z1.code, 0) << z1.err;
  expect_same_losses(want, s.losses("z1"), "2 ZeRO-1 ranks from one process's 8-bit checkpoint");
  // Rank 0's shard in place of rank 1's (and no checksums to tell): the pieces' own count names what is missing.
  fs::copy_file(ck / "optimizer-shard-0-of-2.safetensors", ck / "optimizer-shard-1-of-2.safetensors",
                fs::copy_options::overwrite_existing);
  fs::remove(ck / "checksums.sha256");
  const CliRun gone =
      s.sft(0, "gone", opt + " --set gradient_accumulation_steps=4 --set resume_from_checkpoint=" + ck.string());
  EXPECT_EQ(gone.code, 2) << gone.err;
  EXPECT_NE(gone.err.find("moments this rank needs (a shard file is missing or repeated)"), std::string::npos)
      << gone.err;
  EXPECT_EQ(gone.err.find("error:"), gone.err.rfind("error:")) << gone.err;
}

// The shard plan with low-bit moments: every cut inside a parameter that keeps them falls on one of its block
// boundaries, each rank's chunk is at least the even split, and where parameters sit on block boundaries (real
// models) the chunk is the even split rounded up to a block; fp32 moments keep the even split.
TEST(DataParallel, LowBitShardCutsFallOnBlocks) {
  ParameterStore ps;
  // group 0: odd sizes (a quantised 8-bit parameter needs 4096 elements; 4100 and 5184 are not whole blocks)
  ps.add("a", {4100}, true, 0);
  ps.add("b", {100}, true, 0);
  ps.add("c", {72, 72}, true, 0);
  ps.add("d", {3000}, true, 0);
  ps.add("e", {8192}, true, 0);
  // group 1: every parameter whole blocks
  ps.add("f", {64, 256}, true, 1);
  ps.add("g", {32, 256}, true, 1);
  ps.lay_out();
  for (const Moments m : {Moments::Blockwise8, Moments::Torchao8, Moments::Torchao4})
    for (int size = 2; size <= 8; ++size) {
      const ShardPlan p = make_shard_plan(ps, 0, size, m);
      const int64_t block = moment_block(m);
      for (int g = 0; g < 2; ++g) {
        const auto& gr = p.groups[size_t(g)];
        const int64_t even = (gr.numel + size - 1) / size;
        EXPECT_GE(gr.chunk, even);
        if (g == 1) EXPECT_EQ(gr.chunk, (even + block - 1) / block * block) << size;
        for (int r = 1; r < size; ++r) {
          const int64_t cut = gr.begin + r * gr.chunk;
          for (const Parameter& q : ps.all()) {
            const int64_t n = shape_numel(q.shape);
            if (q.group == g && quantised_moments(m, n) && cut > q.offset && cut < q.offset + n)
              EXPECT_EQ((cut - q.offset) % block, 0) << q.name << " cut at " << cut << ", " << size << " ranks";
          }
        }
      }
      EXPECT_EQ(make_shard_plan(ps, 0, size).groups[0].chunk, (ps.group_numel(0) + size - 1) / size);
    }
}

// Offloaded state under ZeRO 1-3 (offload_master: the masters, ZeRO-3's slices of them, in host memory;
// offload_optimizer: the shard's moments there; each streamed through the device piece by piece) trains as the
// resident state does, bit for bit: fp32 and 8-bit moments, each stage, on 2 ranks (the model rank 0 saves
// gathered through the device from host-held slices); one MPI rank alone (ZeRO-3's slices whole); and a 2-rank
// ZeRO-3 checkpoint of offloaded slices resumes onto the uninterrupted run's model.
TEST(DataParallel, OffloadedStateUnderZeroTrainsAsResident) {
  DpSetup s(odd_blocks_shape());
  const fs::path model = fs::path("model") / "model.safetensors";
  const std::string off = " --set offload_master=true --set offload_optimizer=true";
  auto same = [&](const std::string& a, const std::string& b) {
    EXPECT_EQ(s.losses(a), s.losses(b)) << a << " vs " << b;
    EXPECT_TRUE(s.read(s.t.path / a / model) == s.read(s.t.path / b / model)) << a << " is not " << b;
  };
  for (const std::string opt : {"adamw", "adamw_8bit"})
    for (int zero : {1, 2, 3}) {
      const std::string sets =
          cat("--set optimizer=", opt, " --set gradient_accumulation_steps=2 --set zero_stage=", zero);
      const std::string tag = cat(opt, "-z", zero);
      ASSERT_EQ(s.sft(2, tag + "-resident", sets).code, 0) << tag;
      const CliRun r = s.sft(2, tag + "-offloaded", sets + off);
      ASSERT_EQ(r.code, 0) << tag << "\n" << r.err;
      EXPECT_NE(r.err.find("offload: host memory holds the fp32 masters"), std::string::npos) << r.err;
      same(tag + "-resident", tag + "-offloaded");
    }
  // One MPI rank alone: ZeRO-3's slices are the groups, offloaded; the single process offloads the same.
  ASSERT_EQ(s.sft(0, "one-offloaded", "--set gradient_accumulation_steps=2" + off).code, 0);
  ::setenv("SOLTRAIN_COMMUNICATOR", "mpi", 1);
  const CliRun alone = s.sft(0, "mpi1-z3-offloaded", "--set gradient_accumulation_steps=2 --set zero_stage=3" + off);
  ::unsetenv("SOLTRAIN_COMMUNICATOR");
  ASSERT_EQ(alone.code, 0) << alone.err;
  same("one-offloaded", "mpi1-z3-offloaded");
  // A ZeRO-3 checkpoint of host-held slices, resumed by the same ranks, continues to the same model.
  const std::string z3 = "--set gradient_accumulation_steps=1 --set zero_stage=3 --set optimizer=adamw_8bit" + off;
  ASSERT_EQ(s.sft(2, "z3-saving", z3 + " --set save_steps=1").code, 0);
  const fs::path ck = s.t.path / "z3-saving" / "checkpoint-2";
  ASSERT_TRUE(fs::exists(ck / "optimizer-shard-1-of-2.safetensors"));
  const CliRun resumed = s.sft(2, "z3-resumed", z3 + " --set resume_from_checkpoint=" + ck.string());
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(s.read(s.t.path / "z3-saving" / model) == s.read(s.t.path / "z3-resumed" / model));
  EXPECT_EQ(s.losses("z3-resumed").at(3), s.losses("z3-saving").at(3));
}

// The data-parallel path at world size 1 (MPI alone: collectives, hooks, the sharded update and the gathers,
// in place as NCCL runs them) trains bitwise as the single process does; ZeRO-3 too (a lone rank's slices
// are whole groups: its gather and gradient buffers).
TEST(DataParallel, OneMpiRankIsBitwiseTheSingleProcess) {
  DpSetup s;
  ASSERT_EQ(s.sft(0, "one", "--set gradient_accumulation_steps=2").code, 0);
  const auto want = s.losses("one");
  for (int zero : {0, 2, 3}) {
    const std::string out = "mpi1-z" + std::to_string(zero);
    ::setenv("SOLTRAIN_COMMUNICATOR", "mpi", 1);
    const CliRun r = s.sft(0, out, "--set gradient_accumulation_steps=2 --set zero_stage=" + std::to_string(zero));
    ::unsetenv("SOLTRAIN_COMMUNICATOR");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("data parallel over 1 ranks (mpi)"), std::string::npos) << r.err;
    ASSERT_TRUE(fs::exists(s.t.path / out / "model" / "model.safetensors"));
    if (zero == 3) {
      EXPECT_NE(r.err.find("one rank's slices are whole groups"), std::string::npos) << r.err;
    }
    EXPECT_EQ(s.losses(out), want) << out;
    EXPECT_EQ(s.read(s.t.path / out / "model" / "model.safetensors"),
              s.read(s.t.path / "one" / "model" / "model.safetensors"))
        << out;
  }
}

TEST(DataParallel, GpusWorkersOverTcpMatchOneProcess) {
  DpSetup s;
  ASSERT_EQ(s.sft(0, "one", "--set gradient_accumulation_steps=3").code, 0);
  for (int zero : {2, 3}) {  // (three ranks: groups that do not split evenly, padded chunks)
    const std::string out = "three-z" + std::to_string(zero);
    const CliRun r =
        s.sft(0, out, "--set gradient_accumulation_steps=1 --gpus 3 --set zero_stage=" + std::to_string(zero));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("launching 3 workers"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("data parallel over 3 ranks (tcp)"), std::string::npos) << r.err;
    expect_same_losses(s.losses("one"), s.losses(out), "gpus: 3, " + out);
  }
  expect_same_model(s.t.path / "one" / "model" / "model.safetensors",
                    s.t.path / "three-z3" / "model" / "model.safetensors", "gpus: 3, ZeRO-3");
}

// Offload over ranks, each rank its own: the streamed base (offload_weights, LoRA) and the layer-input
// checkpoints (offload_activations, recompute full, LoRA and full fine-tuning) while the collectives run (ZeRO-3
// gathers on the side stream too). Bitwise the same ranks without them.
TEST(DataParallel, RanksOffloadingTrainAsResidentOnes) {
  DpSetup s;
  const std::string ckpt = " --set recompute=full --set offload_activations=true";
  struct Case {
    std::string name, kind, offload, saved, log;
  };
  const std::vector<Case> cases = {
      {"weights", kLora, " --set offload_weights=true", "adapter/adapter_model.safetensors",
       "offload_weights: 3 of the frozen base's 3 decoder layers"},
      {"lora-ckpt", kLora + " --set recompute=full", ckpt, "adapter/adapter_model.safetensors",
       "offload_activations: the layer-input checkpoints take"},
      {"full-ckpt", " --set recompute=full", ckpt, "model/model.safetensors",
       "offload_activations: the layer-input checkpoints take"}};
  for (const Case& c : cases)
    for (int zero : {0, 3}) {
      const std::string z = " --set zero_stage=" + std::to_string(zero), tag = c.name + "-z" + std::to_string(zero);
      const CliRun a = s.sft(2, tag + "-resident", c.kind + z);
      ASSERT_EQ(a.code, 0) << a.err;
      const CliRun b = s.sft(2, tag + "-offloaded", c.kind + z + c.offload);
      ASSERT_EQ(b.code, 0) << b.err;
      EXPECT_NE(b.err.find(c.log), std::string::npos) << b.err;
      EXPECT_FALSE(s.losses(tag + "-resident").empty());
      EXPECT_EQ(s.losses(tag + "-resident"), s.losses(tag + "-offloaded")) << tag;
      EXPECT_EQ(s.read(s.t.path / (tag + "-resident") / c.saved), s.read(s.t.path / (tag + "-offloaded") / c.saved))
          << tag;
    }
}

TEST(DataParallel, FourRanksResumeATwoRankCheckpoint) {
  DpSetup s;
  ASSERT_EQ(s.sft(0, "one", "--set gradient_accumulation_steps=4").code, 0);
  const CliRun two = s.sft(2, "two", "--set gradient_accumulation_steps=2 --set zero_stage=2 --set save_steps=1");
  ASSERT_EQ(two.code, 0) << two.err;
  const fs::path ck = s.t.path / "two" / "checkpoint-1";
  ASSERT_TRUE(fs::exists(ck / "optimizer-shard-0-of-2.safetensors"));
  ASSERT_TRUE(fs::exists(ck / "optimizer-shard-1-of-2.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "optimizer.safetensors"));
  // Four ranks, ZeRO-1 (four shards of the moments from two), continue the one-process trajectory.
  const CliRun four = s.sft(
      4, "four", "--set gradient_accumulation_steps=1 --set zero_stage=1 --set resume_from_checkpoint=" + ck.string());
  ASSERT_EQ(four.code, 0) << four.err;
  auto want = s.losses("one");
  want.erase(1);
  expect_same_losses(want, s.losses("four"), "4 ranks from a 2-rank checkpoint");
  // One process reads the shards too.
  ASSERT_EQ(s.sft(0, "again", "--set gradient_accumulation_steps=4 --set resume_from_checkpoint=" + ck.string()).code,
            0);
  expect_same_losses(want, s.losses("again"), "1 process from a 2-rank checkpoint");
  // The other way: one process's whole file, each of 2 ZeRO-2 ranks reading only its ranges of it.
  ASSERT_EQ(s.sft(0, "one-saving", "--set gradient_accumulation_steps=4 --set save_steps=1").code, 0);
  const fs::path whole = s.t.path / "one-saving" / "checkpoint-1";
  const CliRun z2 = s.sft(
      2, "z2", "--set gradient_accumulation_steps=2 --set zero_stage=2 --set resume_from_checkpoint=" + whole.string());
  ASSERT_EQ(z2.code, 0) << z2.err;
  expect_same_losses(want, s.losses("z2"), "2 ZeRO-2 ranks from one process's checkpoint");
  // A shard given twice (rank 0's in rank 1's place, no checksums to tell): the ranks' own count says so.
  fs::copy_file(ck / "optimizer-shard-0-of-2.safetensors", ck / "optimizer-shard-1-of-2.safetensors",
                fs::copy_options::overwrite_existing);
  fs::remove(ck / "checksums.sha256");
  const CliRun twice = s.sft(
      2, "twice", "--set gradient_accumulation_steps=2 --set zero_stage=2 --set resume_from_checkpoint=" + ck.string());
  EXPECT_EQ(twice.code, 2) << twice.err;
  EXPECT_NE(twice.err.find("moments this rank needs (a shard file is missing or repeated)"), std::string::npos)
      << twice.err;
}

// ZeRO-3 checkpoints: rank 0 writes the model gathered from the slices, each rank its optimizer shard; 4 ranks
// load it (every rank keeping its own slices of the weights) and continue the one-process trajectory to the
// model one process saves, for full fine-tuning and LoRA; one process reads the checkpoint too.
TEST(DataParallel, FourRanksResumeATwoRankZero3Checkpoint) {
  DpSetup s;
  // (LoRA without dropout: a resumed run restarts the dropout masks' pass count at the update count, not at
  // the passes made, so with accumulation > 1 its masks differ from the uninterrupted run's, ZeRO or not.)
  for (const std::string& kind : {std::string(), kLora + " --set lora_dropout=0"}) {
    const std::string name = kind.empty() ? "full" : "lora";
    const fs::path file =
        kind.empty() ? fs::path("model") / "model.safetensors" : fs::path("adapter") / "adapter_model.safetensors";
    ASSERT_EQ(s.sft(0, name + "-one", kind + " --set gradient_accumulation_steps=4").code, 0);
    const CliRun two =
        s.sft(2, name + "-two", kind + " --set gradient_accumulation_steps=2 --set zero_stage=3 --set save_steps=1");
    ASSERT_EQ(two.code, 0) << two.err;
    const fs::path ck = s.t.path / (name + "-two") / "checkpoint-1";
    ASSERT_TRUE(fs::exists(ck / "optimizer-shard-1-of-2.safetensors"));
    const CliRun four = s.sft(4, name + "-four",
                              kind +
                                  " --set gradient_accumulation_steps=1 --set zero_stage=3 "
                                  "--set resume_from_checkpoint=" +
                                  ck.string());
    ASSERT_EQ(four.code, 0) << four.err;
    if (kind.empty()) {  // each rank read its own quarter of the checkpoint's weights, no more (rank 0 says)
      const SafetensorsFile saved(ck / "model.safetensors");
      int64_t whole = 0;
      for (const auto& [n, e] : saved.entries()) whole += int64_t(e.bytes);
      std::smatch m;
      ASSERT_TRUE(std::regex_search(four.err, m, std::regex("ZeRO-3: this rank read [^(]*\\((\\d+) bytes\\)")))
          << four.err;
      const int64_t read = std::stoll(m[1]);
      EXPECT_GE(read * 4, whole);
      EXPECT_LE(read * 4, whole + 4 * 4 * 4) << "more than its slices (a chunk's rounding up, 4 groups)";
    }
    auto want = s.losses(name + "-one");
    want.erase(1);
    expect_same_losses(want, s.losses(name + "-four"), name + ": 4 ZeRO-3 ranks from a 2-rank ZeRO-3 checkpoint");
    expect_same_model(s.t.path / (name + "-one") / file, s.t.path / (name + "-four") / file, name + " final model");
    const CliRun again = s.sft(
        0, name + "-again", kind + " --set gradient_accumulation_steps=4 --set resume_from_checkpoint=" + ck.string());
    ASSERT_EQ(again.code, 0) << again.err;
    expect_same_losses(want, s.losses(name + "-again"), name + ": 1 process from a 2-rank ZeRO-3 checkpoint");
  }
}

// ZeRO-3 loads by slices: each rank allocates only its slices and reads only their byte ranges of the model's
// weights (the whole model is never on one rank), then trains the one process's trajectory and saves its model;
// a 2-rank checkpoint resumes on 4 ranks (FourRanksResumeATwoRankZero3Checkpoint), a 4-rank one on 2 here.
TEST(DataParallel, Zero3LoadsOnlyEachRanksSlices) {
  DpSetup s;
  int64_t whole = 0;  // the model's weights as stored
  const SafetensorsFile stored(s.t.path / "model" / "model.safetensors");
  for (const auto& [n, e] : stored.entries()) whole += int64_t(e.bytes);
  const CliRun one = s.sft(0, "one", "--set gradient_accumulation_steps=4 --set save_steps=2");
  ASSERT_EQ(one.code, 0) << one.err;
  const std::regex loaded(
      "ZeRO-3: loading, this rank read [^(]*\\((\\d+) bytes\\) of the model's weights and held at "
      "most (\\d+) bytes of device memory");
  const std::regex plan("masters (\\d+) B, compute copy (\\d+) B[^,]*, gradients (\\d+) B");
  for (int ranks : {2, 4}) {
    const std::string out = "z3-" + std::to_string(ranks);
    const CliRun r =
        s.sft(ranks, out,
              "--set zero_stage=3 --set save_steps=2 --set gradient_accumulation_steps=" + std::to_string(4 / ranks));
    ASSERT_EQ(r.code, 0) << r.err;
    std::smatch m, p;
    ASSERT_TRUE(std::regex_search(r.err, m, loaded)) << r.err;
    ASSERT_TRUE(std::regex_search(r.err, p, plan)) << r.err;
    const int64_t read = std::stoll(m[1]), held = std::stoll(m[2]);
    const int64_t slices = std::stoll(p[1]) + std::stoll(p[2]) + std::stoll(p[3]);
    EXPECT_GE(read * ranks, whole);
    EXPECT_LE(read * ranks, whole + 4 * ranks * 4) << "more than its slices (a chunk's rounding up, 4 groups)";
    // What it held while loading: its slices (masters, gradients) and the model's small fixed buffers, nothing
    // whole (the masters alone would be the model's size).
    EXPECT_GE(held, slices);
    EXPECT_LT(held, slices + 4096) << "more than its slices while loading";
    expect_same_losses(s.losses("one"), s.losses(out), out);
    expect_same_model(s.t.path / "one" / "model" / "model.safetensors", s.t.path / out / "model" / "model.safetensors",
                      out);
  }
  // 4 ranks' checkpoint, resumed on 2: the one process's later steps and model
  const fs::path ck = s.t.path / "z3-4" / "checkpoint-2";
  const CliRun two =
      s.sft(2, "z3-2-resumed",
            "--set zero_stage=3 --set gradient_accumulation_steps=2 --set resume_from_checkpoint=" + ck.string());
  ASSERT_EQ(two.code, 0) << two.err;
  auto later = s.losses("one");
  later.erase(1), later.erase(2);
  expect_same_losses(later, s.losses("z3-2-resumed"), "2 ZeRO-3 ranks from a 4-rank checkpoint");
  expect_same_model(s.t.path / "one" / "model" / "model.safetensors",
                    s.t.path / "z3-2-resumed" / "model" / "model.safetensors", "resumed on 2");
}

// ZeRO-3 over a frozen base: each rank keeps only its slices of the base (bf16/fp32 values, NF4 or FP8 codes with
// their scales, gathered in that format a layer at a time beside the adapters), so a rank holds about 1/world of
// it, and 2 and 4 ranks train the one process's trajectory and save its adapter (under the fp8-hybrid recipe too).
// `bench --plan-only` plans the slices the run holds. (Without the frozen gathers a rank would compute with the
// parameters unbound: no run.)
TEST(DataParallel, Zero3ShardsTheFrozenBase) {
  DpSetup s;
  const std::regex held("ZeRO-3 per rank: frozen base (\\d+) of its (\\d+) B held");
  const fs::path adapter = fs::path("adapter") / "adapter_model.safetensors";
  std::map<std::string, std::map<int64_t, double>> one_process;
  for (const auto& [base, sets, bench] :
       {std::tuple{"dense", std::string(), std::string()},
        std::tuple{"nf4", std::string(" --set qlora_nf4=true"), std::string(" --qlora nf4")},
        std::tuple{"fp8", std::string(" --set qlora_fp8=true"), std::string(" --qlora fp8")},
        // (the recipe casts each frozen projection once, from its gathered layer, and keeps that FP8 copy)
        std::tuple{"recipe", std::string(" --set recipe=fp8-hybrid"), std::string(" --recipe fp8-hybrid")}}) {
    SCOPED_TRACE(base);
    const std::string kind = kLora + sets, one = std::string(base) + "-1";
    const CliRun r1 = s.sft(0, one, kind + " --set gradient_accumulation_steps=4");
    ASSERT_EQ(r1.code, 0) << r1.err;
    one_process[base] = s.losses(one);
    for (int ranks : {2, 4}) {
      const std::string out = std::string(base) + "-z3-" + std::to_string(ranks);
      const CliRun r = s.sft(
          ranks, out, kind + " --set zero_stage=3 --set gradient_accumulation_steps=" + std::to_string(4 / ranks));
      ASSERT_EQ(r.code, 0) << r.err;
      const bool recipe = std::string(base) == "recipe";  // (FP8 scaling: as Fp8RanksScaleAsOneProcess allows)
      expect_same_losses(one_process[base], s.losses(out), out, recipe ? 3 : INT64_MAX, 1e-4);
      expect_same_model(s.t.path / one / adapter, s.t.path / out / adapter, out, recipe ? 1e-3 : 1e-5);
      std::smatch m;
      ASSERT_TRUE(std::regex_search(r.err, m, held)) << r.err;
      const int64_t mine = std::stoll(m[1]), whole = std::stoll(m[2]);
      EXPECT_GE(mine * ranks, whole);
      // (each of the 4 groups' slices rounded up to 256 bytes)
      EXPECT_LE(mine * ranks, whole + 4 * ranks * 256) << "more than its slices";
      EXPECT_LT(mine, whole / ranks + 4 * 256);
      if (ranks == 2) {  // what bench --plan-only plans for rank 0 is what the run held
        const CliRun p = run("bench --plan-only --device cpu --model " + (s.t.path / "model").string() +
                                 " --batch-size 2 --seq-len 48 --lora-rank 4 --gpus 2 --data-parallel 3" + bench,
                             s.t);
        ASSERT_EQ(p.code, 0) << p.err;
        EXPECT_EQ(nlohmann::json::parse(p.out)["data_parallel"]["frozen_bytes"].get<int64_t>(), mine);
      }
    }
  }
  // `gpus: 2` workers over TCP gather the NF4 base's bytes too
  const CliRun tcp = s.sft(0, "nf4-tcp",
                           kLora +
                               " --set qlora_nf4=true --gpus 2 --set zero_stage=3 "
                               "--set gradient_accumulation_steps=2");
  ASSERT_EQ(tcp.code, 0) << tcp.err;
  EXPECT_TRUE(std::regex_search(tcp.err, held)) << tcp.err;
  expect_same_losses(one_process["nf4"], s.losses("nf4-tcp"), "nf4 over TCP workers");
  EXPECT_NE(one_process["nf4"], one_process["dense"]) << "the NF4 base is not the dense one";
  EXPECT_NE(one_process["fp8"], one_process["dense"]) << "the FP8 base is not the dense one";
  EXPECT_NE(one_process["recipe"], one_process["dense"]) << "the recipe's FP8 GEMMs are not bf16 ones";
}

// FP8 (delayed scaling) over ranks: each update's amax histories are max-reduced before the scales are made
// from them, so the ranks (each casting its own micro-batches) scale as one process casting all of them does:
// 2 and 4 ranks (MPI; TCP workers too) train its trajectory, and 4 ranks resume a 2-rank checkpoint's scaling
// state onto it (without the reduction each rank scales from its own amaxes only: update 2 on differs, and
// rank 0's saved state is not the other ranks'). Current scaling needs no reduction; it is run once on 2 ranks.
// Muon over several ranks with a ZeRO stage is one line naming it (the config reader lets zero_stage pass: one
// process trains unsharded, as Axolotl's FSDP examples ask on one GPU).
TEST(DataParallel, MuonOverShardedRanksIsOneLine) {
  DpSetup s;
  const CliRun r = s.sft(0, "muon", "--gpus 2 --set zero_stage=2 --set optimizer=muon --set max_steps=1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: optimizer: muon with zero_stage 2 is not built yet (Muon orthogonalises whole "
                       "matrices); use zero_stage: 0\n"),
            std::string::npos)
      << r.err;
  ASSERT_EQ(s.sft(0, "one", "--set zero_stage=2 --set optimizer=muon --set max_steps=1").code, 0);
}

// Steps 1-2 within 1e-6 and the scaling state after step 2 within 1e-6 per value: step 1's learning rate is 0
// (warmup), so step 2 is the same weights under delayed scales built from step 1's amaxes, which only the ranks'
// max-reduction makes equal to one process's (without it each rank's history holds its own micro-batches' maxima,
// far apart). (Not bitwise: the output gradients' amaxes differ by an ulp where a rank's loss scale is formed from
// another count of micro-batches.) Later steps within 1e-4: the ranks sum step 2's gradients in another order (fp32
// ulps in the masters), and an FP8 cast can turn an ulp into a flipped code (one process against the ranks differed
// by 9e-6 at step 4 with Debian's reference BLAS, where OpenBLAS happens to agree within 1e-6).
TEST(DataParallel, Fp8RanksScaleAsOneProcess) {
  DpSetup s;
  const std::string fp8 = "--set recipe=fp8-hybrid --set fp8_amax_history=4 --set max_steps=4 --set save_steps=2 ";
  ASSERT_EQ(s.sft(0, "one", fp8 + "--set gradient_accumulation_steps=4").code, 0);
  const auto want = s.losses("one");
  ASSERT_EQ(want.size(), 4u);
  const auto scaling_state = [&](const std::string& out) {
    const SafetensorsFile f(s.t.path / out / "checkpoint-2" / "fp8_state.safetensors");
    const TensorEntry& e = f.entries().at("fp8_state");
    std::vector<float> v(size_t(shape_numel(e.shape)));
    read_as_f32(e, e.shape, v.data(), "fp8_state");
    return v;
  };
  const auto same_state = [](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (std::abs(a[i] - b[i]) > 1e-6 * std::abs(a[i])) return false;
    return true;
  };
  const std::vector<float> want_state = scaling_state("one");
  ASSERT_FALSE(want_state.empty());
  for (const auto& [ranks, zero] : {std::pair{2, 0}, std::pair{2, 3}, std::pair{4, 2}}) {
    const std::string out = "r" + std::to_string(ranks) + "-z" + std::to_string(zero);
    const CliRun r = s.sft(ranks, out,
                           fp8 + "--set gradient_accumulation_steps=" + std::to_string(4 / ranks) +
                               " --set zero_stage=" + std::to_string(zero));
    ASSERT_EQ(r.code, 0) << out << "\n" << r.err;
    EXPECT_NE(r.err.find("recipe fp8-hybrid"), std::string::npos) << r.err;
    expect_same_losses(want, s.losses(out), "fp8, " + out, 3, 1e-4);
    EXPECT_TRUE(same_state(scaling_state(out), want_state)) << "fp8, " << out << ": the scaling state after step 2";
  }
  const CliRun tcp = s.sft(0, "tcp", fp8 + "--gpus 2 --set gradient_accumulation_steps=2 --set zero_stage=2");
  ASSERT_EQ(tcp.code, 0) << tcp.err;
  expect_same_losses(want, s.losses("tcp"), "fp8, 2 workers over TCP", 3, 1e-4);
  EXPECT_TRUE(same_state(scaling_state("tcp"), want_state))
      << "fp8, 2 workers over TCP: the scaling state after step 2";
  const fs::path ck = s.t.path / "r2-z0" / "checkpoint-2";
  ASSERT_TRUE(fs::exists(ck / "fp8_state.safetensors"));
  const CliRun four =
      s.sft(4, "four", fp8 + "--set gradient_accumulation_steps=1 --set resume_from_checkpoint=" + ck.string());
  ASSERT_EQ(four.code, 0) << four.err;
  auto later = want;
  later.erase(1), later.erase(2);
  expect_same_losses(later, s.losses("four"), "fp8: 4 ranks from a 2-rank checkpoint", 3, 1e-4);
  const std::string current = "--set recipe=fp8-hybrid --set fp8_scaling=current --set max_steps=4 ";
  ASSERT_EQ(s.sft(0, "cur-one", current + "--set gradient_accumulation_steps=2").code, 0);
  ASSERT_EQ(s.sft(2, "cur-two", current + "--set gradient_accumulation_steps=1").code, 0);
  expect_same_losses(s.losses("cur-one"), s.losses("cur-two"), "fp8 current scaling, 2 ranks");
}

// Ctrl-C at the terminal (SIGINT to the launcher's process group) or a SIGTERM to the launcher alone (which
// passes it on) during a `gpus: 2` run: the ranks agree on the step to stop at, write one checkpoint (each its
// optimizer shard), and every process exits 130; resuming finishes the model the uninterrupted run saves.
TEST(DataParallel, StoppingTheLauncherCheckpointsEveryRankAndResumes) {
  DpSetup s;
  const std::string run = "--gpus 2 --set zero_stage=2 --set gradient_accumulation_steps=1 --set max_steps=150 ";
  ASSERT_EQ(s.sft(0, "ref", run).code, 0);
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string out = sig == SIGINT ? "int" : "term";
    SCOPED_TRACE(out);
    const fs::path log = s.t.path / (out + ".log"), dir = s.t.path / out;
    const pid_t pid = spawn_launcher(s, out, run, log);
    bool started = false;
    for (int i = 0; i < 6000 && !started; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      started = read_bytes(dir / "metrics.jsonl").find("\"loss\"") != std::string::npos;
    }
    ASSERT_TRUE(started) << read_bytes(log);
    ASSERT_EQ(kill(sig == SIGINT ? -pid : pid, sig), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << read_bytes(log);
    EXPECT_EQ(WEXITSTATUS(status), 130) << read_bytes(log);
    EXPECT_EQ(kill(-pid, 0), -1) << "a worker outlived the launcher";
    std::vector<fs::path> ckpts;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().starts_with("checkpoint-")) ckpts.push_back(e.path());
    ASSERT_EQ(ckpts.size(), 1u) << read_bytes(log);
    EXPECT_TRUE(fs::exists(ckpts[0] / "optimizer-shard-0-of-2.safetensors"));
    EXPECT_TRUE(fs::exists(ckpts[0] / "optimizer-shard-1-of-2.safetensors"));
    EXPECT_FALSE(fs::exists(dir / "model")) << "stopped before the end";
    const CliRun again = s.sft(0, out, run + "--set resume_from_checkpoint=true");
    ASSERT_EQ(again.code, 0) << again.err;
    EXPECT_EQ(read_bytes(dir / "model" / "model.safetensors"),
              read_bytes(s.t.path / "ref" / "model" / "model.safetensors"));
  }
}

TEST(DataParallel, ARankThatDiesOrRaisesEndsTheJobNamingIt) {
  DpSetup s;
  const auto t0 = std::chrono::steady_clock::now();
  ::setenv("SOLTRAIN_TEST_RANK_FAULT", "1:1:kill", 1);
  const CliRun killed = s.sft(2, "killed", "--set gradient_accumulation_steps=1 --set zero_stage=1");
  const CliRun killed_tcp = s.sft(0, "killed-tcp", "--set gradient_accumulation_steps=1 --gpus 3");
  ::setenv("SOLTRAIN_TEST_RANK_FAULT", "1:1:raise", 1);
  const CliRun raised = s.sft(0, "raised", "--set gradient_accumulation_steps=1 --gpus 2");
  ::unsetenv("SOLTRAIN_TEST_RANK_FAULT");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  EXPECT_NE(killed.code, 0);
  EXPECT_NE(killed.err.find("rank 1"), std::string::npos) << killed.err;
  EXPECT_NE(killed_tcp.code, 0);
  EXPECT_NE(killed_tcp.err.find("error: rank 1 was killed by signal 9"), std::string::npos) << killed_tcp.err;
  EXPECT_NE(killed_tcp.err.find("rank 0: error: rank 1 stopped"), std::string::npos) << killed_tcp.err;
  EXPECT_NE(raised.code, 0);
  EXPECT_NE(raised.err.find("rank 1: internal error (please report): injected fault after step 1"), std::string::npos)
      << raised.err;
  EXPECT_NE(raised.err.find("rank 0: error: rank 1 stopped"), std::string::npos) << raised.err;
  EXPECT_FALSE(fs::exists(s.t.path / "raised" / "model"));
}

// The ranks and their launcher share one stderr pipe: each error line must arrive whole, never interleaved with
// another process's (CI once read "error: rank rank 2: 1 was killed by signal error: 9rank 1 stopped").
TEST(DataParallel, ErrorLinesOfConcurrentProcessesArriveWhole) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int writers = 8, lines = 200;
  std::vector<pid_t> pids;
  for (int w = 0; w < writers; ++w) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      ::dup2(fds[1], STDERR_FILENO);
      set_error_prefix(cat("rank ", w, ": "));
      for (int i = 0; i < lines; ++i)
        print_error_line(cat("error: line ", i, " of writer ", w, std::string(size_t(100 + 37 * w), 'x')));
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  ::close(fds[1]);
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) all.append(buf, size_t(n));
  ::close(fds[0]);
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  const std::regex whole("rank (\\d+): error: line (\\d+) of writer (\\d+)(x+)");
  std::vector<int> seen(writers, 0);
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, whole)) << "a torn line: " << line.substr(0, 200);
    const int w = std::stoi(m[1]);
    ASSERT_EQ(std::stoi(m[3]), w);
    ASSERT_EQ(m[4].length(), 100 + 37 * w);
    EXPECT_EQ(std::stoi(m[2]), seen[size_t(w)]++) << "lines of one writer in order";
  }
  for (int w = 0; w < writers; ++w) EXPECT_EQ(seen[size_t(w)], lines) << "writer " << w;
}

TEST(DataParallel, BadLaunchInputIsOneLineAndExit2) {
  DpSetup s;
  auto one_line = [](const CliRun& r, const std::string& want) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  };
  one_line(s.sft(0, "z5", "--set zero_stage=5"), "zero_stage");
  one_line(s.sft(0, "z4", "--set zero_stage=4"), "zero_stage");
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  one_line(s.sft(0, "env", ""), "RANK is set (a torchrun-style launch) but MASTER_ADDR is not");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  one_line(s.sft(0, "cuda", "--set device=cuda --gpus 64"),
           visible_gpus() == 0 ? "but no CUDA GPU is visible: use device: cpu" : "gpus: 64 but this machine shows ");
  // One process, no launcher: the GPU it would need is not there (a CPU build says it has no CUDA).
  if (visible_gpus() == 0) {
#ifdef SOLTRAIN_CUDA
    one_line(s.sft(0, "cuda1", "--set device=cuda"), "no CUDA GPU is visible");
#else
    one_line(s.sft(0, "cuda1", "--set device=cuda"), "has no CUDA backend");
#endif
  }
}

}  // namespace
}  // namespace soltrain::test
