// What soltrain writes is what users' other tools expect (issue 29). Here: a model whose chat template lives in
// chat_template.jinja (transformers 4.45+ saves it there) keeps it through a full fine-tune, a merge and a hub
// download, so `generate --chat` (and vLLM) find it on the output; checkpoints in HF Trainer's layout (an older
// soltrain layout still resumes); Axolotl's commands (train, preprocess --debug, merge-lora). What transformers
// and PEFT themselves make of the outputs is python/tests/test_outputs.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/format.h"
#include "data/batch_file.h"
#include "fake_hub.h"
#include "fault_test_util.h"
#include "hub/hub_resolve.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

// Moves the model's chat template from tokenizer_config.json into chat_template.jinja.
std::string template_to_jinja_file(const fs::path& model) {
  auto cfg = nlohmann::json::parse(read_text(model / "tokenizer_config.json"));
  const std::string tmpl = cfg.at("chat_template").get<std::string>();
  cfg.erase("chat_template");
  write_text(model / "tokenizer_config.json", cfg.dump(2));
  write_text(model / "chat_template.jinja", tmpl);
  return tmpl;
}

TEST(OutputsForPeers, ChatTemplateJinjaIsCarriedThroughFullFineTuneAndMerge) {
  TinyRun r;
  const std::string tmpl = template_to_jinja_file(r.t.path / "model");
  r.inputs_changed();
  ASSERT_EQ(run_bounded("sft " + r.config("model: model\noutput_dir: full\n"), r.t, 60).code, 0);
  EXPECT_EQ(read_text(r.t.path / "full" / "model" / "chat_template.jinja"), tmpl);
  const CliRun chat = run_bounded(
      "generate --model " + (r.t.path / "full" / "model").string() + " --chat hello --max-new-tokens 2 --device cpu",
      r.t, 30);
  EXPECT_EQ(chat.code, 0) << chat.err;
  ASSERT_EQ(run_bounded("sft " + r.config("model: model\noutput_dir: lora\nlora: true\nlora_rank: 4\n"), r.t, 60).code,
            0);
  ASSERT_EQ(run_bounded("merge --model " + (r.t.path / "model").string() + " --adapter " +
                            (r.t.path / "lora" / "adapter").string() + " --out " + (r.t.path / "merged").string(),
                        r.t, 60)
                .code,
            0);
  EXPECT_EQ(read_text(r.t.path / "merged" / "chat_template.jinja"), tmpl);
}

TEST(OutputsForPeers, AHubModelsChatTemplateJinjaIsDownloaded) {
  FakeHub hub;
  FakeRepo repo = fixture_model_repo("fedcba9876543210fedcba9876543210fedcba98");
  repo.files["chat_template.jinja"] = "{{ messages[0]['content'] }}";
  hub.add("models/org/m", repo);
  HubEnv env(hub.endpoint());
  std::ostringstream log;
  const fs::path dir = resolve_hub_model(hub_client_from_env(log, false), "org/m", "main");
  EXPECT_EQ(read_text(dir / "chat_template.jinja"), "{{ messages[0]['content'] }}");
}

