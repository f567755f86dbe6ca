#include "model/lora_merge.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/format.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/bnb_checkpoint.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/fp8_checkpoint.h"
#include "model/loftq.h"
#include "model/lora.h"
#include "model/moe.h"
#include "model/nvfp4_checkpoint.h"
#include "model/peft_adapter.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {
// fp32 values into `dtype` (the base tensor's) as host bytes.
std::vector<char> encode(const std::vector<float>& v, DType dtype) {
  std::vector<char> out(v.size() * dtype_size(dtype));
  encode_f32(v.data(), v.size(), dtype, out.data());
  return out;
}

// How one base weight changes: W += scale·B·A. Expert adapters (PEFT's ParamWrapper over transformers 5's
// stacked experts) hold A [E·R, in] (expert e's rows e·R ..) and B [rows, R·E] (expert e's column k at k·E + e):
// a per-expert weight takes B's rows [row0, row0 + out) of its expert, a stacked one ([E, rows, in]) every expert.
struct Delta {
  std::string a, b;
  float scale = 0;
  int experts = 0;  // 0: a plain adapter, A [r, in], B [out, r]
  int rank = 0;     // r, or the expert adapter's R
  int expert = -1;  // the per-expert weight's expert; -1: all of a stacked weight
  int64_t row0 = 0;
};

// w [out, in] (+ scale·B·A) for one matrix: expert e's (plain: e ignored), each entry's rank-term dot product
// in double, rounded once to fp32.
void add_delta(float* w, int64_t out, int64_t in, const Delta& d, int e, const std::vector<float>& a,
               const std::vector<float>& b) {
  const int64_t R = d.rank, E = std::max(d.experts, 1), b_cols = R * E;
  const float* a_e = a.data() + (d.experts ? e * R * in : 0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (int64_t k = 0; k < R; ++k)
        s += double(b[size_t((d.row0 + o) * b_cols + k * E + (d.experts ? e : 0))]) * a_e[k * in + i];
      float& x = w[o * in + i];
      x = float(double(x) + double(d.scale) * s);
    }
}
}  // namespace

