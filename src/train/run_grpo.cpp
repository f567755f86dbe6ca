// Online RL: the run built from the config as every run is (train/run_builder.h), a prompt dataset, the
// decoder that generates on the training weights, the reward functions, and the GRPO driver in the one training
// loop (train/train_loop.h). An update's rollouts are generated when it starts (every num_iterations updates),
// scored, turned into advantages and rows, then trained on by GrpoStep.
#include "train/run_grpo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "core/host_memory.h"
#include "data/loader.h"
#include "data/prompt_codec.h"
#include "data/record_reader.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "model/grpo_objective.h"
#include "tokenizer/stop_strings.h"
#include "train/run_builder.h"
#include "train/run_tokenizer.h"
#include "train/train_data.h"
#include "train/train_loop.h"
#include "train/train_step.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

// New tokens per row per forward when prompts are fed (the decoder's activations are sized for this).
int generation_chunk(const TrainConfig& c) {
  return std::max(1, std::min(256, c.grpo.max_prompt_length));
}

// Full fine-tuning with beta > 0 keeps a frozen copy of the starting weights as its reference (LoRA's is the
// base with the adapters off).
bool keeps_reference_copy(const TrainConfig& c, const Transformer& model) {
  return c.grpo.loss.beta != 0 && !model.lora();
}

// The decoder's cache: each group's prompt once (its rows share the prompt's blocks), each row its completion.
int64_t generation_cache_tokens(const TrainConfig& c, int rows) {
  const int G = c.grpo.num_generations;
  const int max_new = c.sequence_len - c.grpo.max_prompt_length;  // max_completion_length
  return KvDecoder::cache_tokens_for_groups(rows / G, G, c.grpo.max_prompt_length, max_new);
}

// The decoder's rows, from its memory against the budget before anything is allocated: every completion of an
// update at once when they fit, else the most whole groups that do (the prompts then stream through them:
// generate_groups' continuous batching). The line the log shows, and one line naming what to change when not
// even one group fits.
int generation_rows(const TrainConfig& c, Ops& ops, Transformer& model, int completions, std::ostream& log) {
  const GrpoSettings& g = c.grpo;
  const double gib = double(1ull << 30);
  auto need_for = [&](int rows) {
    return double(KvDecoder::memory_bytes(model, rows, c.sequence_len, generation_chunk(c), g.repetition_penalty != 1,
                                          generation_cache_tokens(c, rows)));
  };
  const bool cuda = ops.device() == Device::CUDA;
  const HostMemory host = cuda ? HostMemory{} : read_host_memory();
  const double total = cuda ? ops.memory_total_gib() * gib : double(host.limit);
  const double free = cuda ? ops.memory_free_gib() * gib : double(host.available);
  double budget = 0;
  std::string from;
  if (g.generation_memory_gib > 0) {
    budget = g.generation_memory_gib * gib;
    from = cat("generation_memory_gib ", g.generation_memory_gib);
  } else if (g.generation_memory_fraction > 0 && total > 0) {
    budget = g.generation_memory_fraction * total;
    from = cat("generation_memory_fraction ", g.generation_memory_fraction, " of ", format_bytes(total));
  } else if (free > 0) {
    // What is free less the reference's frozen copy (full fine-tuning with beta > 0), allocated beside it.
    const double reference = keeps_reference_copy(c, model) ? double(ReferenceWeights::bytes_for(model.params())) : 0;
    budget = std::max(free - reference, 1.0);
    from = cat(cuda ? "the GPU memory free" : "the host memory available",
               reference > 0 ? cat(" less the reference copy's ", format_bytes(reference)) : std::string());
  }
  const int G = g.num_generations;
  int rows = completions;
  double need = need_for(rows);
  while (budget > 0 && need > budget && rows > G) need = need_for(rows -= G);
  const double kv = double(KvDecoder::kv_cache_bytes(model, generation_cache_tokens(c, rows)));
  const std::string what = cat("KV cache ", format_bytes(kv), " for ", rows, " completions of up to ",
                               c.sequence_len - g.max_prompt_length, " tokens after prompts of up to ",
                               c.grpo.max_prompt_length, " shared by groups of ", G, ", plus activations and logits");
  log << "grpo: generation memory " << format_bytes(need) << " (" << what << ")";
  if (budget > 0) log << ", budget " << format_bytes(budget) << " (" << from << ")";
  if (rows < completions)
    log << "; the " << completions << " completions of an update stream through " << rows
        << " rows (a group's rows take the next prompt when they have all ended)";
  log << "\n";
  if (budget > 0 && need > budget)
    user_error("generation needs ", format_bytes(need), " (", what, "), more than ", from, " (", format_bytes(budget),
               "): lower max_prompt_length, max_completion_length or num_generations",
               g.generation_memory_gib > 0 || g.generation_memory_fraction > 0 ? ", or raise the budget" : "");
  return rows;
}