// Trackers are never silently ignored: use_tensorboard: false writes no TensorBoard; report_to: wandb and a
// wandb_project are refused (not built yet) in one line; empty wandb_* keys (Axolotl's examples) are fine.
TEST(OutputsForPeers, TrackersAreHonouredOrRefused) {
  TinyRun r;
  ASSERT_EQ(run_bounded("sft " + r.config("model: model\noutput_dir: notb\nuse_tensorboard: false\nwandb_project:\n"),
                        r.t, 60)
                .code,
            0);
  EXPECT_FALSE(fs::exists(r.t.path / "notb" / "tensorboard"));
  EXPECT_TRUE(fs::exists(r.t.path / "notb" / "metrics.jsonl"));
  ASSERT_EQ(run_bounded("sft " + r.config("model: model\noutput_dir: tb\nreport_to: [tensorboard]\n"), r.t, 60).code,
            0);
  EXPECT_TRUE(fs::exists(r.t.path / "tb" / "tensorboard"));
  // wandb and mlflow go through their Python packages (python/tests/test_trackers.py): missing, the run stops
  // before training; a tracker soltrain does not feed is refused.
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: w\nreport_to: wandb\n"), r.t, 30,
                             "SOLTRAIN_PYTHON=/bin/false"),
                 "report_to: wandb: its Python package is not installed for /bin/false (pip install wandb)");
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: w2\nwandb_project: my-run\n"), r.t, 30,
                             "SOLTRAIN_PYTHON=/bin/false"),
                 "report_to: wandb: its Python package is not installed");
  EXPECT_FALSE(fs::exists(r.t.path / "w2" / "model"));
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: w3\nreport_to: comet_ml\n"), r.t, 30),
                 "report_to: \"comet_ml\": reporting to it is not built yet");
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: w4\ncomet_api_key: k\n"), r.t, 30),
                 "comet_api_key: sending metrics to comet is not built yet");
}

// The run says trainable / all parameters and the share, as PEFT's print_trainable_parameters does.
TEST(OutputsForPeers, TrainableAllAndShareOfParameters) {
  TinyRun r;
  const CliRun full = run_bounded("sft " + r.config("model: model\noutput_dir: f\n"), r.t, 60);
  const CliRun lora =
      run_bounded("sft " + r.config("model: model\noutput_dir: l\nlora: true\nlora_rank: 4\n"), r.t, 60);
  ASSERT_EQ(full.code, 0) << full.err;
  ASSERT_EQ(lora.code, 0) << lora.err;
  const std::regex line(R"(trainable params: ([0-9,]+) \|\| all params: ([0-9,]+) \|\| trainable%: ([0-9.]+))");
  auto numbers = [&](const std::string& err) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(err, m, line)) << err;
    auto n = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), ','), s.end());
      return s.empty() ? 0.0 : std::stod(s);
    };
    return std::array<double, 3>{n(m[1]), n(m[2]), m.size() > 3 ? std::stod(m[3]) : 0.0};
  };
  const auto f = numbers(full.err), l = numbers(lora.err);
  EXPECT_EQ(f[0], f[1]);  // a full fine-tune trains every weight
  EXPECT_EQ(f[2], 100.0);
  EXPECT_EQ(l[1], f[1] + l[0]);  // LoRA: the base's weights (frozen) and the adapters
  EXPECT_NEAR(l[2], 100.0 * l[0] / l[1], 1e-4);
}

// `soltrain --version`: the version of pyproject.toml (the Python package's), exit 0.
TEST(OutputsForPeers, VersionFlag) {
  TempDir t;
  const std::string pyproject = read_text(fixtures() / ".." / ".." / "pyproject.toml");
  const size_t at = pyproject.find("\nversion = \"");
  ASSERT_NE(at, std::string::npos);
  const std::string version = pyproject.substr(at + 12, pyproject.find('"', at + 12) - at - 12);
  const CliRun r = run("--version", t);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "soltrain " + version + "\n");
}

