// `soltrain bench-decode`: the KV-cache decoder's token step (model/decoder.h) timed on its own, as GRPO's
// rollouts and `generate` run it: `--rows` sequences fed a random prompt each (or one per `--group` rows, shared),
// then `--tokens` decode steps
// (feed_drawn + sample), greedy or sampled. One JSON line: the step's time, tokens/s, and its share of the
// memory-bandwidth bound (the weights and every row's KV cache read once per step at --hbm-gbps), whether the
// step ran as one recorded graph, and a per-op device profile of a few steps run op by op.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/decoder.h"
#include "model/random_weights.h"
#include "train/run_builder.h"

namespace soltrain {

namespace {
struct DecodeBenchOpts {
  std::string model, device = "cuda", qlora = "none";
  int rows = 64, group = 1, prompt = 64, tokens = 256, lora_rank = 0, profile_steps = 8;
  bool random_weights = false, greedy = false;
  float temperature = 1.0f, top_p = 1.0f;  // TRL's GRPO defaults (and no top_k)
  int top_k = 0;
  double hbm_gbps = 4800;  // the H200's copy rate (METHOD.md); the bound's denominator
};

int run_bench_decode(const DecodeBenchOpts& o) {
  if (o.rows < 1 || o.prompt < 1 || o.tokens < 2 || o.group < 1)
    user_error("bench-decode: --rows, --group and --prompt must be at least 1, --tokens at least 2");
  if (o.rows % o.group != 0) user_error("bench-decode: --rows ", o.rows, " is not a multiple of --group ", o.group);
  auto ops = make_ops(o.device);
  TrainConfig c = bench_model_settings(o.lora_rank, o.qlora, "bench-decode");  // the adapters as `bench` makes them
  c.sequence_len = o.prompt + o.tokens;
  const std::optional<LoraConfig> lora = lora_config(c, "bench-decode");
  auto model = o.random_weights ? random_pretrained(o.model, *ops, lora, /*gradients=*/false, 1)
                                : load_pretrained(o.model, *ops, lora, /*gradients=*/false);
  const ModelConfig& mc = model->config();

  const int groups = o.rows / o.group;
  KvDecoder decoder(*model, o.rows, o.prompt + o.tokens, 256, false,
                    KvDecoder::cache_tokens_for_groups(groups, o.group, o.prompt, o.tokens));
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts(size_t(groups), std::vector<int32_t>(size_t(o.prompt)));
  for (auto& prompt : prompts)
    for (int32_t& id : prompt) id = int32_t(rng() % uint32_t(mc.vocab_size));
  SamplingParams p;
  if (!o.greedy) p.temperature = o.temperature, p.top_p = o.top_p, p.top_k = o.top_k;
  p.seed = 3;
  p.validate();
  std::vector<int32_t> ids(size_t(o.rows));
  // One generation: the prompts fed, then `steps` decode steps; the seconds of the decode steps.
  auto generate = [&](int steps) {
    decoder.reset();
    for (int g = 0; g < groups; ++g) {  // as GRPO's rollouts: each prompt fed once, its blocks shared by its group
      decoder.feed_row(g * o.group, prompts[size_t(g)]);
      for (int r = 1; r < o.group; ++r) decoder.copy_row(g * o.group, g * o.group + r);
    }
    decoder.sample(p, 0, ids.data());
    ops->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 1; s <= steps; ++s) {
      decoder.feed_drawn();
      decoder.sample(p, uint64_t(s), ids.data());  // (the ids come back: a sync per step, as generation has)
    }
    ops->synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  generate(std::min(o.tokens - 1, 8));  // warm-up: cuBLASLt's plans, lazily sized scratch
  const int steps = o.tokens - 1;
  const double seconds = generate(steps);
  const bool recorded = decoder.recorded();
  const std::string why_not = decoder.why_not_recorded();
  const int fused = decoder.fused_projections();

  // A few steps op by op with device timing per op (a recording would hide them).
  ops->enable_profiling(true);
  generate(o.profile_steps);
  const std::map<std::string, double> profile = ops->collect_profile();
  ops->enable_profiling(false);

  // The bound: every weight the step reads once (the embedding only by rows, unless it is the head) and each
  // row's cache at its mean length over the timed steps.
  double weight_bytes = 0;
  const std::string& head = model->lm_head_name();
  for (const Parameter& w : model->params().all()) {
    if (w.name == "model.embed_tokens.weight" && head != w.name) continue;
    weight_bytes += double(w.value.bytes()) + (w.scale.defined() ? double(w.scale.bytes()) : 0.0);
  }
  const double kv_per_token = double(KvDecoder::kv_cache_bytes(*model, KvDecoder::kBlock)) / KvDecoder::kBlock;
  const double mean_len = o.prompt + 1 + (steps - 1) / 2.0;
  const double step_bytes = weight_bytes + kv_per_token * mean_len * o.rows;
  const double step_s = seconds / steps, bound_s = step_bytes / (o.hbm_gbps * 1e9);
  // Each projection's GEMM alone at this many rows: 20 calls recorded and replayed (device time without launch
  // gaps where the backend records), against the bytes of its weight at --hbm-gbps.
  nlohmann::json gemms = nlohmann::json::array();
  auto time_gemm = [&](const char* name, int64_t in, int64_t out, DType out_dtype) {
    const DType act = ops->activation_dtype();
    const Buffer xb = ops->alloc(size_t(o.rows * in) * dtype_size(act)),
                 wb = ops->alloc(size_t(out * in) * dtype_size(act)),
                 yb = ops->alloc(size_t(o.rows * out) * dtype_size(out_dtype));
    const Tensor x{xb.data(), act, {o.rows, in}, ops->device()}, w{wb.data(), act, {out, in}, ops->device()};
    const Tensor y{yb.data(), out_dtype, {o.rows, out}, ops->device()};
    const int calls = 20;
    auto run = [&] {
      for (int i = 0; i < calls; ++i) ops->linear_forward(y, x, w, nullptr);
    };
    run();  // the plan chosen outside the recording
    std::unique_ptr<Ops::Recorded> rec = ops->record(run);
    ops->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 5; ++r) rec ? rec->replay() : run();
    ops->synchronize();
    const double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (5 * calls) * 1e6;
    const double bytes = double(out * in) * dtype_size(act);
    gemms.push_back({{"name", name},
                     {"in", in},
                     {"out", out},
                     {"us", us},
                     {"gb_per_s", bytes / us * 1e-3},
                     {"share_of_bound", bytes / (o.hbm_gbps * 1e9) / (us * 1e-6)}});
  };
  const int64_t D = mc.hidden_size, F = mc.intermediate_size;
  time_gemm("q", D, mc.q_dim(), ops->activation_dtype());
  time_gemm("k/v", D, mc.kv_dim(), ops->activation_dtype());
  time_gemm("o", mc.q_dim(), D, ops->activation_dtype());
  time_gemm("gate/up", D, F, ops->activation_dtype());
  time_gemm("down", F, D, ops->activation_dtype());
  time_gemm("lm_head", D, mc.vocab_size, DType::F32);
  if (o.lora_rank > 0) {
    time_gemm("lora A (hidden -> r)", D, o.lora_rank, ops->activation_dtype());
    time_gemm("lora B (r -> hidden)", o.lora_rank, D, ops->activation_dtype());
  }
  nlohmann::json ops_ms = nlohmann::json::object();
  for (const auto& [name, ms] : profile) ops_ms[name] = ms / o.profile_steps;  // per decode step
  nlohmann::json r{{"engine", "soltrain"},
                   {"rows", o.rows},
                   {"group", o.group},
                   {"prompt", o.prompt},
                   {"tokens", o.tokens},
                   {"lora_rank", o.lora_rank},
                   {"qlora", o.qlora},
                   {"greedy", o.greedy},
                   {"temperature", o.temperature},
                   {"top_p", o.top_p},
                   {"top_k", o.top_k},
                   {"step_ms", step_s * 1e3},
                   {"tokens_per_s", o.rows / step_s},
                   {"weight_gb", weight_bytes / 1e9},
                   {"kv_gb_per_step", kv_per_token * mean_len * o.rows / 1e9},
                   {"bound_ms", bound_s * 1e3},
                   {"bound_tokens_per_s", o.rows / bound_s},
                   {"share_of_bound", bound_s / step_s},
                   {"recorded", recorded},
                   {"why_not_recorded", why_not},
                   {"fused_projections", fused},
                   {"gemms", gemms},
                   {"profile_ms_per_step", ops_ms}};
  std::cout << r.dump() << std::endl;
  return 0;
}
}  // namespace