struct PromptRecord {
  nlohmann::ordered_json record;  // the whole row: its other columns go to the reward functions
  nlohmann::ordered_json prompt;  // its prompt column, as the dataset gives it
  std::vector<int32_t> ids;       // the prompt through the tokenizer (and the chat template for conversations)
};

// The config's prompts: every record of its datasets, tokenized once (cut to its last max_prompt_length
// tokens), and the run's entries into them after each dataset's slice and `samples`, the rules SFT's datasets
// follow (train/train_data.h), so a repeated record is an index, not a copy.
struct PromptSet {
  std::vector<PromptRecord> records;
  std::vector<int64_t> entries;
};

PromptSet read_prompts(const TrainConfig& c, const PromptCodec& codec, std::ostream& log) {
  PromptSet out;
  int64_t cut = 0;
  for (size_t i = 0; i < c.datasets.size(); ++i) {
    const DatasetSpec& d = c.datasets[i];
    const int64_t first = int64_t(out.records.size());
    RecordReader reader(d.path, {}, d.split);
    nlohmann::ordered_json rec;
    std::string where, error;
    while (reader.next(rec, where, error)) {
      if (rec.is_null()) throw DataError(cat(where, ": ", error));
      const auto p = rec.find(d.fields.prompt);  // "prompt", or the dataset's field_prompt
      if (p == rec.end())
        throw DataError(cat(where, ": no \"", d.fields.prompt, "\" column (GRPO reads prompts as TRL does: text or ",
                            "a list of {role, content} messages)"));
      PromptRecord r{rec, *p, {}};
      try {
        r.ids = codec.prompt(*p, where);
      } catch (const UserError& e) {
        throw DataError(e.what());
      }
      if (int64_t(r.ids.size()) > c.grpo.max_prompt_length) {
        r.ids.erase(r.ids.begin(), r.ids.end() - c.grpo.max_prompt_length);
        ++cut;
      }
      out.records.push_back(std::move(r));
    }
    int64_t begin = 0, end = int64_t(out.records.size()) - first;
    if (d.slice) std::tie(begin, end) = slice_bounds(end, *d.slice);
    std::vector<int64_t> picked;
    if (d.samples > 0) {
      check_host_memory(uint64_t(d.samples) * sizeof(int64_t), cat("samples: ", d.samples, " prompts"),
                        "lower samples");
      picked = sample_indices(end - begin, d.samples, c.seed + i);
    } else {
      for (int64_t k = 0; k < end - begin; ++k) picked.push_back(k);
    }
    for (int64_t k : picked) out.entries.push_back(first + begin + k);
  }
  if (c.dataset_exact_deduplication) {
    // Axolotl deduplicates a grpo run's rows as it does SFT's (utils/data/rl.py): a row whose every column equals an
    // earlier one's is dropped.
    std::unordered_set<std::string> seen;
    std::vector<int64_t> kept;
    for (int64_t e : out.entries)
      if (seen.insert(out.records[size_t(e)].record.dump()).second) kept.push_back(e);
    log << "dataset_exact_deduplication: dropped " << out.entries.size() - kept.size() << " duplicate prompt rows, "
        << kept.size() << " left\n";
    out.entries = std::move(kept);
  }
  if (out.entries.empty()) throw DataError("grpo: the datasets hold no prompts");
  if (cut > 0)
    log << "grpo: " << cut << " of " << out.records.size() << " prompts cut to their last " << c.grpo.max_prompt_length
        << " tokens (max_prompt_length)\n";
  return out;
}

