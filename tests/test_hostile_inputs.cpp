// Issue 13: hostile or absurd inputs (a template from a downloaded model, sizes in configs and flags) end in
// one `error:` line and exit 2, quickly, with the user's files unchanged and nothing half-written left.
#include <nlohmann/json.hpp>

#include "core/buffer.h"
#include "fault_test_util.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

void set_chat_template(const fs::path& model, const std::string& tmpl) {
  const fs::path p = model / "tokenizer_config.json";
  auto cfg = nlohmann::json::parse(read_text(p));
  cfg["chat_template"] = tmpl;
  write_text(p, cfg.dump());
}

TEST(HostileInputs, ARecursiveTemplateIsATemplateErrorAndLeavesNothingBehind) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "macro call depth"},
      {"{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}", "total steps"},
      {"{{ 'x' * 100000000000 }}", "output size"},
  };
  for (const auto& [tmpl, limit] : cases) {
    TinyRun r;
    set_chat_template(r.t.path / "model", tmpl);
    r.inputs_changed();
    const auto model = snapshot(r.t.path / "model"), data = snapshot(r.t.path / "train.jsonl");
    expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: run\n"), r.t, 30), limit);
    EXPECT_EQ(leftovers(r.t.path), "");
    EXPECT_EQ(snapshot(r.t.path / "model"), model);
    EXPECT_EQ(snapshot(r.t.path / "train.jsonl"), data);
  }
}

}  // namespace
}  // namespace soltrain::test

namespace soltrain::test {
namespace {

// A copy of a fixture model with config.json fields replaced.
fs::path model_with(const TempDir& t, const nlohmann::json& changes) {
  const fs::path dir = t.path / "m";
  fs::copy(fixtures() / "models" / "qwen3-tiny", dir);
  auto cfg = nlohmann::json::parse(read_text(dir / "config.json"));
  cfg.update(changes);
  write_text(dir / "config.json", cfg.dump(2));
  return dir;
}

std::string dump_args(const fs::path& model, const TempDir& t) {
  return "dump --model " + model.string() + " --batch " + (fixtures() / "models" / "qwen3-tiny").string() +
         "/batch.safetensors --out " + (t.path / "o.safetensors").string();
}

TEST(HostileInputs, AConfigClaimingAMillionLayersFailsBeforeAllocating) {
  TempDir t;
  const fs::path m = model_with(t, {{"num_hidden_layers", 1000000}});
  const auto before = snapshot(m);
  expect_refused(run_bounded(dump_args(m, t), t, 10), "num_hidden_layers is 1000000 but the checkpoint has no tensor");
  EXPECT_EQ(snapshot(m), before);
  EXPECT_FALSE(fs::exists(t.path / "o.safetensors"));
}

TEST(HostileInputs, ConfigSizesPastAnIntAreNamedNotWrapped) {
  TempDir t;
  expect_refused(run_bounded(dump_args(model_with(t, {{"hidden_size", 1000000000000}}), t), t, 10),
                 "\"hidden_size\" must be an integer from 0 to 2147483647, got 1000000000000");
  TempDir u;
  expect_refused(run_bounded(dump_args(model_with(u, {{"intermediate_size", 1e12}}), u), u, 10),
                 "\"intermediate_size\" must be an integer");
  // wide enough to pass the int checks, but the checkpoint's tensors cannot hold it
  TempDir v;
  expect_refused(run_bounded(dump_args(model_with(v, {{"intermediate_size", 2000000000}}), v), v, 10),
                 "the checkpoint's tensors hold");
}

TEST(HostileInputs, HostAllocationFailureIsAUserErrorNamingTheSize) {
  try {
    Buffer::host(size_t(1) << 62);
    ADD_FAILURE() << "allocated 4 EiB";
  } catch (const UserError& e) {
    // Refused by the host memory check (core/host_memory.h) before malloc is asked, with the figures.
    EXPECT_NE(std::string(e.what()).find("out of host memory: the next host buffer needs 4294967296.00 GiB, "),
              std::string::npos)
        << e.what();
  }
}

TEST(HostileInputs, SftSizesAreCheckedAgainstTheModel) {
  TinyRun r;
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: run\nsequence_len: 3000000000\n"), r.t),
                 "sequence_len: \"3000000000\" is not valid");
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: run\nsequence_len: 100000\n"), r.t),
                 "sequence_len 100000 is longer than the model's max_position_embeddings (4096");
  expect_refused(run_bounded("sft " + r.config("model: nowhere\noutput_dir: run\n"), r.t),
                 "model: " + (r.t.path / "nowhere").string() + ": no such folder");
  EXPECT_FALSE(fs::exists(r.t.path / "run"));
}

TEST(HostileInputs, GenerateChecksMaxNewTokensAndAnEmptyPrompt) {
  TinyRun r;
  const std::string m = "generate --model " + (r.t.path / "model").string();
  expect_refused(run_bounded(m + " --prompt hi --max-new-tokens 99999999", r.t, 10),
                 "--max-new-tokens 99999999: the prompt's 2 tokens plus the new ones exceed the model's "
                 "max_position_embeddings (4096");
  expect_refused(run_bounded(m + " --prompt ''", r.t, 10), "--prompt is empty");
  expect_refused(run_bounded(m + " --chat ''", r.t, 10), "--chat is empty");
  expect_refused(run_bounded("generate --model " + (r.t.path / "nowhere").string() + " --prompt hi", r.t, 10),
                 "nowhere: no such folder");
}

}  // namespace
}  // namespace soltrain::test

namespace soltrain::test {
namespace {

TEST(HostileInputs, ADatasetRecordNestedDeepIsABadRecordNotACrash) {
  TinyRun r;
  write_text(r.t.path / "deep.jsonl", "{\"messages\": " + std::string(100000, '[') + std::string(100000, ']') + "}\n" +
                                          "{\"messages\": [{\"role\": \"user\", \"content\": 1e99999}]}\n");
  const std::string tok = "tokenize --tokenizer " + (r.t.path / "model").string() + " --data " +
                          (r.t.path / "deep.jsonl").string() + " --out " + (r.t.path / "sh").string();
  expect_refused(run_bounded(tok, r.t), "deep.jsonl:1: not valid JSON (nested more than 512 levels deep)");
  expect_refused(run_bounded(tok + " --bad-records skip", r.t), "no usable records in");
}

}  // namespace
}  // namespace soltrain::test