void merge_adapter(const fs::path& model_dir, const fs::path& adapter_dir, const fs::path& out_dir,
                   size_t max_shard_bytes) {
  const ModelConfig config = load_model_config(model_dir);
  const LoraConfig lora = read_adapter_config(adapter_dir);
  const float scale = lora.scale();
  const CheckpointReader base(model_dir);
  const fs::path adapter_file = adapter_dir / "adapter_model.safetensors";
  if (!fs::exists(adapter_file)) user_error(adapter_dir.string(), ": no adapter_model.safetensors");
  const SafetensorsFile adapter(adapter_file);
  check_adapter_finite(adapter, adapter_file);

  // Which base weights change, and by which adapter, where PEFT puts each target on this model: attention
  // everywhere; an MoE layer's gate/up/down on its experts (Qwen3-MoE) or its shared expert (Qwen2-MoE), a dense
  // MLP layer's where the adapter has them; the router (all-linear on Qwen3-MoE), the shared expert's gate
  // (all-linear on Qwen2-MoE).
  std::map<std::string, Delta> deltas;
  for (int l = 0; l < config.num_layers; ++l) {
    const bool moe = config.is_moe_layer(l);
    for (int t = 0; t < kLoraTargets; ++t) {
      const LoraTarget target = LoraTarget(t);
      if (!lora.targets(target)) continue;
      const bool mlp = target == LoraTarget::gate || target == LoraTarget::up || target == LoraTarget::down;
      const char* proj = kLoraModuleNames[size_t(t)];
      if (mlp && moe && config.moe.lora_on_experts) continue;  // the experts' adapters, below
      if (mlp && moe) {
        deltas[shared_expert_weight_name(l, proj)] = {shared_lora_name(l, proj, false), shared_lora_name(l, proj, true),
                                                      scale, 0, lora.r};
        continue;
      }
      if (mlp && config.moe_layers() > 0 && !adapter.find(checkpoint_name(config, lora_a_name(l, target)))) continue;
      deltas[lora_module_path(l, target) + ".weight"] = {lora_a_name(l, target), lora_b_name(l, target), scale, 0,
                                                         lora.r};
    }
    if (!moe) continue;
    if (lora.shared_expert_gate)
      deltas[cat("model.layers.", l, ".mlp.shared_expert_gate.weight")] = {
          shared_gate_lora_name(l, false), shared_gate_lora_name(l, true), scale, 0, lora.r};
    if (lora.router)
      deltas[cat("model.layers.", l, ".mlp.gate.weight")] = {router_lora_name(l, false), router_lora_name(l, true),
                                                             scale, 0, lora.r};
    if (!config.moe.lora_on_experts) continue;
    const bool gate_up = lora.targets(LoraTarget::gate), down = lora.targets(LoraTarget::down);
    const int E = config.moe.num_experts;
    const int64_t F = config.moe.intermediate_size;
    auto expert_delta = [&](bool is_gate_up, int e, int64_t row0) {
      return Delta{expert_lora_name(l, is_gate_up, gate_up && down, false),
                   expert_lora_name(l, is_gate_up, gate_up && down, true),
                   expert_lora_scale(lora, is_gate_up),
                   E,
                   expert_lora_rank(lora.r, is_gate_up),
                   e,
                   row0};
    };
    const std::string stacked = cat("model.layers.", l, ".mlp.experts.");
    if (gate_up) {
      if (base.has(checkpoint_name(config, stacked + "gate_up_proj")))
        deltas[stacked + "gate_up_proj"] = expert_delta(true, -1, 0);
      for (int e = 0; e < E; ++e) {
        deltas[expert_weight_name(l, e, "gate_proj")] = expert_delta(true, e, 0);
        deltas[expert_weight_name(l, e, "up_proj")] = expert_delta(true, e, F);
      }
    }
    if (down) {
      if (base.has(checkpoint_name(config, stacked + "down_proj")))
        deltas[stacked + "down_proj"] = expert_delta(false, -1, 0);
      for (int e = 0; e < E; ++e) deltas[expert_weight_name(l, e, "down_proj")] = expert_delta(false, e, 0);
    }
  }
  // (the names as the checkpoint and the adapter file have them: a vision-language model's under its language model)
  if (config.spec->language_model) {
    std::map<std::string, Delta> stored;
    for (auto& [name, d] : deltas) {
      d.a = checkpoint_name(config, d.a);
      d.b = checkpoint_name(config, d.b);
      stored[checkpoint_name(config, name)] = d;
    }
    deltas = std::move(stored);
  }
  // Everything is checked before anything is written; then each tensor is produced as the file is
  // written (an unchanged one straight from the mapped base, a merged one computed then): the merged model
  // is never held in memory whole.
  // An FP8 block checkpoint (Qwen3-FP8 layout) merges into bf16: every FP8 weight is dequantised and its
  // scale dropped, so the result is a plain bf16 model (config.json loses its quantization_config).
  const bool fp8 = is_fp8_block_checkpoint(config, model_dir);
  if (is_nvfp4_checkpoint(config, model_dir))
    user_error(model_dir.string(),
               ": merging into a ModelOpt NVFP4 checkpoint is not built (the adapter is saved; merge it "
               "into the bf16 model the checkpoint was quantised from)");
  // So does a bitsandbytes 4-bit checkpoint (as PEFT's merge_and_unload dequantises a 4-bit base).
  const bool bnb = is_bnb_4bit_checkpoint(config, model_dir);
  // The adapters decoded once for the weights that share them (a layer's E experts' per-expert weights share its two
  // expert adapters): the tensors are written one after another, a layer's together, so the last four suffice.
  struct Decoded {
    const SafetensorsFile& file;
    std::string where;
    std::map<std::string, std::vector<float>> held;
    // A and B of one adapter (map entries stay put as others are added; eviction only before a pair's fetch)
    std::pair<const std::vector<float>&, const std::vector<float>&> pair(const Delta& d, const Shape& a_shape,
                                                                         const Shape& b_shape) {
      if ((!held.count(d.a) || !held.count(d.b)) && held.size() + 2 > 4) held.clear();
      return {fetch(d.a, a_shape), fetch(d.b, b_shape)};
    }
    const std::vector<float>& fetch(const std::string& name, const Shape& shape) {
      if (auto it = held.find(name); it != held.end()) return it->second;
      std::vector<float>& v = held[name];
      v.resize(size_t(shape_numel(shape)));
      read_as_f32(file.at(name), shape, v.data(), where + ": " + name);
      return v;
    }
  } decoded{adapter, adapter_file.string(), {}};
  std::set<std::string> used;
  std::vector<StreamedTensor> tensors;
  // A tied model whose embedding or LM head trained beside the adapters (PEFT's two untied copies) merges into an
  // untied one: its lm_head the trained copy, or the stored embedding when only the embedding trained.
  const std::string saved_embed = checkpoint_name(config, "base_model.model.model.embed_tokens.weight"),
                    saved_head = "base_model.model.lm_head.weight",
                    embed_name = checkpoint_name(config, "model.embed_tokens.weight");
  const bool untie = config.tie_word_embeddings && (adapter.find(saved_embed) || adapter.find(saved_head));
  if (untie && !base.has(embed_name)) user_error(base.describe(embed_name), ": the tied model has no embedding");
  for (const std::string& name : base.names()) {
    if (untie && name == "lm_head.weight") continue;  // (a tied checkpoint's stray copy: written below)
    const TensorEntry& e = base.entry(name);
    if (fp8 && name.ends_with("_scale_inv") && stored_as_fp8(base, name.substr(0, name.size() - 10))) continue;
    if (bnb && is_bnb_4bit_side_tensor(base, name)) continue;
    const bool stored_bnb = bnb && stored_as_bnb_4bit(base, name);
    const bool dequantised = (fp8 && stored_as_fp8(base, name)) || stored_bnb;
    const Shape shape = stored_bnb ? bnb_4bit_shape(base, name) : e.shape;  // (4-bit codes are stored packed)
    const DType out_dtype = dequantised ? DType::BF16 : e.dtype;
    // a module trained in full beside the adapters (modules_to_save: embed_tokens, lm_head) replaces the base's
    if (const std::string saved = "base_model.model." + name; adapter.find(saved)) {
      if (adapter.at(saved).shape != e.shape)
        user_error(adapter_file.string(), ": ", saved, " is ", shape_str(adapter.at(saved).shape), ", ", name, " ",
                   shape_str(e.shape));
      used.insert(saved);
      tensors.push_back({name, e.dtype, e.shape, [&adapter, saved, dtype = e.dtype](void* dst) {
                           const TensorEntry& se = adapter.at(saved);
                           std::vector<float> w(size_t(shape_numel(se.shape)));
                           read_as_f32(se, se.shape, w.data(), saved);
                           const std::vector<char> bytes = encode(w, dtype);
                           std::memcpy(dst, bytes.data(), bytes.size());
                         }});
      continue;
    }
    auto it = deltas.find(name);
    if (it == deltas.end() && dequantised) {
      tensors.push_back({name, out_dtype, shape, [&base, name, shape](void* dst) {
                           std::vector<float> w(size_t(shape_numel(shape)));
                           read_weight_f32(base, name, shape, w.data());
                           const std::vector<char> bytes = encode(w, DType::BF16);
                           std::memcpy(dst, bytes.data(), bytes.size());
                         }});
      continue;
    }
    if (it == deltas.end()) {  // unchanged: the bytes as they are
      tensors.push_back({name, e.dtype, e.shape, [&e](void* dst) { std::memcpy(dst, e.data, e.bytes); }});
      continue;
    }
    const Delta& d = it->second;
    const bool all_experts = d.experts && d.expert < 0;  // a stacked [E, rows, in] weight
    if (shape.size() != (all_experts ? 3u : 2u) || (all_experts && shape[0] != d.experts))
      user_error(base.describe(name), ": expected ", all_experts ? "[experts, out, in]" : "a matrix", ", got ",
                 shape_str(shape));
    const int64_t out = shape[shape.size() - 2], in = shape.back(), R = d.rank, E = std::max(d.experts, 1);
    // A [E·R, in]; B [rows, R·E]: a per-expert weight takes `out` of B's rows from row0 (gate_up: 2F rows), the
    // others all of them
    const TensorEntry &ae = adapter.at(d.a), &be = adapter.at(d.b);
    const bool some_rows = d.experts && !all_experts;
    const bool fits = ae.shape == Shape{E * R, in} && be.shape.size() == 2 && be.shape[1] == R * E &&
                      (some_rows ? be.shape[0] >= d.row0 + out : be.shape[0] == out);
    if (!fits)
      user_error(adapter_file.string(), ": ", d.a, " / ", d.b, " are ", shape_str(ae.shape), " / ", shape_str(be.shape),
                 ", which do not fit ", name, " ", shape_str(shape));
    used.insert(d.a);
    used.insert(d.b);
    const Shape a_shape = ae.shape, b_shape = be.shape;
    tensors.push_back({name, out_dtype, shape, [&, name, out, in, d, a_shape, b_shape, out_dtype, shape](void* dst) {
                         std::vector<float> w(size_t(shape_numel(shape)));
                         read_weight_f32(base, name, shape, w.data());
                         // a LoftQ adapter adds to the base's NF4 round trip, as PEFT's load of it does
                         if (lora.loftq_iter > 0 && !d.experts)
                           w = loftq_decompose(w, out, in, lora.r, lora.loftq_iter).q;
                         const auto [a, b] = decoded.pair(d, a_shape, b_shape);
                         if (d.experts && d.expert < 0)
                           for (int x = 0; x < d.experts; ++x) add_delta(w.data() + x * out * in, out, in, d, x, a, b);
                         else
                           add_delta(w.data(), out, in, d, d.expert, a, b);
                         const std::vector<char> bytes = encode(w, out_dtype);
                         std::memcpy(dst, bytes.data(), bytes.size());
                       }});
  }
  if (untie) {
    const TensorEntry& embed = base.entry(embed_name);
    const bool trained = adapter.find(saved_head);
    if (trained) {
      if (adapter.at(saved_head).shape != embed.shape)
        user_error(adapter_file.string(), ": ", saved_head, " is ", shape_str(adapter.at(saved_head).shape),
                   ", the embedding ", shape_str(embed.shape));
      used.insert(saved_head);
    }
    const TensorEntry& from = trained ? adapter.at(saved_head) : embed;
    tensors.push_back({"lm_head.weight", embed.dtype, embed.shape, [&from, dtype = embed.dtype](void* dst) {
                         std::vector<float> w(size_t(shape_numel(from.shape)));
                         read_as_f32(from, from.shape, w.data(), "lm_head.weight");
                         const std::vector<char> bytes = encode(w, dtype);
                         std::memcpy(dst, bytes.data(), bytes.size());
                       }});
  }
  for (const auto& [name, e] : adapter.entries())
    if (!used.count(name))
      user_error(adapter_file.string(), ": tensor '", name, "' does not match a weight of ", model_dir.string());

  StagedDir staged(out_dir);
  write_checkpoint_streamed(staged.path(), tensors, max_shard_bytes);
  if (fp8 || bnb || untie) {
    nlohmann::json cfg = config.raw;
    if (fp8 || bnb) {
      cfg.erase("quantization_config");
      cfg["dtype"] = "bfloat16";
      if (cfg.contains("torch_dtype")) cfg["torch_dtype"] = "bfloat16";
    }
    if (untie) cfg["tie_word_embeddings"] = false;
    if (untie && cfg.contains("text_config") && cfg["text_config"].contains("tie_word_embeddings"))
      cfg["text_config"]["tie_word_embeddings"] = false;
    write_file_atomic(staged.path() / "config.json", cfg.dump(2) + "\n");
  } else {  // (a quantised or untied model's config.json is rewritten above)
    std::error_code ec;
    fs::copy_file(model_dir / "config.json", staged.path() / "config.json", ec);
    if (ec) user_error((model_dir / "config.json").string(), ": cannot copy (", ec.message(), ")");
  }
  copy_model_side_files(model_dir, staged.path());
  staged.commit();
}

}  // namespace soltrain