// Why generation cannot overlap training on this model (null: it can). The decoder reads the layers' weights from
// another thread while the trainer's forward and backward run: whatever those passes write beside the gradients
// and activations would be read half-written. What the config says (the fp8 recipe, full fine-tuning's frozen
// reference, offload_weights) cli/config.cpp refuses before anything is written; these are the model's own facts.
const char* why_no_overlap(const Transformer& model) {
  if (model.params().sharded()) return "sharded weights (gathered per layer for the trainer's passes)";
  SOLTRAIN_CHECK(!model.fp8() && !model.weight_stream() && model.config().moe_layers() == 0,
                 "generation_overlap past the config's and the run's early refusals (train/run_checks.h)");
  return nullptr;
}

// One batch's rollouts: its prompts (records and ids) and their completions, with the seconds they took.
struct Generated {
  std::vector<size_t> picked;
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<Rollout> rollouts;
  double seconds = 0;
};

// A batch made ready for its updates: the micro-batches, their tokens and the generation's metrics.
struct ReadyBatch {
  std::vector<HostBatch> micro;
  int64_t tokens = 0;
  NamedValues values;
};

class GrpoDriver final : public RunDriver {
 public:
  GrpoDriver(const TrainConfig& c, Ops& ops, Transformer& model, const PromptCodec& codec, PromptSet prompts,
             RewardFunctions& rewards, int generation_rows, int64_t total_updates, std::ostream& log)
      : c_(c),
        ops_(ops),
        model_(model),
        codec_(codec),
        prompts_(std::move(prompts)),
        rewards_(rewards),
        log_(log),
        completions_(c.per_device_train_batch_size * c.gradient_accumulation_steps),
        total_updates_(total_updates),
        grpo_(ops, c.grpo.loss, int64_t(c.per_device_train_batch_size) * c.sequence_len, c.per_device_train_batch_size),
        beside_(c.grpo.generation_overlap ? make_ops_beside(ops.device()) : nullptr),
        decoder_(model, generation_rows, c.sequence_len, generation_chunk(c), c.grpo.repetition_penalty != 1,
                 generation_cache_tokens(c, generation_rows), beside_.get()),
        stop_(codec.tokenizer(), c.grpo.stop_strings, "stop_strings") {
    if (keeps_reference_copy(c, model)) {
      reference_ = std::make_unique<ReferenceWeights>(ops, model.params());
      grpo_.set_reference_weights(reference_.get());
      log_ << "grpo: beta " << c.grpo.loss.beta << ": the reference is a frozen copy of the starting weights ("
           << format_bytes(double(reference_->bytes())) << ")\n";
    }
    // SOLTRAIN_GRPO_OVERLAP_INLINE=1 runs the overlapped schedule with the next batch generated on this thread just
    // before the update changes the weights: the same batches from the same weights, nothing concurrent (the test
    // that the concurrent run equals it).
    const char* inline_env = std::getenv("SOLTRAIN_GRPO_OVERLAP_INLINE");
    overlap_inline_ = inline_env && std::string(inline_env) == "1";
  }

  void update(TrainStep& step, int64_t done, float lr) override {
    const int iterations = c_.grpo.num_iterations;
    if (done % iterations == 0 && next_.has_value()) {  // generated during the last update
      current_ = std::move(*next_);
      next_.reset();
    } else if (!fresh_ || done % iterations == 0) {
      Generated g = generate(done);
      current_ = prepare(done, g, /*ahead=*/false);
    }
    fresh_ = true;
    // One step off-policy: the next batch (due at the next update) generates from these weights while this update
    // trains on them; the update waits for it before it changes them.
    std::function<void()> before_update;
    if (beside_ && (done + 1) % iterations == 0 && done + 1 < total_updates_) {
      state_before_next_ = state_;
      Picked next = pick();
      auto work = [this, d = done + 1, next = std::move(next), weights_written = weights_fence()]() mutable {
        weights_written();
        return generate(d, std::move(next));
      };
      pending_ = std::async(overlap_inline_ ? std::launch::deferred : std::launch::async, std::move(work));
      before_update = [this, d = done + 1] {
        const auto t0 = std::chrono::steady_clock::now();
        Generated g = pending_.get();
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        next_ = prepare(d, g, /*ahead=*/true);
        next_->values.push_back({"generation_wait_seconds", overlap_inline_ ? g.seconds : waited});
      };
    }
    GrpoStep objective(grpo_, std::move(before_update));
    step.run(current_.micro, lr, -1, &objective);
  }

