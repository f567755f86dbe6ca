// Issue 13: hostile or absurd inputs (a template from a downloaded model, sizes in configs and flags) end in
// one `error:` line and exit 2, quickly, with the user's files unchanged and nothing half-written left.
#include <nlohmann/json.hpp>

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
    const auto model = snapshot(r.t.path / "model"), data = snapshot(r.t.path / "train.jsonl");
    expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: run\n"), r.t, 30), limit);
    EXPECT_EQ(leftovers(r.t.path), "");
    EXPECT_EQ(snapshot(r.t.path / "model"), model);
    EXPECT_EQ(snapshot(r.t.path / "train.jsonl"), data);
  }
}

}  // namespace
}  // namespace soltrain::test
