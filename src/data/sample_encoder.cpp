// Conversation rendering, assistant span detection and span-wise tokenization (see sample_encoder.h).
#include "data/sample_encoder.h"

#include <algorithm>

#include "io/json_file.h"

namespace soltrain {

using nlohmann::ordered_json;

SampleEncoder::SampleEncoder(Tokenizer& tok, const ChatTemplate* tmpl, std::string eos, bool train_on_inputs)
    : tok_(tok), tmpl_(tmpl), train_on_inputs_(train_on_inputs) {
  if (!eos.empty()) eos_ids_ = tok_.encode(eos);
  for (const AddedToken& t : tok_.added_tokens())
    if (t.special) special_.insert(t.id);
}

std::string SampleEncoder::render(const ordered_json& vars, size_t n_messages, bool generation_prompt) const {
  ordered_json v = vars;
  ordered_json& m = v["messages"];
  m.erase(m.begin() + std::ptrdiff_t(n_messages), m.end());
  v["add_generation_prompt"] = generation_prompt;
  try {
    return tmpl_->render(v);
  } catch (const UserError& e) {
    throw BadRecord(e.what());
  }
}

namespace {

size_t common_prefix(const std::string& a, const std::string& b) {
  return size_t(std::mismatch(a.begin(), a.begin() + std::ptrdiff_t(std::min(a.size(), b.size())), b.begin()).first -
                a.begin());
}

}  // namespace

std::vector<TextSpan> SampleEncoder::assistant_spans(const ordered_json& vars, const std::string& full) {
  const ordered_json& messages = vars.at("messages");
  std::vector<TextSpan> spans;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].value("role", "") != "assistant") continue;
    const std::string prompt = render(vars, i, true);
    const std::string through = render(vars, i + 1, false);
    TextSpan s;
    s.begin = common_prefix(prompt, full);
    if (through.size() <= full.size() && common_prefix(through, full) == through.size()) {
      s.end = through.size();
    } else {
      // This turn renders differently when it is the last one: find its end-of-turn token in F.
      const std::string turn = through.substr(std::min(common_prefix(prompt, through), through.size()));
      const std::vector<int32_t> ids = tok_.encode(turn);
      auto last = std::find_if(ids.rbegin(), ids.rend(), [&](int32_t id) { return is_special(id); });
      if (last == ids.rend())
        throw BadRecord(cat("message ", i, ": cannot find where the assistant turn ends in the rendered text"));
      const std::string& eot = tok_.id_to_token(*last);
      const size_t at = full.find(eot, s.begin);
      if (at == std::string::npos)
        throw BadRecord(cat("message ", i, ": end-of-turn token ", eot, " not found in the rendered text"));
      s.end = at + eot.size();
    }
    if (s.end <= s.begin || (!spans.empty() && s.begin < spans.back().end))
      throw BadRecord(cat("message ", i, ": the chat template renders no separable assistant turn"));
    spans.push_back(s);
  }
  return spans;
}

Document SampleEncoder::encode(const Sample& s) {
  Document d;
  if (s.is_text) {
    d.ids = tok_.encode(s.text);
    d.ids.insert(d.ids.end(), eos_ids_.begin(), eos_ids_.end());
    d.mask.assign(d.ids.size(), 1);
    return d;
  }
  SOLTRAIN_CHECK(tmpl_ != nullptr, "conversation sample without a chat template");
  const std::string full = render(s.vars, s.vars.at("messages").size(), false);
  const std::vector<int32_t> whole = tok_.encode(full);
  if (train_on_inputs_) {
    d.ids = whole;
    d.mask.assign(d.ids.size(), 1);
    return d;
  }
  size_t pos = 0;
  auto piece = [&](size_t end, bool trained) {
    if (end <= pos) return;
    const std::vector<int32_t> ids = tok_.encode(std::string_view(full).substr(pos, end - pos));
    size_t n_trained = 0;
    if (trained) {
      n_trained = ids.size();
      auto last = std::find_if(ids.rbegin(), ids.rend(), [&](int32_t id) { return is_special(id); });
      if (last != ids.rend()) {
        // Only a whitespace separator after the end-of-turn token is left untrained.
        const size_t after = size_t(ids.rend() - last);
        const std::string tail = tok_.decode(std::span(ids).subspan(after));
        if (tail.find_first_not_of(" \t\r\n") == std::string::npos) n_trained = after;
      }
    }
    d.ids.insert(d.ids.end(), ids.begin(), ids.end());
    for (size_t k = 0; k < ids.size(); ++k) d.mask.push_back(k < n_trained ? 1 : 0);
    pos = end;
  };
  for (const TextSpan& span : assistant_spans(s.vars, full)) {
    piece(span.begin, false);
    piece(span.end, true);
  }
  piece(full.size(), false);
  if (d.ids != whole)
    throw BadRecord(
        "the rendered conversation tokenizes differently when cut at the assistant turns; cannot place the loss "
        "mask");
  return d;
}

std::string read_eos_token(const std::filesystem::path& tokenizer_config) {
  const nlohmann::json j = read_json_file(tokenizer_config);
  auto it = j.find("eos_token");
  if (it != j.end() && it->is_string()) return it->get<std::string>();
  if (it != j.end() && it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  user_error(tokenizer_config.string(), ": no \"eos_token\" (needed to end text documents)");
}

}  // namespace soltrain
