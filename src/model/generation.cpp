#include "model/generation.h"

#include <algorithm>

#include "core/error.h"
#include "io/json_file.h"

namespace soltrain {

namespace {
bool is_eos(const GenerationOptions& o, int32_t id) {
  return std::find(o.eos_ids.begin(), o.eos_ids.end(), id) != o.eos_ids.end();
}
bool stops(const GenerationOptions& o, std::span<const int32_t> row) {
  return o.stop_after && o.stop_after(row);
}
}  // namespace

std::vector<int32_t> generate(KvDecoder& decoder, std::span<const int32_t> prompt, const GenerationOptions& opts,
                              const std::function<void(int32_t)>& on_token) {
  SOLTRAIN_CHECK(decoder.batch() == 1, "generate() runs one sequence");
  if (prompt.empty()) user_error("the prompt is empty: nothing to generate from");
  decoder.reset();
  std::vector<int32_t> out;
  int32_t token = 0;
  decoder.feed(prompt, int(prompt.size()));
  while (int(out.size()) < opts.max_new_tokens) {
    if (!out.empty()) decoder.feed_drawn();  // (`token`, from the device)
    decoder.sample(opts.sampling, out.size(), &token);
    out.push_back(token);
    if (on_token) on_token(token);
    if (is_eos(opts, token) || stops(opts, out)) break;
  }
  return out;
}

std::vector<std::vector<int32_t>> generate_batch(KvDecoder& decoder, std::span<const int32_t> prompt,
                                                 const GenerationOptions& opts) {
  if (prompt.empty()) user_error("the prompt is empty: nothing to generate from");
  const int n = decoder.batch();
  decoder.reset();
  decoder.feed_row(0, prompt);
  for (int r = 1; r < n; ++r) decoder.copy_row(0, r);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  std::vector<bool> done(size_t(n), false);
  std::vector<int32_t> next(size_t(n), 0);
  for (int step = 0; step < opts.max_new_tokens; ++step) {
    if (step > 0) decoder.feed_drawn();  // (the tokens in `next`, from the device)
    decoder.sample(opts.sampling, uint64_t(step), next.data());
    bool all_done = true;
    for (int r = 0; r < n; ++r) {
      if (done[size_t(r)]) continue;  // (a finished row keeps decoding into its own slot, unread)
      out[size_t(r)].push_back(next[size_t(r)]);
      done[size_t(r)] = is_eos(opts, next[size_t(r)]) || stops(opts, out[size_t(r)]);
      all_done = all_done && done[size_t(r)];
    }
    if (all_done) break;
  }
  return out;
}

std::vector<Rollout> generate_groups(KvDecoder& decoder, const std::vector<std::vector<int32_t>>& prompts, int group,
                                     const GenerationOptions& opts) {
  const int P = int(prompts.size()), n = P * group, slots = decoder.batch();
  SOLTRAIN_CHECK(group >= 1 && slots % group == 0 && slots <= n, "generate_groups: ", P, " prompts x ", group,
                 " for a decoder of ", slots, " rows");
  for (int p = 0; p < P; ++p)
    if (prompts[size_t(p)].empty()) user_error("prompt ", p, " is empty: nothing to generate from");
  std::vector<Rollout> out(static_cast<size_t>(n));
  if (opts.max_new_tokens <= 0) return out;
  decoder.reset();
  std::vector<int> holds(size_t(slots), -1);  // the completion each row decodes for (-1: none)
  std::vector<bool> done(size_t(n), false);
  std::vector<int32_t> next(size_t(slots), 0);
  std::vector<float> next_logp(opts.logprobs ? size_t(slots) : 0);
  float* const logp = opts.logprobs ? next_logp.data() : nullptr;
  int fed = 0;  // prompts started
  // Row r's draw `id` taken into its completion; true when that ends it.
  auto take = [&](int r, int32_t id) {
    const int c = holds[size_t(r)];
    if (c < 0 || done[size_t(c)]) return;  // (a finished row keeps decoding into its own slot, unread)
    Rollout& ro = out[size_t(c)];
    ro.tokens.push_back(id);
    if (logp) ro.logprobs.push_back(logp[r]);
    ro.stop_string = !is_eos(opts, id) && stops(opts, ro.tokens);
    if (is_eos(opts, id) || ro.stop_string) done[size_t(c)] = ro.terminated = true;
    if (int(ro.tokens.size()) >= opts.max_new_tokens) done[size_t(c)] = true;
  };
  // The next prompt into rows r0 .. r0 + group: fed once, its cache shared by the rest of the group.
  auto start = [&](int r0) {
    const int p = fed++;
    decoder.restart_row(r0);
    decoder.feed_row(r0, prompts[size_t(p)]);
    for (int i = 0; i < group; ++i) {
      if (i > 0) decoder.copy_row(r0, r0 + i);
      holds[size_t(r0 + i)] = p * group + i;
    }
  };
  auto group_done = [&](int r0) {
    for (int i = 0; i < group; ++i)
      if (!done[size_t(holds[size_t(r0 + i)])]) return false;
    return true;
  };
  for (int r0 = 0; r0 < slots; r0 += group) start(r0);
  // With fewer rows than completions (continuous batching), a group whose rows have all ended takes the next
  // prompt at once, its first tokens drawn from the prompt's logits while the other rows decode on. A group left
  // without a prompt is restarted on one token so its rows, decoding unread, stay within the context planned.
  const bool streams = slots < n;
  std::vector<bool> parked(size_t(slots / group), false);
  const int32_t park_token = prompts[0][0];
  for (uint64_t step = 0; std::find(done.begin(), done.end(), false) != done.end(); ++step) {
    if (step > 0) decoder.feed_drawn();  // (the tokens in `next`, from the device)
    decoder.sample(opts.sampling, step, next.data(), logp);
    for (int r = 0; r < slots; ++r) take(r, next[size_t(r)]);
    if (!streams) continue;
    for (int r0 = 0; r0 < slots; r0 += group) {
      if (parked[size_t(r0 / group)] || !group_done(r0)) continue;
      if (fed == P) {
        decoder.restart_row(r0);
        decoder.feed_row(r0, std::span(&park_token, 1));
        for (int i = 1; i < group; ++i) decoder.copy_row(r0, r0 + i);
        parked[size_t(r0 / group)] = true;
        continue;
      }
      start(r0);
      // (a step number of its own: the rows' previous draws at this step were the ended completions')
      decoder.sample_rows(r0, group, opts.sampling, step | (uint64_t(1) << 40), next.data() + r0,
                          logp ? logp + r0 : nullptr);
      for (int i = 0; i < group; ++i) take(r0 + i, next[size_t(r0 + i)]);
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> generate_each(Transformer& model, const std::vector<std::vector<int32_t>>& prompts,
                                                const GenerationOptions& opts) {
  SOLTRAIN_CHECK(!prompts.empty(), "generate_each: no prompts");
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  // The prompts' activations share one budget of 2048 tokens per forward, however many rows there are.
  const int n = int(prompts.size());
  KvDecoder decoder(model, n, int(longest) + opts.max_new_tokens, std::max(1, 2048 / n),
                    opts.sampling.repetition_penalty != 1);
  std::vector<std::vector<int32_t>> out;
  for (Rollout& r : generate_groups(decoder, prompts, 1, opts)) out.push_back(std::move(r.tokens));
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
