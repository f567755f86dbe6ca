#include "model/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <set>

#include "io/atomic_file.h"
#include "io/deferred_writes.h"
#include "io/safetensors.h"
#include "kernels/quant.h"
#include "model/bnb_checkpoint.h"
#include "model/checkpoint_check.h"
#include "model/fp8_checkpoint.h"
#include "model/loftq.h"
#include "model/nvfp4_checkpoint.h"

namespace fs = std::filesystem;

namespace soltrain {

CheckpointReader open_model_checkpoint(const fs::path& dir, const ModelConfig& c) {
  if (!c.spec || !c.spec->language_model) return CheckpointReader(dir);
  return CheckpointReader(dir, [&c](const std::string& stored) { return model_tensor_name(c, stored); });
}

std::unique_ptr<Transformer> load_pretrained(const fs::path& dir, Ops& ops, std::optional<LoraConfig> lora,
                                             StoreOptions store, ExpertShare share,
                                             std::optional<AsClassifier> classifier, std::optional<VocabResize> vocab,
                                             size_t* weight_bytes_read) {
  ModelConfig config = load_model_config(dir);
  if (vocab) resize_vocabulary(config, vocab->rows, vocab->mean_resizing);
  if (classifier && classifier->token_labels > 0)
    make_token_classifier(config, classifier->token_labels);
  else if (classifier)
    make_sequence_classifier(config, 1, classifier->pad_token_id);
  else if (config.num_labels > 0)
    refuse_classifier(dir, config);
  check_config_fits_checkpoint(config, open_model_checkpoint(dir, config), dir);  // before anything is allocated
  // (an uneven split is refused with the ranks in view: Transformer::set_expert_parallel)
  if (share.of > 1 && lora && config.moe_layers() > 0 && config.moe.num_experts % share.of == 0) {
    config.moe.held_count = config.moe.num_experts / share.of;
    config.moe.held_first = share.index * config.moe.held_count;
  }
  // A pre-quantised FP8 checkpoint under LoRA keeps its base as stored (QLoRA over FP8 blocks) unless NF4
  // was asked for; without LoRA it is dequantised into the fp32 masters.
  if (is_fp8_block_checkpoint(config, dir) && lora && lora->base_format == WeightFormat::Dense)
    lora->base_format = WeightFormat::Fp8Block;
  // A bitsandbytes 4-bit checkpoint likewise: its base in NF4 (its codes and scales again, requantised from the
  // dequantised values), dequantised into the masters without LoRA.
  if (is_bnb_4bit_checkpoint(config, dir) && lora && lora->base_format == WeightFormat::Dense)
    lora->base_format = WeightFormat::Nf4;
  // A ModelOpt NVFP4 checkpoint keeps its base as stored (QLoRA over NVFP4), dequantised into the masters without LoRA.
  if (is_nvfp4_checkpoint(config, dir) && lora && lora->base_format == WeightFormat::Dense)
    lora->base_format = WeightFormat::Nvfp4;
  if (lora && lora->base_format == WeightFormat::Nvfp4)
    for (const int64_t in : {int64_t(config.hidden_size), int64_t(config.intermediate_size), int64_t(config.q_dim())})
      if (in % quant::kNvfp4Block != 0)
        user_error(dir.string(), ": an NVFP4 base scales blocks of 16 along each row, and this model has projections ",
                   in, " wide");
  auto model = std::make_unique<Transformer>(std::move(config), ops, std::move(lora), store);
  const size_t read = load_weights(*model, dir);
  if (weight_bytes_read) *weight_bytes_read = read;
  // LoftQ (a run that asks for it, or an adapter PEFT initialised so): the base is its NF4 round trip from here on,
  // in a run, a resume (the checkpoint holds the adapter, not the base) and under a saved adapter, as PEFT loads it.
  if (model->lora() && model->lora()->loftq_iter > 0) loftq_initialise(*model, model->lora()->loftq_iter);
  return model;
}

namespace {
// transformers 5's own layout of an MoE layer's experts (save_pretrained(save_original_format=False)): one
// mlp.experts.gate_up_proj [E, 2F, D] (each expert's gate rows, then its up rows) and mlp.experts.down_proj
// [E, D, F] per layer, where the per-expert layout it writes by default has mlp.experts.{e}.gate_proj.weight ....
// read() fills `slice` with expert e's matrix of the parameter named in the per-expert layout, reading each
// stacked tensor once.
struct StackedExperts {
  std::string name;  // the stacked tensor held in `values`
  std::vector<float> values, slice;

