// The config's key table (cli/config_schema.h) is the one place keys are described: the README's key reference
// is its Markdown (this test fails when the README's copy drifts: regenerate it with `soltrain config-keys`), no
// name is both a schema key and a peer key, and each documented default is what a config without the key gets.
#include <fstream>
#include <set>
#include <sstream>

#include "cli/config.h"
#include "cli/config_schema.h"
#include "cli/peer_keys.h"
#include "test_util.h"

namespace soltrain {
namespace {

std::string readme() {
  std::ifstream in(std::filesystem::path(SOLTRAIN_FIXTURES) / ".." / ".." / "README.md");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ConfigSchema, ReadmeKeyReferenceIsTheTable) {
  const std::string text = readme();
  const std::string begin = "<!-- config-keys:begin -->\n", end = "<!-- config-keys:end -->";
  const size_t a = text.find(begin), b = text.find(end);
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  EXPECT_EQ(text.substr(a + begin.size(), b - a - begin.size()), config_keys_markdown())
      << "README.md's key reference differs from the key table: replace it with `soltrain config-keys`";
}

TEST(ConfigSchema, NamesAreUniqueAndNoneIsAlsoAPeerKey) {
  std::set<std::string> seen;
  for (const std::string& n : config_key_names()) EXPECT_TRUE(seen.insert(n).second) << n << " is listed twice";
  for (const std::string& p : peer_key_names()) EXPECT_FALSE(seen.count(p)) << p << " is a schema key and a peer key";
  for (const KeySpec& k : config_keys()) {
    EXPECT_FALSE(k.doc.empty()) << k.name;
    EXPECT_FALSE(k.expected.empty()) << k.name;
    EXPECT_FALSE(k.section.empty()) << k.name;
  }
}

// What the table says a key defaults to is what a config without it reads (numbers as the table prints them).
TEST(ConfigSchema, DocumentedDefaultsAreTheReadersDefaults) {
  test::TempDir t;
  const TrainConfig c = parse_train_config("model: m\noutput_dir: o\ndatasets: [d.jsonl]\n",
                                           (t.path / "c.yaml").string(), {}, TrainMode::kSft);
  const std::map<std::string, std::string> read = {
      {"sequence_len", cat(c.sequence_len)},
      {"learning_rate", cat(c.learning_rate)},
      {"lr_scheduler_type", to_string(c.lr_scheduler_type)},
      {"per_device_train_batch_size", cat(c.per_device_train_batch_size)},
      {"max_grad_norm", cat(c.max_grad_norm)},
      {"adamw_beta2", cat(c.adamw_beta2)},
      {"seed", cat(c.seed)},
      {"lora_rank", cat(c.lora.rank)},
      {"lora_alpha", cat(c.lora.alpha)},
      {"fp8_amax_history", cat(c.fp8.amax_history)},
      {"loss_watchdog_patience", cat(c.loss_watchdog_patience)},
      {"sample_packing", c.sample_packing ? "true" : "false"},
      {"logging_steps", cat(c.logging_steps)},
  };
  for (const auto& [name, value] : read) {
    const KeySpec* k = find_config_key(name);
    ASSERT_NE(k, nullptr) << name;
    EXPECT_EQ(k->default_value, value) << name;
  }
}

}  // namespace
}  // namespace soltrain
