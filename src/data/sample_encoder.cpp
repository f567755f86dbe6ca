// Conversation rendering, assistant span detection and span-wise tokenization (see sample_encoder.h).
#include "data/sample_encoder.h"

#include <algorithm>

#include "io/json_file.h"

namespace soltrain {

using nlohmann::ordered_json;

SampleEncoder::SampleEncoder(Tokenizer& tok, const ChatTemplate* tmpl, std::string eos, bool train_on_inputs)
    : tok_(tok), tmpl_(tmpl), eos_(std::move(eos)), train_on_inputs_(train_on_inputs) {
  if (!eos_.empty()) eos_ids_ = tok_.encode(eos_);
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
    // A generation prompt that F only partly follows (Qwen3's "<think>" vs "<tool_call>" share "<") is
    // cut back to its last line break, so the span does not start inside a token.
    if (s.begin < prompt.size()) {
      const size_t nl = full.rfind('\n', s.begin == 0 ? 0 : s.begin - 1);
      s.begin = nl == std::string::npos ? 0 : nl + 1;
    }
    // The turn as the template renders it alone; its end-of-turn token is the eos token when it occurs
    // there (Qwen <|im_end|>, Llama 3 instruct <|eot_id|>), else its first special token.
    const std::string turn = through.substr(std::min(common_prefix(prompt, through), through.size()));
    std::string eot;
    if (!eos_.empty() && turn.find(eos_) != std::string::npos) {
      eot = eos_;
    } else {
      for (int32_t id : tok_.encode(turn))
        if (is_special(id)) {
          eot = tok_.id_to_token(id);
          break;
        }
    }
    if (eot.empty())
      throw BadRecord(cat("message ", i, ": the chat template renders no end-of-turn token after the assistant turn"));
    const size_t at = full.find(eot, s.begin);
    if (at == std::string::npos)
      throw BadRecord(cat("message ", i, ": end-of-turn token ", eot, " not found in the rendered text"));
    s.end = at + eot.size();
    if (!spans.empty() && s.begin < spans.back().end)
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
    // A prompt + response text (alpaca): as Axolotl does, the prompt's own token count is not trained.
    if (s.prompt_chars > 0 && !train_on_inputs_) {
      const size_t n = std::min(d.ids.size(), tok_.encode(std::string_view(s.text).substr(0, s.prompt_chars)).size());
      std::fill(d.mask.begin(), d.mask.begin() + std::ptrdiff_t(n), uint8_t(0));
    }
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
    d.ids.insert(d.ids.end(), ids.begin(), ids.end());
    d.mask.insert(d.mask.end(), ids.size(), trained ? 1 : 0);
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