// Axolotl's commands as its users type them: `train config.yaml` runs the config's job, `preprocess config.yaml
// --debug` prints the first documents as text(label, id) with -100 where nothing is trained (the prompt) and the
// id where it is (the answer), `merge-lora config.yaml` folds output_dir/adapter into output_dir/merged.
TEST(OutputsForPeers, AxolotlCommandsTrainPreprocessDebugAndMergeLora) {
  TinyRun r;
  const std::string cfg = r.config("model: model\noutput_dir: out\nadapter: lora\nlora_r: 4\n");
  const CliRun pre = run_bounded("preprocess " + cfg + " --debug --debug-num-examples 2", r.t, 60);
  ASSERT_EQ(pre.code, 0) << pre.err;
  EXPECT_NE(pre.out.find("--- document 0: "), std::string::npos) << pre.out;
  EXPECT_NE(pre.out.find("--- document 1: "), std::string::npos) << pre.out;
  EXPECT_EQ(pre.out.find("--- document 2: "), std::string::npos) << pre.out;
  EXPECT_EQ(pre.out.find("\x1b["), std::string::npos) << "colours when piped";
  // Every token is text(label, id): masked ones (-100) and trained ones (label == id) both occur.
  const std::regex token(R"(\((-100|[0-9]+), ([0-9]+)\))");
  int masked = 0, trained = 0;
  for (auto it = std::sregex_iterator(pre.out.begin(), pre.out.end(), token); it != std::sregex_iterator(); ++it) {
    if ((*it)[1] == "-100")
      ++masked;
    else
      trained += (*it)[1] == (*it)[2];
  }
  EXPECT_GT(masked, 0) << pre.out;
  EXPECT_GT(trained, 0) << pre.out;
  const CliRun train = run_bounded("train " + cfg, r.t, 60);
  ASSERT_EQ(train.code, 0) << train.err;
  EXPECT_TRUE(fs::exists(r.t.path / "out" / "adapter" / "adapter_model.safetensors"));
  write_text(r.t.path / "turns.txt", "hello\n/exit\n");  // inference: a chat with the trained adapter
  const CliRun chat = run_bounded("inference " + cfg + " --max-new-tokens 3 < turns.txt", r.t, 60);
  ASSERT_EQ(chat.code, 0) << chat.err;
  EXPECT_FALSE(chat.out.empty());
  const CliRun merge = run_bounded("merge-lora " + cfg, r.t, 60);
  ASSERT_EQ(merge.code, 0) << merge.err;
  EXPECT_TRUE(fs::exists(r.t.path / "out" / "merged" / "model.safetensors"));
  expect_refused(run_bounded("merge-lora " + cfg + " --lora-model-dir nowhere", r.t, 30),
                 "merge-lora: nowhere holds no adapter (adapter_config.json)");
  expect_refused(run_bounded("train", r.t, 30), "train: give a config file (soltrain train config.yaml)");
}

// A preference config's preview shows pairs: the chosen and the rejected answer of each.
TEST(OutputsForPeers, PreprocessDebugShowsPreferencePairs) {
  TinyRun r;
  std::ofstream(r.t.path / "pairs.jsonl") << R"({"prompt": "Reverse ab", "chosen": "ba", "rejected": "ab"})" << "\n"
                                          << R"({"prompt": "Reverse cd", "chosen": "dc", "rejected": "cd"})" << "\n";
  write_text(r.t.path / "p.yaml",
             "model: model\noutput_dir: out\nrl: dpo\nsequence_len: 64\n"
             "datasets: [{path: pairs.jsonl}]\n");
  const CliRun pre = run_bounded("preprocess p.yaml --debug --debug-num-examples 1", r.t, 60);
  ASSERT_EQ(pre.code, 0) << pre.err;
  EXPECT_NE(pre.out.find("--- pair 0 chosen: "), std::string::npos) << pre.out;
  EXPECT_NE(pre.out.find("--- pair 0 rejected: "), std::string::npos) << pre.out;
  EXPECT_EQ(pre.out.find("--- pair 1 "), std::string::npos) << pre.out;
  // --dump-batches for dpo: each micro-batch with its pairs (chosen, rejected documents of cu_seqlens).
  const CliRun dpo = run_bounded("dpo p.yaml --dump-batches dumps --set max_steps=2", r.t, 60);
  ASSERT_EQ(dpo.code, 0) << dpo.err;
  for (int step : {1, 2}) {
    const HostBatch b = load_batch_file(r.t.path / "dumps" / cat("step-", step, "-micro-0.safetensors"));
    const SafetensorsFile f(r.t.path / "dumps" / cat("step-", step, "-micro-0.safetensors"));
    const std::vector<int32_t> pairs = read_as_i32(f.at("pairs"), "pairs");
    ASSERT_EQ(pairs.size(), 2u);
    // The chosen and the rejected document start with the same (untrained) prompt and differ after it.
    auto doc = [&](int d) {
      return std::vector<int32_t>(b.input_ids.begin() + b.cu_seqlens[size_t(d)],
                                  b.input_ids.begin() + b.cu_seqlens[size_t(d) + 1]);
    };
    const std::vector<int32_t> chosen = doc(pairs[0]), rejected = doc(pairs[1]);
    size_t same = 0;
    while (same < std::min(chosen.size(), rejected.size()) && chosen[same] == rejected[same]) ++same;
    EXPECT_GT(same, 3u);
    EXPECT_NE(chosen, rejected);
    EXPECT_TRUE(f.find("ref_nll")) << "full fine-tuning's reference sums";
  }
}