std::function<int()> add_bench_decode_command(CLI::App& app) {
  auto o = std::make_shared<DecodeBenchOpts>();
  CLI::App* c = app.add_subcommand("bench-decode", "time the KV-cache decoder's token step (generation, GRPO)");
  c->add_option("--model", o->model, "a model folder (with --random-weights only its config.json is read)")->required();
  c->add_flag("--random-weights", o->random_weights, "draw the weights instead of reading them");
  c->add_option("--rows", o->rows, "sequences decoded together")->capture_default_str();
  c->add_option("--group", o->group, "rows per prompt (GRPO's num_generations): the prompt fed once and shared")
      ->capture_default_str();
  c->add_option("--prompt", o->prompt, "prompt tokens per sequence")->capture_default_str();
  c->add_option("--tokens", o->tokens, "new tokens per sequence")->capture_default_str();
  c->add_option("--lora-rank", o->lora_rank, "LoRA adapters on all seven projections (0: none)")->capture_default_str();
  c->add_option("--qlora", o->qlora, "the LoRA base's storage")
      ->check(CLI::IsMember({"none", "nf4", "int8", "fp8"}))
      ->capture_default_str();
  c->add_flag("--greedy", o->greedy, "argmax instead of sampling");
  c->add_option("--temperature", o->temperature, "sampling temperature (TRL's GRPO default)")->capture_default_str();
  c->add_option("--top-p", o->top_p)->capture_default_str();
  c->add_option("--top-k", o->top_k, "0: no limit")->capture_default_str();
  c->add_option("--hbm-gbps", o->hbm_gbps, "memory bandwidth for the bound, GB/s")->capture_default_str();
  c->add_option("--profile-steps", o->profile_steps, "decode steps timed per op")->capture_default_str();
  add_device_option(c, o->device);
  return [o]() { return run_bench_decode(*o); };
}

}  // namespace soltrain
