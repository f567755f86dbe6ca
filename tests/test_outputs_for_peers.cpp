// What soltrain writes is what users' other tools expect (issue 29). Here: a model whose chat template lives in
// chat_template.jinja (transformers 4.45+ saves it there) keeps it through a full fine-tune, a merge and a hub
// download, so `generate --chat` (and vLLM) find it on the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "fake_hub.h"
#include "fault_test_util.h"
#include "hub/hub_resolve.h"

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
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: w\nreport_to: wandb\n"), r.t, 30),
                 "report_to: \"wandb\": reporting to it is not built yet");
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: w2\nwandb_project: my-run\n"), r.t, 30),
                 "wandb_project: sending metrics to wandb is not built yet");
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

}  // namespace
}  // namespace soltrain::test