  bool read(const CheckpointReader& ckpt, const Parameter& p, const ModelConfig& c, std::set<std::string>& used) {
    int layer = 0, expert = 0;
    char proj[16] = {};
    if (std::sscanf(p.name.c_str(), "model.layers.%d.mlp.experts.%d.%15[a-z_].weight", &layer, &expert, proj) != 3)
      return false;
    const std::string which = proj;
    if (which != "gate_proj" && which != "up_proj" && which != "down_proj") return false;
    const bool down = which == "down_proj";
    const std::string stacked = cat("model.layers.", layer, ".mlp.experts.", down ? "down_proj" : "gate_up_proj");
    if (!ckpt.has(stacked)) return false;
    const int64_t E = c.moe.num_experts, F = c.moe.intermediate_size, D = c.hidden_size;
    if (name != stacked) {
      const Shape shape = down ? Shape{E, D, F} : Shape{E, 2 * F, D};
      values.resize(size_t(shape_numel(shape)));
      read_weight_f32(ckpt, stacked, shape, values.data());
      name = stacked;
      used.insert(stacked);
    }
    const int64_t n = F * D;  // one expert's matrix: gate/up [F, D], down [D, F]
    const int64_t at = down ? expert * n : expert * 2 * n + (which == "up_proj" ? n : 0);
    slice.assign(values.begin() + at, values.begin() + at + n);
    return true;
  }
};

// The embedding or LM head of a resized vocabulary (resize_vocabulary) as transformers' resize_token_embeddings
// leaves it: the stored rows kept (the first ones, when it shrinks); new rows the mean of the stored ones
// (mean_resizing: transformers draws them from N(mean, 1e-9 covariance), within 3e-5 standard deviations of the
// mean) or drawn from normal(0, initializer_range) as _init_weights draws them.
void read_resized_rows(const CheckpointReader& ckpt, const std::string& stored_name, const Parameter& p,
                       const ModelConfig& c, std::vector<float>& rows) {
  const int64_t stored = c.stored_vocab_size, want = p.shape[0], D = p.shape[1];
  std::vector<float> old(size_t(stored * D));
  read_weight_f32(ckpt, stored_name, Shape{stored, D}, old.data());
  rows.assign(old.begin(), old.begin() + std::min(stored, want) * D);
  if (want <= stored) return;
  std::vector<double> mean(size_t(D), 0.0);
  for (int64_t r = 0; r < stored; ++r)
    for (int64_t j = 0; j < D; ++j) mean[size_t(j)] += old[size_t(r * D + j)];
  std::mt19937_64 rng(0x7e5e);
  std::normal_distribution<float> normal(0.0f, float(c.initializer_range));
  for (int64_t r = stored; r < want; ++r)
    for (int64_t j = 0; j < D; ++j)
      rows.push_back(c.mean_resizing ? float(mean[size_t(j)] / double(stored)) : normal(rng));
}
}  // namespace

size_t load_weights(Transformer& model, const fs::path& dir) {
  const CheckpointReader ckpt = open_model_checkpoint(dir, model.config());
  size_t read = 0;  // bytes of the plainly stored weights read (the sliced path's measure)
  std::vector<float> staging, scale_inv;
  std::vector<uint8_t> codes;
  std::set<std::string> used;
  StackedExperts stacked;
  const ModelConfig& c = model.config();
  const bool bnb = is_bnb_4bit_checkpoint(c, dir);  // (its weights are 4-bit codes or plain, never FP8 blocks)
  for (int l = 0; l < c.num_layers; ++l)            // experts held by other ranks (expert parallelism): not missed here
    if (c.is_moe_layer(l))
      for (int e = 0; e < c.moe.num_experts; ++e)
        if (e < c.moe.held_first || e >= c.moe.held_end())
          for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) used.insert(expert_weight_name(l, e, proj));
  for (Parameter& p : model.params().all()) {
    if (is_lora_name(p.name)) continue;  // adapters come from their own files
    if (!ckpt.has(p.name) && stacked.read(ckpt, p, model.config(), used)) {
      model.params().upload(model.ops(), p, stacked.slice.data());
      continue;
    }
    const bool new_bias = c.token_classifier && p.name == "score.bias";
    if (!ckpt.has(p.name) && c.num_labels > 0 && (p.name == model.lm_head_name() || new_bias)) {
      // a causal LM read as a classifier: a new score head, drawn as transformers' _init_weights draws a Linear
      // (its weight normal(0, initializer_range), its bias zero)
      std::mt19937_64 rng(0x5c0e);
      std::normal_distribution<float> normal(0.0f, float(c.initializer_range));
      staging.resize(size_t(shape_numel(p.shape)));
      for (float& x : staging) x = new_bias ? 0.0f : normal(rng);
      model.params().upload(model.ops(), p, staging.data());
      if (new_bias)
        std::cerr << "note: " << p.name << " is new (the checkpoint is a causal LM): zero as transformers makes it\n";
      else
        std::cerr << "note: " << p.name << " is new (the checkpoint is a causal LM): drawn from normal(0, "
                  << c.initializer_range << ") as transformers initialises it\n";
      continue;
    }
    // an untied copy of a tied model's LM head (modules_to_save beside LoRA) starts as the stored embedding
    const std::string stored_name = c.lm_head_from_embedding && p.name == "lm_head.weight" && !ckpt.has(p.name)
                                        ? "model.embed_tokens.weight"
                                        : p.name;
    if (!ckpt.has(stored_name))
      user_error(dir.string(), ": checkpoint has no tensor '", p.name, "' (does config.json match the weights?)");
    used.insert(stored_name);
    if (bnb && stored_as_fp8(ckpt, p.name))
      user_error(ckpt.describe(p.name),
                 ": stored as FP8 blocks, but config.json's quantization_config is "
                 "bitsandbytes (does config.json match the weights?)");
    if (stored_as_fp8(ckpt, p.name)) used.insert(fp8_scale_name(p.name));
    if (stored_as_nvfp4(ckpt, p.name))
      for (const std::string& side : nvfp4_side_names(p.name))
        if (ckpt.has(side)) used.insert(side);
    if (p.format == WeightFormat::Nvfp4 && stored_as_nvfp4(ckpt, p.name)) {  // as stored: no requantising
      std::vector<uint8_t> blob;
      read_nvfp4_weight(ckpt, p.name, p.shape, codes, blob);
      model.params().upload_quantised(model.ops(), p, codes.data(), blob.data());
      continue;
    }
    if (p.format == WeightFormat::Fp8Block && stored_as_fp8(ckpt, p.name)) {  // as stored: no requantising
      read_fp8_weight(ckpt, p.name, p.shape, codes, scale_inv);
      model.params().upload_quantised(model.ops(), p, codes.data(), scale_inv.data());
      continue;
    }
    if (c.stored_vocab_size > 0 &&
        (p.name == "model.embed_tokens.weight" || (p.name == model.lm_head_name() && c.num_labels == 0))) {
      read_resized_rows(ckpt, stored_name, p, c, staging);
      model.params().upload(model.ops(), p, staging.data());
      continue;
    }
    ParameterStore& ps = model.params();
    if (ps.sharded() && p.trainable && p.order.named() && !stored_as_fp8(ckpt, stored_name) &&
        !stored_as_nvfp4(ckpt, stored_name) && !stored_as_bnb_4bit(ckpt, stored_name)) {
      // ZeRO-3: the rank's own elements alone, read from the mapping by their byte range
      const auto [first, count] = ps.owned_part(p);
      const TensorEntry& e = ckpt.entry(stored_name);
      staging.resize(size_t(count));
      read_range_as_f32(e, p.shape, first, count, staging.data(), ckpt.describe(stored_name));
      ps.upload_owned(model.ops(), p, staging.data());
      read += size_t(count) * dtype_size(e.dtype);
      continue;
    }
    staging.resize(size_t(shape_numel(p.shape)));
    read_weight_f32(ckpt, stored_name, p.shape, staging.data());  // FP8 blocks dequantised, NF4 quantised on upload
    ps.upload(model.ops(), p, staging.data());
    read += ckpt.entry(stored_name).bytes;
  }
  // Tied checkpoints sometimes carry lm_head.weight too, and old ones RoPE buffers: transformers ignores
  // them, and so do we. Anything else means config and weights disagree.
  for (const std::string& n : ckpt.names()) {
    if (used.count(n) || n.ends_with("rotary_emb.inv_freq")) continue;
    if (is_bnb_4bit_side_tensor(ckpt, n)) continue;
    if (n == "lm_head.weight" && (c.tie_word_embeddings || c.lm_head_from_embedding || c.num_labels > 0)) continue;
    std::cerr << "warning: " << ckpt.describe(n) << " is not used by " << model.config().architecture << "\n";
  }
  if (const size_t tower = ckpt.outside().size(); tower > 0)
    std::cerr << "note: " << c.architecture << ": its language model trains on text; the other " << tower
              << " tensors (the vision tower) are not loaded, and a saved model carries them over unchanged\n";
  return read;
}