// Checkpoints are HF Trainer's checkpoint-N (the model or adapter at the top, README.md, trainer_state.json with
// log_history); a checkpoint of the older layout (model/ or adapter/ inside, the resume state in
// trainer_state.json) resumes as before, to the same model.
TEST(OutputsForPeers, CheckpointsInHfLayoutAndTheOldLayoutStillResumes) {
  TinyRun r;
  const std::string base = "model: model\nlora: true\nlora_rank: 4\nmax_steps: 4\nsave_steps: 2\n";
  ASSERT_EQ(run_bounded("sft " + r.config(base + "output_dir: ref\n"), r.t, 60).code, 0);
  const fs::path ck = r.t.path / "ref" / "checkpoint-2";
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json", "README.md", "tokenizer.json",
                        "trainer_state.json", "soltrain_state.json", "optimizer.safetensors", "config.yaml"})
    EXPECT_TRUE(fs::exists(ck / f)) << f;
  EXPECT_EQ(nlohmann::json::parse(read_text(ck / "trainer_state.json"))["log_history"].size(), 2u);
  // The same checkpoint rewritten in the old layout, its checksum list dropped (the files moved).
  fs::copy(r.t.path / "ref", r.t.path / "old", fs::copy_options::recursive);
  const fs::path old = r.t.path / "old" / "checkpoint-2";
  fs::remove_all(r.t.path / "old" / "checkpoint-4");
  fs::remove_all(r.t.path / "old" / "adapter");
  fs::create_directories(old / "adapter");
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json"}) fs::rename(old / f, old / "adapter" / f);
  fs::rename(old / "soltrain_state.json", old / "trainer_state.json");
  fs::remove(old / "checksums.sha256");
  const CliRun resumed =
      run_bounded("sft " + r.config(base + "output_dir: old\nresume_from_checkpoint: true\n"), r.t, 60);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("checkpoint-2 at step 2"), std::string::npos) << resumed.err;
  EXPECT_EQ(read_text(r.t.path / "old" / "adapter" / "adapter_model.safetensors"),
            read_text(r.t.path / "ref" / "adapter" / "adapter_model.safetensors"));
}

