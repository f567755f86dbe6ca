// Conversation rendering, assistant span detection and span-wise tokenization (see sample_encoder.h).
#include "data/sample_encoder.h"

#include <algorithm>

#include "data/llama_factory_encode.h"
#include "io/json_file.h"
#include "tokenizer/tokenizer_edits.h"

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

void SampleEncoder::set_bos(const std::string& bos) {
  bos_id_.reset();
  if (!bos.empty()) bos_id_ = tok_.token_to_id(bos);
}

void SampleEncoder::set_turn_training(std::vector<std::string> roles, std::string train_on_eos) {
  roles_ = std::move(roles);
  train_on_eos_ = std::move(train_on_eos);
}

// The end-of-turn token of a turn as the template renders it: the eos token when it occurs there (Qwen
// <|im_end|>, Llama 3 instruct <|eot_id|>), else its first special token.
std::string SampleEncoder::end_of_turn(const std::string& turn) const {
  if (!eos_.empty() && turn.find(eos_) != std::string::npos) return eos_;
  for (int32_t id : tok_.encode(turn))
    if (is_special(id)) return tok_.id_to_token(id);
  return "";
}

SampleEncoder::Turn SampleEncoder::assistant_turn(const ordered_json& vars, const std::string& full, size_t i) {
  const std::string prompt = render(vars, i, true);
  const std::string through = render(vars, i + 1, false);
  Turn t;
  t.begin = common_prefix(prompt, full);
  // A generation prompt that F only partly follows (Qwen3's "<think>" vs "<tool_call>" share "<") is
  // cut back to its last line break, so the span does not start inside a token.
  if (t.begin < prompt.size()) {
    const size_t nl = full.rfind('\n', t.begin == 0 ? 0 : t.begin - 1);
    t.begin = nl == std::string::npos ? 0 : nl + 1;
  }
  const std::string eot = end_of_turn(through.substr(std::min(common_prefix(prompt, through), through.size())));
  if (eot.empty())
    throw BadRecord(cat("message ", i, ": the chat template renders no end-of-turn token after the assistant turn"));
  const size_t at = full.find(eot, t.begin);
  if (at == std::string::npos)
    throw BadRecord(cat("message ", i, ": end-of-turn token ", eot, " not found in the rendered text"));
  t.end = at;
  t.eot_begin = at;
  t.eot_end = at + eot.size();
  return t;
}

SampleEncoder::Turn SampleEncoder::other_turn(const ordered_json& vars, const std::string& full, size_t i) {
  // Axolotl's find_turn (prompt_strategies/chat_template.py): the conversation through this turn, rendered
  // with the turn's content and with "[[dummy_message]]", differs in the content alone.
  const ordered_json& message = vars["messages"][i];
  if (message.contains("content") && !message["content"].is_string() && !message["content"].is_null())
    throw BadRecord(cat("message ", i, ": a ", message.value("role", "?"),
                        " turn whose content is a list of chunks cannot be trained by roles_to_train (only the "
                        "assistant's; give the turn's content as one string)"));
  const std::string with = render(vars, i + 1, false);
  ordered_json dummy_vars = vars;
  dummy_vars["messages"][i]["content"] = "[[dummy_message]]";
  const std::string dummy = render(dummy_vars, i + 1, false);
  const std::string content = vars["messages"][i].value("content", "");
  Turn t;
  const size_t diff = common_prefix(with, dummy);
  // The content starts at or before the first difference (the dummy may share its first characters).
  const size_t at = content.empty() ? std::string::npos : with.rfind(content, diff);
  if (at == std::string::npos || full.compare(at, content.size(), content) != 0 ||
      full.compare(0, at, with, 0, at) != 0)
    throw BadRecord(cat("message ", i, ": cannot find the ", vars["messages"][i].value("role", ""),
                        " turn's text in the rendered conversation (roles_to_train)"));
  t.begin = at;
  t.end = at + content.size();
  const std::string eot = end_of_turn(with.substr(t.end));
  const size_t e = eot.empty() ? std::string::npos : full.find(eot, t.end);
  // As Axolotl, an end-of-turn token counts only right after the turn (it allows 3 tokens of template
  // padding; a few characters here).
  if (e != std::string::npos && e - t.end <= 8) {
    t.eot_begin = e;
    t.eot_end = e + eot.size();
  }
  return t;
}

std::vector<TextSpan> SampleEncoder::trained_spans(const ordered_json& vars, const std::string& full) {
  const ordered_json& messages = vars.at("messages");
  std::vector<TextSpan> spans;
  auto add = [&](size_t b, size_t e, size_t i) {
    if (e <= b) return;
    if (!spans.empty() && b < spans.back().end)
      throw BadRecord(cat("message ", i, ": the chat template renders no separable turn"));
    if (!spans.empty() && b == spans.back().end) {
      spans.back().end = e;
      return;
    }
    spans.push_back({b, e});
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string role = messages[i].value("role", "");
    const bool trained = std::find(roles_.begin(), roles_.end(), role) != roles_.end();
    const bool last = i + 1 == messages.size();
    if (!trained && train_on_eos_ != "all" && !(train_on_eos_ == "last" && last)) continue;
    const Turn t = role == "assistant" ? assistant_turn(vars, full, i) : other_turn(vars, full, i);
    if (trained) add(t.begin, t.end, i);
    const bool eot =
        train_on_eos_ == "all" || (train_on_eos_ == "turn" && trained) || (train_on_eos_ == "last" && last);
    if (eot && t.eot_begin != std::string::npos) add(t.eot_begin, t.eot_end, i);
  }
  return spans;
}

