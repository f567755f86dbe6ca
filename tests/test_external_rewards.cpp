// GRPO rewards from an HTTP endpoint or a command (train/external_reward.h): the batch goes out as the JSON
// Python reward functions get (prompts, completions, completion_ids, columns), the scores come back per
// completion (null: none), next to built-in ones; every way an answer can be wrong is one line naming it.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data_test_util.h"
#include "fake_hub.h"
#include "test_util.h"
#include "train/external_reward.h"
#include "train/grpo_rewards.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

RewardRequest three_completions() {
  RewardRequest r;
  for (const char* p : {"2+2?", "3+3?", "4+4?"}) r.prompts.push_back(p);
  r.completions = {"4", "six", "an eight"};
  r.completion_ids = {{19}, {50, 51}, {1, 2, 3}};
  r.records = {{{"prompt", "2+2?"}, {"answer", "4"}},
               {{"prompt", "3+3?"}, {"answer", "6"}},
               {{"prompt", "4+4?"}, {"answer", "8"}}};
  return r;
}

GrpoSettings settings(std::vector<std::string> funcs, int timeout_s = 60) {
  GrpoSettings g;
  g.reward_funcs = std::move(funcs);
  g.reward_timeout = timeout_s;
  return g;
}

std::string error_of(const std::function<void()>& f) {
  return test::user_error_text(f);
}

// A command given the batch on stdin: its scores are the completions' lengths, plus 100 where the column says
// the answer is 6 (the columns reach it), and null for the third.
TEST(ExternalRewards, ACommandScoresTheBatchItReadsOnStdin) {
  test::TempDir t;
  test::write_text(
      t.path / "length.py",
      "import json, sys\n"
      "b = json.load(sys.stdin)\n"
      "assert b['completion_ids'][1] == [50, 51] and b['prompts'][0] == '2+2?'\n"
      "out = [len(c) + (100 if a == '6' else 0) for c, a in zip(b['completions'], b['columns']['answer'])]\n"
      "out[2] = None\n"
      "print(json.dumps(out))\n");
  RewardFunctions f(settings({"accuracy", "command:python3 " + (t.path / "length.py").string()}), {});
  EXPECT_EQ(f.names(), (std::vector<std::string>{"accuracy", "length"}));
  const auto s = f.score(three_completions());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0][0], 1.0);  // the built-in beside it
  EXPECT_EQ(s[1][0], 1.0);
  EXPECT_EQ(s[1][1], 103.0);
  EXPECT_TRUE(std::isnan(s[1][2]));
}

// An endpoint POSTed the same JSON: {"rewards": [...]} back; its name is the URL's last segment.
TEST(ExternalRewards, AnEndpointScoresThePostedBatch) {
  test::FakeHub hub;
  std::string got;
  hub.intercept_body = [&](int fd, const std::string& target, const std::string& body) {
    if (target != "/v1/score") return false;
    got = body;
    const auto b = nlohmann::json::parse(body);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& c : b["completions"]) out.push_back(double(c.get<std::string>().size()) / 10);
    const std::string j = nlohmann::json{{"rewards", out}}.dump();
    return test::FakeHub::send_raw(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                           std::to_string(j.size()) + "\r\nConnection: close\r\n\r\n" + j);
  };
  RewardFunctions f(settings({hub.endpoint() + "/v1/score"}), {});
  EXPECT_EQ(f.names(), std::vector<std::string>{"score"});
  const auto s = f.score(three_completions());
  EXPECT_EQ(s[0], (std::vector<double>{0.1, 0.3, 0.8}));
  const auto b = nlohmann::json::parse(got);
  EXPECT_EQ(b["columns"]["answer"], nlohmann::json::array({"4", "6", "8"}));
  EXPECT_FALSE(b.contains("functions"));
}

TEST(ExternalRewards, WrongAnswersAreOneLineNamingTheReward) {
  const RewardRequest r = three_completions();
  auto with = [&](const std::string& spec, int timeout_s = 60) {
    return error_of([&] {
      RewardFunctions f(settings({spec}, timeout_s), {});
      f.score(r);
    });
  };
  EXPECT_NE(with("command:echo '[1, 2]'").find("command:echo '[1, 2]' answered 2 values for 3 completions"),
            std::string::npos);
  EXPECT_NE(with("command:echo 'not json'").find("answered something that is not JSON: not json"), std::string::npos);
  EXPECT_NE(with("command:echo '[1, \"x\", 3]'").find("expected numbers or null"), std::string::npos);
  EXPECT_NE(with("command:echo '{\"score\": 1}'").find("expected a list of numbers"), std::string::npos);
  EXPECT_NE(with("command:exit 3").find("exited with code 3; its messages are above"), std::string::npos);
  EXPECT_NE(with("command:no-such-program-here").find("exited with code 127 (command not found?)"), std::string::npos);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(with("command:sleep 30", 1).find("did not answer within 1 s (reward_timeout)"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(with("command:  ").find("names no command"), std::string::npos);
  // A command that answers without reading its input (a large batch) is not a deadlock.
  RewardRequest big = r;
  big.completions[0] = std::string(4 << 20, 'x');
  RewardFunctions quick(settings({"command:echo '[1, 2, 3]'"}), {});
  EXPECT_EQ(quick.score(big)[0], (std::vector<double>{1, 2, 3}));

  test::FakeHub hub;
  hub.intercept_body = [&](int fd, const std::string& target, const std::string&) {
    if (target == "/slow") std::this_thread::sleep_for(std::chrono::seconds(3));
    return test::FakeHub::send_raw(fd,
                                   "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n"
                                   "Connection: close\r\n\r\nboom");
  };
  EXPECT_NE(with(hub.endpoint() + "/score").find("/score answered HTTP 500: boom"), std::string::npos);
  EXPECT_NE(with(hub.endpoint() + "/slow", 1).find("reward_timeout 1 s"), std::string::npos);
  const std::string secret = with("http://user:s3cret@127.0.0.1:1/score");
  EXPECT_EQ(secret.find("s3cret"), std::string::npos) << secret;
}

TEST(ExternalRewards, NamesForTheMetrics) {
  EXPECT_EQ(external_reward_name("command:python3 rewards/length.py"), "length");
  EXPECT_EQ(external_reward_name("command:./score.sh  "), "score");
  EXPECT_EQ(external_reward_name("http://localhost:8000/v1/reward/"), "reward");
  EXPECT_EQ(external_reward_name("https://user:pw@scorer.internal"), "scorer.internal");
  EXPECT_TRUE(is_external_reward("command:x"));
  EXPECT_FALSE(is_external_reward("my.module:func"));
  EXPECT_EQ(parse_reward_answer("x", "[1, null, 2.5]", 3)[2], 2.5);
}

}  // namespace
}  // namespace soltrain