// A full fine-tune is saved in its base's dtype (bf16 here): each weight the fp32 master rounded to nearest even.
TEST(OutputsForPeers, FullFineTuneOfABf16BaseIsSavedInBf16) {
  TinyRun r;
  auto cfg = nlohmann::json::parse(read_text(r.t.path / "model" / "config.json"));
  cfg["torch_dtype"] = "bfloat16";
  cfg.erase("dtype");
  write_text(r.t.path / "model" / "config.json", cfg.dump());
  r.inputs_changed();
  ASSERT_EQ(run_bounded("sft " + r.config("model: model\noutput_dir: o\nsave_steps: 1\n"), r.t, 60).code, 0);
  const SafetensorsFile saved(r.t.path / "o" / "model" / "model.safetensors");
  const SafetensorsFile masters(r.t.path / "o" / "checkpoint-1" / "model.safetensors");
  ASSERT_EQ(saved.entries().size(), masters.entries().size());
  for (const auto& [n, m] : masters.entries()) {
    const TensorEntry& b = saved.at(n);
    ASSERT_EQ(m.dtype, DType::F32) << n;
    ASSERT_EQ(b.dtype, DType::BF16) << n;
    const auto* mf = reinterpret_cast<const float*>(m.data);
    const auto* bh = reinterpret_cast<const uint16_t*>(b.data);
    for (int64_t i = 0; i < shape_numel(m.shape); ++i) ASSERT_EQ(bh[i], f32_to_bf16(mf[i])) << n << "[" << i << "]";
  }
  const auto out_cfg = nlohmann::json::parse(read_text(r.t.path / "o" / "model" / "config.json"));
  EXPECT_EQ(out_cfg["dtype"], "bfloat16");
  EXPECT_EQ(out_cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(model_dtype(r.t.path / "o" / "model"), DType::BF16);
  EXPECT_EQ(model_dtype(r.t.path / "o" / "checkpoint-1"), DType::F32);
}

// Sizes in the log as a person reads them: binary units, three significant digits, no exponents.
TEST(OutputsForPeers, SizesReadAtAGlance) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1000), "1000 B");
  EXPECT_EQ(format_bytes(1024), "1 KiB");
  EXPECT_EQ(format_bytes(76501), "74.7 KiB");
  EXPECT_EQ(format_bytes(43.5 * (1 << 20)), "43.5 MiB");
  EXPECT_EQ(format_bytes(8.0 * (1 << 30)), "8 GiB");
  EXPECT_EQ(format_bytes(1.2345 * (1 << 30)), "1.23 GiB");
  EXPECT_EQ(format_bytes(139.0 * (1 << 30)), "139 GiB");
  EXPECT_EQ(format_bytes(1023.9 * (1 << 20)), "1 GiB");
  TinyRun r;
  const CliRun run = run_bounded("sft " + r.config("model: model\noutput_dir: o\n"), r.t, 60);
  ASSERT_EQ(run.code, 0) << run.err;
  // The plan is a short table (the top buffers; every one under --verbose).
  const size_t at = run.err.find("sft: memory plan on cpu, ");
  ASSERT_NE(at, std::string::npos) << run.err;
  const std::string plan = run.err.substr(at, run.err.find("\nsft: host memory", at) - at);
  EXPECT_EQ(plan.find("e-0"), std::string::npos) << plan;
  EXPECT_EQ(plan.find(" 0 GiB"), std::string::npos) << plan;
  EXPECT_TRUE(std::regex_search(plan, std::regex(R"(\n  weights +[0-9.]+ KiB\n  gradients +[0-9.]+ KiB\n)"))) << plan;
  const CliRun verbose = run_bounded("sft " + r.config("model: model\noutput_dir: v\n") + " --verbose", r.t, 60);
  ASSERT_EQ(verbose.code, 0) << verbose.err;
  auto largest = [](const std::string& err) {
    const size_t l = err.find("\n  largest: ");
    return std::count(err.begin() + long(l), err.begin() + long(err.find('\n', l + 1)), ',');
  };
  EXPECT_EQ(largest(run.err), 3) << run.err;  // the top four
  EXPECT_GT(largest(verbose.err), 3) << verbose.err;
}

