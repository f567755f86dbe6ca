#include "model/checkpoint.h"

#include <iostream>
#include <set>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/checkpoint_check.h"
#include "model/fp8_checkpoint.h"

namespace fs = std::filesystem;

namespace soltrain {

std::unique_ptr<Transformer> load_pretrained(const fs::path& dir, Ops& ops, std::optional<LoraConfig> lora,
                                             bool gradients) {
  ModelConfig config = load_model_config(dir);
  check_config_fits_checkpoint(config, CheckpointReader(dir), dir);  // before anything is allocated
  // A pre-quantised FP8 checkpoint under LoRA keeps its base as stored (QLoRA over FP8 blocks) unless NF4
  // was asked for; without LoRA it is dequantised into the fp32 masters.
  if (is_fp8_block_checkpoint(config, dir) && lora && lora->base_format == WeightFormat::Dense)
    lora->base_format = WeightFormat::Fp8Block;
  auto model = std::make_unique<Transformer>(std::move(config), ops, std::move(lora), gradients);
  load_weights(*model, dir);
  return model;
}

void load_weights(Transformer& model, const fs::path& dir) {
  const CheckpointReader ckpt(dir);
  std::vector<float> staging, scale_inv;
  std::vector<uint8_t> codes;
  std::set<std::string> used;
  for (Parameter& p : model.params().all()) {
    if (is_lora_name(p.name)) continue;  // adapters come from their own files
    if (!ckpt.has(p.name))
      user_error(dir.string(), ": checkpoint has no tensor '", p.name, "' (does config.json match the weights?)");
    used.insert(p.name);
    if (stored_as_fp8(ckpt, p.name)) used.insert(fp8_scale_name(p.name));
    if (p.format == WeightFormat::Fp8Block && stored_as_fp8(ckpt, p.name)) {  // as stored: no requantising
      read_fp8_weight(ckpt, p.name, p.shape, codes, scale_inv);
      model.params().upload_quantised(model.ops(), p, codes.data(), scale_inv.data());
      continue;
    }
    staging.resize(size_t(shape_numel(p.shape)));
    read_weight_f32(ckpt, p.name, p.shape, staging.data());  // FP8 blocks dequantised, NF4 quantised on upload
    model.params().upload(model.ops(), p, staging.data());
  }
  // Tied checkpoints sometimes carry lm_head.weight too, and old ones RoPE buffers: transformers ignores
  // them, and so do we. Anything else means config and weights disagree.
  for (const std::string& n : ckpt.names()) {
    if (used.count(n) || n.ends_with("rotary_emb.inv_freq")) continue;
    if (n == "lm_head.weight" && model.config().tie_word_embeddings) continue;
    std::cerr << "warning: " << ckpt.describe(n) << " is not used by " << model.config().architecture << "\n";
  }
}

void save_pretrained(const Transformer& model, const fs::path& out_dir, const fs::path& source_dir,
                     size_t max_shard_bytes) {
  // A LoRA run's base is frozen (and only a bf16 copy on the GPU): what it produced is the adapter.
  SOLTRAIN_CHECK(!model.lora(), "save_pretrained on a LoRA model: use save_adapter, then merge_adapter for a folder");
  StagedDir staged(out_dir);
  // Every parameter in the checkpoint's conventional (HF registration) order, fetched from the device one
  // at a time as the file is written (never the whole model in host memory).
  std::vector<StreamedTensor> tensors;
  Ops& ops = const_cast<Transformer&>(model).ops();
  for (const Parameter& p : model.params().all())
    tensors.push_back({p.name, DType::F32, p.shape,
                       [&ops, &model, &p](void* dst) { model.params().download(ops, p, static_cast<float*>(dst)); }});
  write_checkpoint_streamed(staged.path(), tensors, max_shard_bytes);
  nlohmann::json cfg = model.config().raw;
  cfg["dtype"] = "float32";
  cfg.erase("quantization_config");  // an FP8 checkpoint trained in full is saved dequantised
  write_file_atomic(staged.path() / "config.json", cfg.dump(2) + "\n");
  if (!source_dir.empty()) copy_model_side_files(source_dir, staged.path());
  staged.commit();
}

void copy_model_side_files(const fs::path& from, const fs::path& to) {
  for (const char* f : kModelSideFiles) {
    std::error_code ec;
    if (fs::exists(from / f)) fs::copy_file(from / f, to / f, ec);
    if (ec) user_error((from / f).string(), ": cannot copy (", ec.message(), ")");
  }
}

}  // namespace soltrain