  Readout read(const TrainStep&) override {
    const GrpoMetrics m = grpo_.read(ops_);  // waits for the update
    NamedValues v = current_.values;
    if (c_.grpo.loss.beta != 0) v.push_back({"kl", m.kl});
    v.push_back({"entropy", m.entropy});
    v.push_back({"clip_ratio/low_mean", m.clip_low});
    v.push_back({"clip_ratio/low_min", m.clip_low_min});
    v.push_back({"clip_ratio/high_mean", m.clip_high});
    v.push_back({"clip_ratio/high_max", m.clip_high_max});
    v.push_back({"clip_ratio/region_mean", m.clip_region});
    for (auto& load : model_.moe_load()) v.push_back(std::move(load));
    return {m.loss, m.tokens > 0, std::move(v)};
  }

  double tokens_per_update() const override { return double(current_.tokens); }
  double epoch() const override {
    return double(state_.epoch) + double(state_.index) / double(prompts_.entries.size());
  }
  // A batch generated ahead is not in a checkpoint: a resumed run generates it again from the weights it resumes.
  LoaderState loader_state() const override { return next_.has_value() ? state_before_next_ : state_; }
  void restore(const LoaderState& s) override {
    state_ = s;
    order_.clear();
    next_.reset();
    fresh_ = false;  // the next update generates anew (num_iterations restarts there)
  }
  bool has_validation() const override { return false; }
  std::optional<Evaluation> evaluate() override { return std::nullopt; }
  const char* order_name() const override { return "prompt order and sampling"; }

 private:
  struct Picked {
    std::vector<size_t> records;
    std::vector<std::vector<int32_t>> ids;
  };

  // The next prompt of the shuffled order (a new order every epoch).
  size_t next_prompt() {
    if (order_.empty() || state_.index >= int64_t(order_.size())) {
      if (!order_.empty()) ++state_.epoch, state_.index = 0;
      order_ = prompts_.entries;
      shuffle_for_epoch(order_, c_.seed, state_.epoch);
    }
    return size_t(order_[size_t(state_.index++)]);
  }

  // A batch's prompts, taken from the order.
  Picked pick() {
    Picked p;
    for (int i = 0; i < completions_ / c_.grpo.num_generations; ++i) {
      p.records.push_back(next_prompt());
      p.ids.push_back(prompts_.records[p.records.back()].ids);
    }
    return p;
  }

  // A wait, callable from any thread, until the weights this backend has been told to write are written (the last
  // update's, an offloaded update's uploads among them, or those loaded or restored): the beside backend's work
  // must start after them.
  std::function<void()> weights_fence() {
    ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
    ops_.wait(Ops::Stream::Main, Ops::Stream::Upload);
    return ops_.fence();
  }

  // Update d's batch generated now, on this thread.
  Generated generate(int64_t d) {
    if (beside_) weights_fence()();
    return generate(d, pick());
  }

  // The completions of update d's batch from the weights as they stand (on the beside backend with
  // generation_overlap: then possibly in another thread, touching nothing of this one's but the decoder).
  Generated generate(int64_t d, Picked p) {
    const GrpoSettings& g = c_.grpo;
    GenerationOptions o;
    o.max_new_tokens = g.loss.max_completion_length;
    o.sampling = {float(g.temperature),       g.top_k, float(g.top_p), c_.seed + uint64_t(d) * 1000003u, float(g.min_p),
                  float(g.repetition_penalty)};
    o.eos_ids = codec_.eos();
    o.stop_after = stop_.stop_after();
    o.logprobs = g.loss.sampling_correction != SamplingCorrection::None;  // TRL's sampling_per_token_logps
    const auto t0 = std::chrono::steady_clock::now();
    Generated out;
    out.rollouts = generate_groups(decoder_, p.ids, g.num_generations, o);
    if (beside_) beside_->synchronize();  // (nothing of it still queued once the thread hands it over)
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.picked = std::move(p.records);
    out.prompt_ids = std::move(p.ids);
    return out;
  }