// push_to_hub through the commit API as huggingface_hub speaks it (the fake hub's write side): a full fine-tune
// and an adapter reach the hub (the LFS weights byte for byte, the repository private when asked, every
// checkpoint in its folder with all_checkpoints), a second run trains from the pushed model by its hub id, and a
// run without a token stops before training.
TEST(OutputsForPeers, PushToHubThenASecondRunTrainsFromIt) {
  FakeHub hub;
  TinyRun r;
  HubEnv env(hub.endpoint());
  ScopedEnv token("HF_TOKEN", hub.token.c_str());
  const CliRun full = run_bounded(
      "sft " + r.config("model: model\noutput_dir: full\nhub_model_id: me/tiny-full\nmax_steps: 2\nsave_steps: 1\n"),
      r.t, 60);
  ASSERT_EQ(full.code, 0) << full.err;
  EXPECT_NE(full.err.find("push_to_hub: model -> " + hub.endpoint() + "/me/tiny-full (commit "), std::string::npos)
      << full.err;
  auto files = hub.files_of("models/me/tiny-full");
  for (const char* f : {"config.json", "model.safetensors", "README.md", "tokenizer.json", "tokenizer_config.json"})
    ASSERT_TRUE(files.count(f)) << f;
  EXPECT_EQ(files.at("model.safetensors"), read_text(r.t.path / "full" / "model" / "model.safetensors"));
  EXPECT_FALSE(files.count("optimizer.safetensors")) << "a checkpoint's optimizer pushed as the model";
  EXPECT_EQ(hub.commits().back(), "end of training (2 steps)");
  // A second run finds it by its hub id, downloads and trains.
  const CliRun again = run_bounded("sft " + r.config("model: me/tiny-full\noutput_dir: again\n"), r.t, 60);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(fs::exists(r.t.path / "again" / "model" / "model.safetensors"));
  // An adapter, private, each checkpoint in its own folder.
  const CliRun lora = run_bounded(
      "sft " + r.config("model: model\noutput_dir: lora\nlora: true\nlora_rank: 4\nmax_steps: 2\nsave_steps: 1\n"
                        "push_to_hub: true\nhub_model_id: me/tiny-lora\nhub_private_repo: true\n"
                        "hub_strategy: all_checkpoints\n"),
      r.t, 60);
  ASSERT_EQ(lora.code, 0) << lora.err;
  files = hub.files_of("models/me/tiny-lora");
  EXPECT_EQ(files.at("adapter_model.safetensors"),
            read_text(r.t.path / "lora" / "adapter" / "adapter_model.safetensors"));
  EXPECT_TRUE(files.count("adapter_config.json") && files.count("README.md"));
  EXPECT_TRUE(files.count("checkpoint-2/adapter_model.safetensors"));
  EXPECT_TRUE(files.count("checkpoint-2/optimizer.safetensors"));
  {
    ScopedEnv no_token("HF_TOKEN", nullptr);  // private: not even listed without the token
    const CliRun anon = run_bounded("sft " + r.config("model: me/tiny-lora\noutput_dir: anon\n"), r.t, 30);
    EXPECT_EQ(anon.code, 2);
    expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: nope\nhub_model_id: me/x\n"), r.t, 30),
                   "push_to_hub: no Hugging Face token: set HF_TOKEN");
    EXPECT_FALSE(fs::exists(r.t.path / "nope" / "model")) << "trained before finding it cannot push";
  }
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: x\npush_to_hub: true\n"), r.t, 30),
                 "push_to_hub needs hub_model_id");
}

// The README says how to install and run before anything else: its first section is the two commands'.
TEST(OutputsForPeers, ReadmeOpensWithInstallAndRun) {
  const std::string readme = read_text(fixtures() / ".." / ".." / "README.md");
  const size_t first = readme.find("\n## ");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(readme.substr(first + 4, readme.find('\n', first + 4) - first - 4), "Install and run (Debian 12)");
  const size_t next = readme.find("\n## ", first + 4);
  const std::string section = readme.substr(first, next - first);
  EXPECT_NE(section.find("    scripts/demo.sh\n"), std::string::npos);
  EXPECT_NE(section.find("    scripts/test.sh\n"), std::string::npos);
  EXPECT_EQ(readme.substr(0, first).find("tokens/s"), std::string::npos) << "figures before the install";
}

}  // namespace
}  // namespace soltrain::test