Document SampleEncoder::encode(const Sample& s) {
  Document d;
  if (!s.steps.empty()) {
    // TRL's PRMTrainer.tokenize_row, as Axolotl's stepwise_supervised runs it: the bos token (when the tokenizer has
    // one) and the prompt, untrained; each step and then the separator, tokenized apart with no special tokens; the
    // step's label (stored as label + 1, ShardSet::token_labels) on the separator's last token.
    if (bos_id_) d.ids.push_back(*bos_id_);
    const std::vector<int32_t> prompt = tok_.encode(s.text);
    d.ids.insert(d.ids.end(), prompt.begin(), prompt.end());
    d.mask.assign(d.ids.size(), 0);
    const std::vector<int32_t> separator = tok_.encode(step_separator_);
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const std::vector<int32_t> step = tok_.encode(s.steps[i]);
      d.ids.insert(d.ids.end(), step.begin(), step.end());
      d.ids.insert(d.ids.end(), separator.begin(), separator.end());
      d.mask.resize(d.ids.size(), 0);
      if (step.empty() && separator.empty()) throw BadRecord(cat("step ", i, " and the separator are empty"));
      d.mask.back() = uint8_t(s.step_labels[i] + 1);  // (-1, no label: 0)
    }
    return d;
  }
  if (s.llama_factory)  // LLaMA-Factory's template, pairs and cut (data/llama_factory.h)
    return lf_supervised(tok_, {bos_id_, eos_ids_.size() == 1 ? std::optional(eos_ids_[0]) : std::nullopt},
                         *s.llama_factory);
  if (!s.segments.empty()) {
    // Axolotl's input_output: each segment alone, no eos added.
    for (const auto& [text, label] : s.segments) {
      const std::vector<int32_t> ids = tok_.encode(text);
      d.ids.insert(d.ids.end(), ids.begin(), ids.end());
      d.mask.insert(d.mask.end(), ids.size(), label || train_on_inputs_ ? 1 : 0);
    }
    return d;
  }
  // Axolotl's _tokenize (src/axolotl/prompt_tokenizers.py) calls tokenizer(text), whose add_special_tokens
  // puts the post_processor's specials around the text (Llama 3.1: <|begin_of_text|> first; Qwen: none), and
  // appends the eos token unless the text already ends with it.
  const auto ends_with_eos = [&](const std::vector<int32_t>& ids) {
    return ids.size() >= eos_ids_.size() && std::equal(eos_ids_.rbegin(), eos_ids_.rend(), ids.rbegin());
  };
  if (s.is_text && s.prompt_chars > 0) {
    // A prompt + response text (alpaca, alpaca_chat) as Axolotl's InstructionPromptTokenizingStrategy does it:
    // the prompt and the response are tokenized apart and joined, the prompt untrained; the response loses a
    // leading BOS (strip_bos_token) and gets the eos token unless it already ends with it.
    // Apart, not whole: "ASSISTANT:" + "//x" would otherwise become one "://" token across the edge.
    d.ids = tok_.encode_with_special_tokens(std::string_view(s.text).substr(0, s.prompt_chars));
    d.mask.assign(d.ids.size(), train_on_inputs_ ? 1 : 0);
    std::vector<int32_t> response = tok_.encode_with_special_tokens(std::string_view(s.text).substr(s.prompt_chars));
    if (bos_id_ && !response.empty() && response.front() == *bos_id_) response.erase(response.begin());
    if (!ends_with_eos(response)) response.insert(response.end(), eos_ids_.begin(), eos_ids_.end());
    d.ids.insert(d.ids.end(), response.begin(), response.end());
    d.mask.insert(d.mask.end(), response.size(), 1);
    return d;
  }
  if (s.is_text) {  // Axolotl's completion (and pretraining) rows: tokenizer(text) + eos
    d.ids = tok_.encode_with_special_tokens(s.text);
    if (!ends_with_eos(d.ids)) d.ids.insert(d.ids.end(), eos_ids_.begin(), eos_ids_.end());
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
    d.ids.insert(d.ids.end(), ids.begin(), ids.end());
    d.mask.insert(d.mask.end(), ids.size(), trained ? 1 : 0);
    pos = end;
  };
  for (const TextSpan& span : trained_spans(s.vars, full)) {
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

std::string read_special_token(const std::filesystem::path& tokenizer_config, const char* key) {
  const nlohmann::json j = read_json_file(tokenizer_config);
  const auto it = j.find(key);
  return it == j.end() ? std::string() : special_token_text(*it);
}

std::string read_bos_token(const std::filesystem::path& tokenizer_config) {
  return read_special_token(tokenizer_config, "bos_token");
}

std::string read_eos_token(const std::filesystem::path& tokenizer_config) {
  std::string eos = read_special_token(tokenizer_config, "eos_token");
  if (eos.empty()) user_error(tokenizer_config.string(), ": no \"eos_token\" (needed to end text documents)");
  return eos;
}

}  // namespace soltrain
