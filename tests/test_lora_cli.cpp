// `soltrain dump --adapter` and `soltrain merge` as users run them, against the PEFT fixture; bad adapters
// are one line and exit code 2, with no output left behind.
#include <sys/wait.h>

#include <fstream>

#include "io/json_file.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

struct CliResult {
  int code;
  std::string err;
};

CliResult soltrain(const std::string& args, const TempDir& t) {
  const auto err = t.path / "stderr";
  const std::string cmd = std::string(SOLTRAIN_BIN) + " " + args + " >/dev/null 2>" + err.string();
  const int status = std::system(cmd.c_str());
  std::ifstream f(err);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(std::istreambuf_iterator<char>(f), {})};
}

const std::string base = (fixtures() / "models" / "qwen3-tiny").string();
const std::string peft = (fixtures() / "peft" / "qwen3-tiny").string();

TEST(LoraCli, DumpWithAdapterMatchesPeft) {
  TempDir t;
  const auto out = t.path / "dump.safetensors";
  const CliResult r =
      soltrain("dump --model " + base + " --adapter " + peft + "/adapter --batch " + base +
                   "/batch.safetensors --out " + out.string() + " --save-adapter " + (t.path / "saved").string(),
               t);
  ASSERT_EQ(r.code, 0) << r.err;
  const SafetensorsFile ours(out), ref(peft + "/expected_lora.safetensors");
  EXPECT_EQ(ours.entries().size(), ref.entries().size());  // logits, loss and exactly the LoRA gradients
  for (const auto& [name, e] : ref.entries()) {
    ASSERT_TRUE(ours.find(name)) << name;
    const auto a = to_f32(ours.at(name)), b = to_f32(e);
    ASSERT_EQ(a.size(), b.size()) << name;
    EXPECT_LE(rel_err(a.data(), b.data(), a.size()), name == "logits" ? 1e-4 : 1e-3) << name;
  }
  // --save-adapter writes the same tensors back, bit for bit.
  const SafetensorsFile saved(t.path / "saved" / "adapter_model.safetensors"),
      orig(peft + "/adapter/adapter_model.safetensors");
  ASSERT_EQ(saved.entries().size(), orig.entries().size());
  for (const auto& [name, e] : orig.entries()) EXPECT_EQ(std::memcmp(saved.at(name).data, e.data, e.bytes), 0) << name;
}

TEST(LoraCli, MergeWritesTheMergedFolder) {
  TempDir t;
  const auto out = t.path / "merged";
  const CliResult r = soltrain("merge --model " + base + " --adapter " + peft + "/adapter --out " + out.string(), t);
  ASSERT_EQ(r.code, 0) << r.err;
  const SafetensorsFile ours(out / "model.safetensors"), ref(peft + "/merged/model.safetensors");
  EXPECT_EQ(ours.entries().size(), ref.entries().size());
  for (const auto& [name, e] : ref.entries()) {
    const auto a = to_f32(ours.at(name)), b = to_f32(e);
    EXPECT_LE(rel_err(a.data(), b.data(), a.size()), 1e-6) << name;
  }
  EXPECT_EQ(read_json_file(out / "config.json"), read_json_file(base + "/config.json"));
}

TEST(LoraCli, DoraAdapterIsOneLineExitCode2AndNothingWritten) {
  TempDir t;
  const auto dir = t.path / "dora";
  std::filesystem::copy(peft + "/adapter", dir);
  auto cfg = read_json_file(dir / "adapter_config.json");
  cfg["use_dora"] = true;
  std::filesystem::permissions(dir / "adapter_config.json", std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  std::ofstream(dir / "adapter_config.json") << cfg.dump(2);
  for (const std::string& args :
       {"merge --model " + base + " --adapter " + dir.string() + " --out " + (t.path / "out").string(),
        "dump --model " + base + " --adapter " + dir.string() + " --batch " + base + "/batch.safetensors --out " +
            (t.path / "out").string()}) {
    const CliResult r = soltrain(args, t);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("DoRA"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(std::filesystem::exists(t.path / "out"));
  }
}

}  // namespace
}  // namespace soltrain::test
