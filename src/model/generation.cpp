#include "model/generation.h"

#include <algorithm>

#include "core/error.h"
#include "io/json_file.h"

namespace soltrain {

std::vector<int32_t> generate(KvDecoder& decoder, std::span<const int32_t> prompt, const GenerationOptions& opts,
                              const std::function<void(int32_t)>& on_token) {
  SOLTRAIN_CHECK(decoder.batch() == 1, "generate() runs one sequence");
  if (prompt.empty()) user_error("the prompt is empty: nothing to generate from");
  decoder.reset();
  std::vector<float> logits(size_t(decoder.vocab_size()));
  std::vector<int32_t> out;
  Sampler sampler(opts.sampling);
  auto is_eos = [&](int32_t id) {
    return std::find(opts.eos_ids.begin(), opts.eos_ids.end(), id) != opts.eos_ids.end();
  };
  std::span<const int32_t> next = prompt;
  int32_t token = 0;
  while (int(out.size()) < opts.max_new_tokens) {
    decoder.feed(next, int(next.size()), logits.data());
    token = sampler.next(logits);
    out.push_back(token);
    if (on_token) on_token(token);
    if (is_eos(token)) break;
    next = std::span<const int32_t>(&token, 1);
  }
  return out;
}

std::vector<int32_t> read_generation_eos(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  const nlohmann::json j = read_json_file(path);
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return {};
  std::vector<int32_t> ids;
  auto add = [&](const nlohmann::json& v) {
    if (!v.is_number_integer())
      user_error(path.string(), ": eos_token_id ", v.dump(), ": expected an integer or a list of them");
    ids.push_back(v.get<int32_t>());
  };
  if (it->is_array()) {
    for (const auto& v : *it) add(v);
  } else {
    add(*it);
  }
  return ids;
}

}  // namespace soltrain