  // Update d's batch from its rollouts: rewards, advantages, the micro-batches and TRL's generation metrics. Runs
  // while the weights are still those that generated it (the old log-probs are taken under them).
  // `ahead`: generated during the update before d (one step off-policy), whose old log-probs the ratio then needs.
  ReadyBatch prepare(int64_t d, const Generated& gen, bool ahead) {
    const GrpoSettings& g = c_.grpo;
    const int G = g.num_generations;
    const std::vector<Rollout>& rollouts = gen.rollouts;
    const bool correction = g.loss.sampling_correction != SamplingCorrection::None;
    RewardRequest req;
    for (int r = 0; r < completions_; ++r) {
      const PromptRecord& pr = prompts_.records[gen.picked[size_t(r / G)]];
      req.prompts.push_back(pr.prompt);
      req.records.push_back(pr.record);
      req.completions.push_back(codec_.text(rollouts[size_t(r)].tokens));
      req.completion_ids.push_back(rollouts[size_t(r)].tokens);
    }
    req.conversational = req.prompts[0].is_array();
    const std::vector<std::vector<double>> per_func = rewards_.score(req);
    std::vector<double> total(size_t(completions_), 0.0);
    std::vector<bool> any(size_t(completions_), false);
    for (size_t f = 0; f < per_func.size(); ++f) {
      const double w = g.reward_weights.empty() ? 1.0 : g.reward_weights[f];
      for (size_t r = 0; r < total.size(); ++r)
        if (!std::isnan(per_func[f][r])) total[r] += w * per_func[f][r], any[r] = true;
    }
    for (size_t r = 0; r < total.size(); ++r)
      if (!any[r]) total[r] = NAN;  // no function scored it: TRL's unscorable completion
    std::vector<bool> zero_std;
    const std::vector<float> adv = grpo_advantages(total, G, g.loss.scale_rewards, &zero_std);

    // Rows: prompt, completion, padding; the completion's tokens are the targets (none for a truncated one
    // under mask_truncated_completions).
    const int B = c_.per_device_train_batch_size, T = c_.sequence_len;
    ReadyBatch out;
    out.micro.resize(size_t(c_.gradient_accumulation_steps));
    int64_t gen_tokens = 0, min_len = INT64_MAX, max_len = 0, clipped = 0, term_sum = 0, terminated = 0;
    for (size_t m = 0; m < out.micro.size(); ++m) {
      HostBatch& b = out.micro[m];
      b.rows = B;
      b.seq_len = T;
      b.input_ids.assign(size_t(B) * size_t(T), 0);
      b.targets.assign(size_t(B) * size_t(T), -100);
      if (correction) b.sampling_nll.assign(size_t(B) * size_t(T), 0.0f);
      for (int i = 0; i < B; ++i) {
        const size_t r = m * size_t(B) + size_t(i);
        const std::vector<int32_t>& p = gen.prompt_ids[r / size_t(G)];
        const Rollout& ro = rollouts[r];
        int32_t* ids = b.input_ids.data() + size_t(i) * size_t(T);
        int32_t* tg = b.targets.data() + size_t(i) * size_t(T);
        std::copy(p.begin(), p.end(), ids);
        std::copy(ro.tokens.begin(), ro.tokens.end(), ids + p.size());
        const bool counted = ro.terminated || !g.mask_truncated_completions;
        if (counted)
          for (size_t j = 0; j < ro.tokens.size(); ++j) tg[p.size() - 1 + j] = ro.tokens[j];
        if (correction)
          for (size_t j = 0; j < ro.tokens.size(); ++j)
            b.sampling_nll[size_t(i) * size_t(T) + p.size() - 1 + j] = -ro.logprobs[j];
        b.advantages.push_back(adv[r]);
        const int64_t n = int64_t(ro.tokens.size());
        out.tokens += int64_t(p.size()) + n;
        gen_tokens += n;
        min_len = std::min(min_len, n);
        max_len = std::max(max_len, n);
        if (ro.terminated)
          term_sum += n, ++terminated;
        else
          ++clipped;
      }
    }
    // The trainer's log-probs under the weights that generated the batch: the ratio's denominator for later
    // iterations and (one step off-policy) for its update, and (TRL's rule under the correction) the correction's
    // numerator.
    if (g.num_iterations > 1 || correction || ahead) keep_sampling_logprobs(out.micro);

    // TRL's generation metrics.
    NamedValues& v = out.values;
    const auto [rmean, rstd] = nan_mean_std(total);
    v.push_back({"reward", rmean});
    v.push_back({"reward_std", rstd});
    for (size_t f = 0; f < per_func.size(); ++f) {
      const auto [fm, fs] = nan_mean_std(per_func[f]);
      v.push_back({"rewards/" + rewards_.names()[f] + "/mean", fm});
      v.push_back({"rewards/" + rewards_.names()[f] + "/std", fs});
    }
    v.push_back(
        {"frac_reward_zero_std", double(std::count(zero_std.begin(), zero_std.end(), true)) / double(completions_)});
    v.push_back({"completions/mean_length", double(gen_tokens) / double(completions_)});
    v.push_back({"completions/min_length", double(min_len)});
    v.push_back({"completions/max_length", double(max_len)});
    v.push_back({"completions/clipped_ratio", double(clipped) / double(completions_)});
    v.push_back({"completions/mean_terminated_length", terminated ? double(term_sum) / terminated : 0.0});
    if (correction) {
      const SamplingCorrectionStats s = sampling_correction_stats(g.loss, out.micro);
      v.push_back({"sampling/sampling_logp_difference/mean", s.logp_diff_mean});
      v.push_back({"sampling/sampling_logp_difference/max", s.logp_diff_max});
      v.push_back({"sampling/importance_sampling_ratio/min", s.ratio_min});
      v.push_back({"sampling/importance_sampling_ratio/mean", s.ratio_mean});
      v.push_back({"sampling/importance_sampling_ratio/max", s.ratio_max});
    }
    v.push_back({"generation_tokens_per_second", double(gen_tokens) / std::max(gen.seconds, 1e-9)});
    v.push_back({"generation_seconds", gen.seconds});
    if (g.log_completions && (d + 1) % std::max<int64_t>(1, c_.logging_steps) == 0) {
      log_ << "step " << d + 1 << ": completions (reward):\n";
      for (int r = 0; r < std::min(completions_, g.num_completions_to_print); ++r) {
        std::string text = req.completions[size_t(r)];
        if (text.size() > 300) text = text.substr(0, 300) + "...";
        char rw[32];
        std::snprintf(rw, sizeof rw, "%.3f", total[size_t(r)]);
        log_ << "  [" << rw << "] "
             << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
    }
    return out;
  }

  // Each token's NLL under the weights as they stand (those that sampled it), before the first of its updates.
  void keep_sampling_logprobs(std::vector<HostBatch>& micro) {
    for (HostBatch& b : micro) {
      NllReader keep(b.old_nll);
      model_.forward(b, &keep, /*backward_follows=*/false);
    }
  }

  const TrainConfig& c_;
  Ops& ops_;
  Transformer& model_;
  const PromptCodec& codec_;
  PromptSet prompts_;
  RewardFunctions& rewards_;
  std::ostream& log_;
  int completions_;
  int64_t total_updates_;
  GrpoObjective grpo_;
  std::unique_ptr<ReferenceWeights> reference_;  // full fine-tuning with beta > 0
  std::unique_ptr<Ops> beside_;                  // generation_overlap: the decoder's own backend
  KvDecoder decoder_;
  StopStrings stop_;  // stop_strings (none: EOS and the budget end completions)
  ReadyBatch current_;
  LoaderState state_;
  std::vector<int64_t> order_;
  bool fresh_ = false;  // current_ holds rollouts of this run (not before a resume)
  // generation_overlap: the next batch, generating (pending_) and then ready (next_); the order's state before it
  std::optional<ReadyBatch> next_;
  LoaderState state_before_next_;
  bool overlap_inline_ = false;
  std::future<Generated> pending_;  // (last: a running generation is waited for before the decoder goes)
};

}  // namespace

