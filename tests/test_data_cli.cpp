// `soltrain chat-template` against the transformers fixtures (text and ids), and `soltrain tokenize`
// end to end: shards written, reuse reported, a bad record is exit code 2 with file:line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>

#include "data_test_util.h"
#include "io/json_file.h"
#include "test_util.h"

namespace soltrain {
namespace {

struct CliResult {
  int code;
  std::string out, err;
};

CliResult run(const std::string& args, const test::TempDir& t, const std::string& stdin_file = "/dev/null") {
  const auto out = t.path / "stdout", err = t.path / "stderr";
  const std::string cmd =
      std::string(SOLTRAIN_BIN) + " " + args + " <" + stdin_file + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  auto read = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(out), read(err)};
}

void check_chat_fixture(const std::string& name) {
  test::TempDir t;
  const nlohmann::json cases = read_json_file(test::fixtures() / "tokenizer" / (name + "_chat.json"));
  std::string input;
  for (const auto& c : cases) {
    nlohmann::ordered_json line;  // every key but the expected outputs is a template variable
    const nlohmann::ordered_json entry = nlohmann::ordered_json::parse(c.dump());
    for (const auto& [k, v] : entry.items())
      if (k != "text" && k != "ids") line[k] = v;
    input += line.dump() + "\n";
  }
  test::write_text(t.path / "in.jsonl", input);
  const CliResult r =
      run("chat-template --tokenizer " + test::tokenizer_folder(name).string(), t, (t.path / "in.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string l;
  size_t i = 0;
  for (; std::getline(lines, l); ++i) {
    ASSERT_LT(i, cases.size());
    const nlohmann::json got = nlohmann::json::parse(l);
    EXPECT_EQ(got["text"], cases[i]["text"]) << name << " entry " << i;
    EXPECT_EQ(got["ids"], cases[i]["ids"]) << name << " entry " << i;
  }
  EXPECT_EQ(i, cases.size());
}

TEST(DataCli, ChatTemplateReproducesQwen3Fixtures) {
  check_chat_fixture("qwen3");
}
TEST(DataCli, ChatTemplateReproducesLlama3Fixtures) {
  check_chat_fixture("llama3");
}

TEST(DataCli, TokenizeWritesThenReusesAndBadRecordIsExit2) {
  test::TempDir t;
  test::write_text(t.path / "d.jsonl", R"({"instruction": "Say hi", "output": "hi"})"
                                       "\n");
  const std::string args = "tokenize --tokenizer " + test::tokenizer_folder("qwen3").string() + " --data " +
                           (t.path / "d.jsonl").string() + ":instruction --out " + (t.path / "out").string();
  CliResult r = run(args, t);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("records/s"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::exists(t.path / "out" / "shard-00000.tokens"));
  r = run(args, t);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("is up to date"), std::string::npos) << r.err;

  test::write_text(t.path / "d.jsonl", "{\"instruction\": \"Say hi\"}\n");
  r = run(args, t);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find((t.path / "d.jsonl").string() + ":1: missing field \"output\""), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  r = run("tokenize --tokenizer " + test::tokenizer_folder("qwen3").string() + " --data /nope.jsonl --out " +
              (t.path / "o2").string(),
          t);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nope.jsonl: dataset file not found"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace soltrain
