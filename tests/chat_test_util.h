// The real tokenizers with their chat templates, loaded once per test binary, and what a document trains: the
// mask tests and the dataset-type tests read both.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/sample_encoder.h"
#include "data_test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace soltrain::test {

struct ChatModel {
  Tokenizer tok;
  ChatTemplate tmpl;
};

inline ChatModel& chat_model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<ChatModel>> cache;
  auto& m = cache[name];
  if (!m) {
    const auto dir = tokenizer_folder(name);
    m = std::make_unique<ChatModel>(
        ChatModel{Tokenizer::load(dir), ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json")});
  }
  return *m;
}

// The decoded text of each run of trained (mask = 1) tokens, in order.
inline std::vector<std::string> trained_runs(ChatModel& m, const Document& d) {
  std::vector<std::string> runs;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= d.ids.size(); ++i) {
    if (i < d.ids.size() && d.mask[i]) {
      run.push_back(d.ids[i]);
    } else if (!run.empty()) {
      runs.push_back(m.tok.decode(run));
      run.clear();
    }
  }
  return runs;
}

}  // namespace soltrain::test