RunResult run_grpo(const TrainConfig& c, Ops& ops, std::ostream& log, LoopHooks hooks, InProcessRewards in_process) {
  for (const std::string& n : c.notes) log << "grpo: " << n << "\n";
  fs::create_directories(c.output_dir);
  const PromptCodec codec(run_tokenizer_folder(c));
  PromptSet prompts = read_prompts(c, codec, log);
  // Reward modules are imported from the working folder and the config's: as `python -m` and TRL scripts find them.
  std::vector<std::string> paths{fs::current_path().string()};
  if (!c.grpo.config_dir.empty()) paths.push_back(fs::absolute(c.grpo.config_dir).string());
  RewardFunctions rewards(c.grpo, paths, std::move(in_process));
  const std::optional<LoraConfig> lora = lora_config(c);
  check_update_batches_fit(c, 1, c.per_device_train_batch_size);
  auto model = load_run_model(c, ops, lora, {});
  for (const PromptRecord& p : prompts.records)
    for (int32_t id : p.ids)
      if (id < 0 || id >= model->config().vocab_size)
        user_error(c.model.string(), ": the tokenizer produced id ", id, " but the model's vocab_size is ",
                   model->config().vocab_size);
  if (c.sequence_len > model->config().max_position_embeddings)
    user_error("max_prompt_length + max_completion_length = ", c.sequence_len,
               " exceeds the model's max_position_embeddings (", model->config().max_position_embeddings, ")");
  configure_model(*model, c, ops, c.per_device_train_batch_size);
  if (c.grpo.generation_overlap)
    if (const char* why = why_no_overlap(*model)) user_error("generation_overlap is not built for ", why);
  model->set_logit_temperature(float(c.grpo.temperature));
  const int64_t prompts_per_update =
      int64_t(c.per_device_train_batch_size) * c.gradient_accumulation_steps / c.grpo.num_generations;
  const int64_t steps_per_epoch = std::max<int64_t>(1, int64_t(prompts.entries.size()) / prompts_per_update);
  const ScheduleConfig sched =
      schedule_config(c, total_training_steps(c, steps_per_epoch * c.gradient_accumulation_steps));
  TrainStep step(*model, optimizer_config(c));
  const size_t n_prompts = prompts.entries.size();
  const int rows = generation_rows(c, ops, *model, c.per_device_train_batch_size * c.gradient_accumulation_steps, log);
  GrpoDriver driver(c, ops, *model, codec, std::move(prompts), rewards, rows, sched.total_steps, log);
  TrainLoop loop(
      {c, "grpo", log, ops, nullptr, false, *model, step, sched, run_cadence(c, steps_per_epoch), std::move(hooks)},
      driver);
  loop.resume();
  const GrpoConfig& g = c.grpo.loss;
  std::string funcs;
  for (const std::string& f : c.grpo.reward_funcs) funcs += (funcs.empty() ? "" : ", ") + f;
  log << "grpo: " << grpo_loss_type_name(g.loss_type) << " loss, scale_rewards " << scale_rewards_name(g.scale_rewards)
      << ", beta " << g.beta << ", epsilon " << g.epsilon << "/" << g.epsilon_high
      << (g.sequence_level ? ", sequence-level ratios" : "")
      << (g.sampling_correction != SamplingCorrection::None
              ? cat(", sampling correction ", sampling_correction_name(g.sampling_correction))
              : std::string())
      << "; rewards: " << funcs << "; " << (lora ? describe_lora(c) : std::string("full fine-tune")) << "; "
      << describe_parameters(model->params()) << "; " << n_prompts << " prompts, " << prompts_per_update
      << " per update x " << c.grpo.num_generations << " generations of up to " << g.max_completion_length
      << " tokens (temperature " << c.grpo.temperature << "), " << c.grpo.num_iterations << " update"
      << (c.grpo.num_iterations > 1 ? "s" : "") << " per batch; " << sched.total_steps << " steps, lr "
      << c.learning_rate << " " << to_string(c.lr_scheduler_type) << "\n";
  return loop.run();
}

}  // namespace soltrain
