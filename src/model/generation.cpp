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

std::vector<std::vector<int32_t>> generate_batch(KvDecoder& decoder, std::span<const int32_t> prompt,
                                                 const GenerationOptions& opts) {
  if (prompt.empty()) user_error("the prompt is empty: nothing to generate from");
  const int n = decoder.batch();
  const size_t vocab = size_t(decoder.vocab_size());
  decoder.reset();
  std::vector<float> logits(size_t(n) * vocab);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  std::vector<Sampler> samplers;
  for (int r = 0; r < n; ++r) {
    SamplingParams p = opts.sampling;
    p.seed += uint64_t(r);
    samplers.emplace_back(p);
  }
  std::vector<bool> done(size_t(n), false);
  std::vector<int32_t> next;
  for (int r = 0; r < n; ++r) next.insert(next.end(), prompt.begin(), prompt.end());
  int T = int(prompt.size());
  for (int step = 0; step < opts.max_new_tokens; ++step) {
    decoder.feed(next, T, logits.data());
    bool all_done = true;
    for (int r = 0; r < n; ++r) {
      const int32_t token = samplers[size_t(r)].next(std::span<const float>(logits.data() + size_t(r) * vocab, vocab));
      next[size_t(r)] = token;  // (a finished row keeps decoding into its own slot, unread)
      if (done[size_t(r)]) continue;
      out[size_t(r)].push_back(token);
      done[size_t(r)] = std::find(opts.eos_ids.begin(), opts.eos_ids.end(), token) != opts.eos_ids.end();
      all_done = all_done && done[size_t(r)];
    }
    if (all_done) break;
    next.resize(size_t(n));
    T = 1;
  }
  return out;
}

std::vector<Rollout> generate_groups(KvDecoder& decoder, const std::vector<std::vector<int32_t>>& prompts, int group,
                                     const GenerationOptions& opts) {
  const int n = int(prompts.size()) * group;
  SOLTRAIN_CHECK(group >= 1 && decoder.batch() == n, "generate_groups: ", prompts.size(), " prompts x ", group,
                 " for a decoder of ", decoder.batch(), " rows");
  const size_t vocab = size_t(decoder.vocab_size());
  decoder.reset();
  std::vector<float> logits(size_t(n) * vocab);
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (prompts[p].empty()) user_error("prompt ", p, " is empty: nothing to generate from");
    const int first = int(p) * group;
    float* row = logits.data() + size_t(first) * vocab;
    decoder.feed_row(first, prompts[p], row);
    for (int r = first + 1; r < first + group; ++r) {
      decoder.copy_row(first, r);
      std::copy(row, row + vocab, logits.data() + size_t(r) * vocab);
    }
  }
  std::vector<Sampler> samplers;
  for (int r = 0; r < n; ++r) {
    SamplingParams p = opts.sampling;
    p.seed += uint64_t(r);
    samplers.emplace_back(p);
  }
  std::vector<Rollout> out(static_cast<size_t>(n));
  std::vector<bool> done(size_t(n), false);
  std::vector<int32_t> next(size_t(n), 0);
  for (int step = 0; step < opts.max_new_tokens; ++step) {
    if (step > 0) decoder.feed(next, 1, logits.data());
    bool all_done = true;
    for (int r = 0; r < n; ++r) {
      const int32_t token = samplers[size_t(r)].next(std::span<const float>(logits.data() + size_t(r) * vocab, vocab));
      next[size_t(r)] = token;  // (a finished row keeps decoding into its own slot, unread)
      if (done[size_t(r)]) continue;
      out[size_t(r)].tokens.push_back(token);
      if (std::find(opts.eos_ids.begin(), opts.eos_ids.end(), token) != opts.eos_ids.end()) {
        done[size_t(r)] = true;
        out[size_t(r)].terminated = true;
      }
      all_done = all_done && done[size_t(r)];
    }
    if (all_done) break;
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
