#include "data/llama_factory_encode.h"

#include <algorithm>
#include <string_view>
#include <tuple>

#include "core/error.h"
#include "data/dataset.h"

namespace soltrain {

using nlohmann::ordered_json;

namespace {

std::vector<int32_t> ids_of(Tokenizer& tok, const LfSpecialIds& e, const std::vector<std::string>& elements) {
  std::vector<int32_t> ids;
  for (const std::string& el : elements) {
    if (el == kLfBos || el == kLfEos) {  // (_convert_elements_to_ids: nothing when the tokenizer has no such token)
      if (const auto& id = el == kLfBos ? e.bos : e.eos) ids.push_back(*id);
      continue;
    }
    if (el.empty()) continue;
    const std::vector<int32_t> t = tok.encode(el);
    ids.insert(ids.end(), t.begin(), t.end());
  }
  return ids;
}

// ReasoningTemplate's thought words; the empty thought LLaMA-Factory puts before an answer that has none.
constexpr std::string_view kThinkOpen = "<think>\n", kThinkClose = "\n</think>\n\n";
bool has_thought(const std::string& content) {
  return content.find("<think>") != std::string::npos || content.find("</think>") != std::string::npos;
}
std::string remove_thought(const std::string& content) {  // re.sub("<think>\n(.*?)\n</think>\n\n", "").lstrip("\n")
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t a = content.find(kThinkOpen, pos);
    const size_t b = a == std::string::npos ? a : content.find(kThinkClose, a + kThinkOpen.size());
    if (b == std::string::npos) break;
    out += content.substr(pos, a - pos);
    pos = b + kThinkClose.size();
  }
  out += content.substr(pos);
  const size_t first = out.find_first_not_of('\n');
  return first == std::string::npos ? std::string() : out.substr(first);
}
std::vector<int32_t> empty_thought(Tokenizer& tok) {
  return tok.encode(std::string(kThinkOpen) + std::string(kThinkClose));
}

Document cut_together(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer, int64_t source,
                      int64_t target) {
  Document d;
  d.ids.assign(prompt.begin(), prompt.begin() + source);
  d.mask.assign(size_t(source), 0);
  d.ids.insert(d.ids.end(), answer.begin(), answer.begin() + target);
  d.mask.resize(d.ids.size(), 1);
  return d;
}

}  // namespace

Document lf_supervised(Tokenizer& tok, const LfSpecialIds& e, const LfExample& x) {
  if (x.prompt.size() % 2 != 1 || x.response.size() != 1)
    throw BadRecord(cat(x.prompt.size(), " prompt messages and ", x.response.size(),
                        " responses: LLaMA-Factory drops such an example"));
  ordered_json messages = x.prompt;
  messages.push_back(x.response[0]);
  const auto rendered = lf_render(*x.tmpl, messages, x.system);
  Document d;
  int64_t total = 0;
  for (size_t i = 0; i + 1 < rendered.size(); i += 2) {
    if (x.cutoff_len > 0 && total >= x.cutoff_len) break;
    std::vector<int32_t> source = ids_of(tok, e, rendered[i]), target = ids_of(tok, e, rendered[i + 1]);
    if (x.tmpl->reasoning && !has_thought(messages[i + 1].at("content").get<std::string>())) {
      const std::vector<int32_t> t = empty_thought(tok);  // (enable_thinking: the empty thought is trained)
      target.insert(target.begin(), t.begin(), t.end());
    }
    int64_t s = int64_t(source.size()), t = int64_t(target.size());
    if (x.cutoff_len > 0) std::tie(s, t) = lf_infer_seqlen(s, t, x.cutoff_len - total);
    total += s + t;
    d.ids.insert(d.ids.end(), source.begin(), source.begin() + s);
    d.mask.insert(d.mask.end(), size_t(s), x.train_on_prompt ? 1 : 0);
    d.ids.insert(d.ids.end(), target.begin(), target.begin() + t);
    d.mask.insert(d.mask.end(), size_t(t), 1);
  }
  return d;
}

namespace {

// Template.encode_oneturn of prompt + [answer]: the prompt's ids (every message but the answer; a reasoning template
// drops earlier answers' thoughts) and the answer's (with the empty thought a reasoning template trains).
std::pair<std::vector<int32_t>, std::vector<int32_t>> oneturn(Tokenizer& tok, const LfSpecialIds& e, const LfExample& x,
                                                              const ordered_json& answer) {
  ordered_json messages = x.prompt;
  if (x.tmpl->reasoning)
    for (size_t i = 1; i + 1 < messages.size(); i += 2)
      messages[i]["content"] = remove_thought(messages[i].at("content").get<std::string>());
  messages.push_back(answer);
  const auto rendered = lf_render(*x.tmpl, messages, x.system);
  std::vector<int32_t> prompt_ids;
  for (size_t i = 0; i + 1 < rendered.size(); ++i) {
    const std::vector<int32_t> ids = ids_of(tok, e, rendered[i]);
    prompt_ids.insert(prompt_ids.end(), ids.begin(), ids.end());
  }
  std::vector<int32_t> answer_ids = ids_of(tok, e, rendered.back());
  if (x.tmpl->reasoning && !has_thought(answer.at("content").get<std::string>())) {
    const std::vector<int32_t> t = empty_thought(tok);
    answer_ids.insert(answer_ids.begin(), t.begin(), t.end());
  }
  return {std::move(prompt_ids), std::move(answer_ids)};
}

}  // namespace

std::pair<Document, Document> lf_pairwise(Tokenizer& tok, const LfSpecialIds& e, const LfExample& x) {
  if (x.prompt.size() % 2 != 1 || x.response.size() < 2)
    throw BadRecord(cat(x.prompt.size(), " prompt messages and ", x.response.size(),
                        " answers: LLaMA-Factory drops such a preference example"));
  const auto [prompt_ids, chosen] = oneturn(tok, e, x, x.response[0]);
  const std::vector<int32_t> rejected = oneturn(tok, e, x, x.response[1]).second;
  int64_t s = int64_t(prompt_ids.size()), t = int64_t(std::max(chosen.size(), rejected.size()));
  if (x.cutoff_len > 0) std::tie(s, t) = lf_infer_seqlen(s, t, x.cutoff_len);
  const auto cut = [&](const std::vector<int32_t>& answer) {
    return cut_together(prompt_ids, answer, s, std::min<int64_t>(t, int64_t(answer.size())));
  };
  return {cut(chosen), cut(rejected)};
}

LfUnpaired lf_unpaired(Tokenizer& tok, const LfSpecialIds& e, const LfExample& x) {
  if (!x.kto_tag) throw BadRecord("no boolean kto_tag: not a KTO example");
  if (x.prompt.size() % 2 != 1 || x.response.size() < 2)
    throw BadRecord(cat(x.prompt.size(), " prompt messages and ", x.response.size(),
                        " answers: LLaMA-Factory drops such a KTO example"));
  // (the converter put the answer first when desirable, after an empty one when not)
  auto [prompt_ids, answer] = oneturn(tok, e, x, x.response[*x.kto_tag ? 0 : 1]);
  LfUnpaired u{lf_kl_document(prompt_ids, answer, x.cutoff_len), std::move(prompt_ids), std::move(answer)};
  return u;
}

Document lf_kl_document(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer, int64_t cutoff_len) {
  int64_t s = int64_t(prompt.size()), t = int64_t(answer.size());
  if (cutoff_len > 0) std::tie(s, t) = lf_infer_seqlen(s, t, cutoff_len);
  return cut_together(prompt, answer, s, t);
}

}  // namespace soltrain
