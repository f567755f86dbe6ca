// The production loop itself against a reference no one here wrote: `soltrain sft` (packing, gradient
// accumulation, clipping, AdamW, cosine schedule with warmup) for six updates on the demo model, against
// transformers + torch trained on the same micro-batches (tests/tools/make_sft_trajectory_reference.py).
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "io/sha256.h"

namespace soltrain::test {
namespace {

TEST(SftTrajectory, SixUpdatesMatchTransformersOnTheSameBatches) {
  const auto fixture = fixtures() / "sft_trajectory";
  std::ifstream f(fixture / "expected.json");
  ASSERT_TRUE(f) << "missing " << (fixture / "expected.json").string();
  const auto want = nlohmann::json::parse(f);
  TempDir t;
  std::filesystem::copy_file(fixture / "config.yaml", t.path / "config.yaml");
  const CliRun setup =
      run("demo-setup --out " + (t.path / "data").string() + " --train 200 --validation 8 --seed 5", t);
  ASSERT_EQ(setup.code, 0) << setup.err;
  ASSERT_EQ(sha256_file(t.path / "data" / "model" / "model.safetensors"), want["model_sha256"].get<std::string>())
      << "demo-setup no longer makes the model the reference was made from: remake the reference";
  const CliRun sft = run("sft " + (t.path / "config.yaml").string(), t);
  ASSERT_EQ(sft.code, 0) << sft.err;
  std::ifstream metrics(t.path / "out" / "metrics.jsonl");
  std::vector<double> losses, norms;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"]), norms.push_back(j["grad_norm"]);
  }
  const auto ref_losses = want["losses"].get<std::vector<double>>();
  const auto ref_norms = want["grad_norms"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), ref_losses.size());
  ASSERT_EQ(norms.size(), ref_norms.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], ref_losses[i], 1e-5 * ref_losses[i]) << "update " << i + 1;
    EXPECT_NEAR(norms[i], ref_norms[i], 1e-4 * ref_norms[i]) << "update " << i + 1;
  }
  // It learns: the schedule and the update move the loss.
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace
}  // namespace soltrain::test