DType model_dtype(const fs::path& model_dir) {
  const ModelConfig config = load_model_config(model_dir);
  for (const char* key : {"dtype", "torch_dtype"})
    if (const auto it = config.raw.find(key); it != config.raw.end() && it->is_string())
      if (const auto t = dtype_from_torch_name(it->get<std::string>())) return *t;
  const CheckpointReader ckpt(model_dir);
  if (is_fp8_block_checkpoint(config, model_dir) || is_nvfp4_checkpoint(config, model_dir)) return DType::BF16;
  for (const std::string& n : ckpt.names())
    if (const DType t = ckpt.entry(n).dtype; t == DType::BF16 || t == DType::F16 || t == DType::F32) return t;
  return DType::F32;
}

void write_pretrained(const Transformer& model, const fs::path& dir, const fs::path& source_dir, DType dtype,
                      size_t max_shard_bytes) {
  // A LoRA run's base is frozen (and only a bf16 copy on the GPU): what it produced is the adapter.
  SOLTRAIN_CHECK(!model.lora(), "write_pretrained on a LoRA model: use save_adapter, then merge_adapter for a folder");
  SOLTRAIN_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16, "save as ", dtype_name(dtype));
  // Every parameter in the checkpoint's conventional (HF registration) order, fetched from the device one
  // at a time as the file is written (never the whole model in host memory).
  std::vector<StreamedTensor> tensors;
  Ops& ops = const_cast<Transformer&>(model).ops();
  const ModelConfig& c = model.config();
  for (const Parameter& p : model.params().all())
    tensors.push_back({checkpoint_name(c, p.name), dtype, p.shape, [&ops, &model, &p, dtype](void* dst) {
                         if (dtype == DType::F32)  // (a background snapshot's fill: queued into its pinned slab)
                           return model.params().download(ops, p, static_cast<float*>(dst), DeferredWrites::queueing());
                         std::vector<float> f32(size_t(shape_numel(p.shape)));
                         model.params().download(ops, p, f32.data());
                         encode_f32(f32.data(), f32.size(), dtype, dst);
                       }});
  // a vision-language model's vision tower, not trained: its tensors as the source folder stores them
  std::optional<CheckpointReader> source;
  if (c.spec->language_model) {
    if (source_dir.empty()) user_error(c.architecture, ": saving it needs the folder its vision tower is read from");
    source.emplace(open_model_checkpoint(source_dir, c));
    for (const std::string& n : source->outside()) {
      const TensorEntry& e = source->outside_entry(n);
      tensors.push_back({n, e.dtype, e.shape, [&e](void* dst) { std::memcpy(dst, e.data, e.bytes); }});
    }
  }
  write_checkpoint_streamed(dir, tensors, max_shard_bytes);
  nlohmann::json cfg = model.config().raw;
  cfg["dtype"] = torch_dtype_name(dtype);
  if (cfg.contains("torch_dtype")) cfg["torch_dtype"] = torch_dtype_name(dtype);  // older readers look here
  cfg.erase("quantization_config");  // an FP8 checkpoint trained in full is saved dequantised
  write_file_atomic(dir / "config.json", cfg.dump(2) + "\n");
  if (!source_dir.empty()) copy_model_side_files(source_dir, dir);
}

void save_pretrained(const Transformer& model, const fs::path& out_dir, const fs::path& source_dir, DType dtype,
                     size_t max_shard_bytes) {
  StagedDir staged(out_dir);
  write_pretrained(model, staged.path(), source_dir, dtype, max_shard_bytes);
  staged.commit();
}

namespace {
void copy_side_files(const fs::path& from, const fs::path& to, bool tokenizer_only) {
  for (const char* f : kModelSideFiles) {
    if (tokenizer_only && std::string_view(f) == "generation_config.json") continue;
    std::error_code ec;
    if (fs::exists(from / f)) fs::copy_file(from / f, to / f, fs::copy_options::overwrite_existing, ec);
    if (ec) user_error((from / f).string(), ": cannot copy (", ec.message(), ")");
  }
}
}  // namespace

void copy_model_side_files(const fs::path& from, const fs::path& to) {
  copy_side_files(from, to, false);
}
void copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  copy_side_files(from, to, true);
}

}  // namespace soltrain
