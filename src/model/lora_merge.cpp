#include "model/lora_merge.h"

#include <cstring>
#include <set>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/fp8_checkpoint.h"
#include "model/lora.h"
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
}  // namespace

void merge_adapter(const fs::path& model_dir, const fs::path& adapter_dir, const fs::path& out_dir,
                   size_t max_shard_bytes) {
  const ModelConfig config = load_model_config(model_dir);
  const LoraConfig lora = read_adapter_config(adapter_dir);
  if (config.moe_layers() > 0)
    for (LoraTarget t : {LoraTarget::gate, LoraTarget::up, LoraTarget::down})
      if (lora.targets(t))
        user_error(adapter_dir.string(), ": merging adapters on ", config.architecture, "'s ",
                   config.moe.lora_on_experts ? "experts" : "shared expert", " (", kLoraModuleNames[size_t(t)],
                   ") is not built yet: load the adapter with the base instead");
  const float scale = lora.scale();
  const CheckpointReader base(model_dir);
  const fs::path adapter_file = adapter_dir / "adapter_model.safetensors";
  if (!fs::exists(adapter_file)) user_error(adapter_dir.string(), ": no adapter_model.safetensors");
  const SafetensorsFile adapter(adapter_file);
  check_adapter_finite(adapter, adapter_file);

  // Which base weights change, and by which A/B pair.
  std::map<std::string, std::pair<std::string, std::string>> deltas;
  for (int l = 0; l < config.num_layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t)
      if (lora.targets(LoraTarget(t)))  // (an MoE model's MLP targets are refused above)
        deltas[lora_module_path(l, LoraTarget(t)) + ".weight"] = {lora_a_name(l, LoraTarget(t)),
                                                                  lora_b_name(l, LoraTarget(t))};
  // Everything is checked before anything is written; then each tensor is produced as the file is
  // written (an unchanged one straight from the mapped base, a merged one computed then): the merged model
  // is never held in memory whole.
  // An FP8 block checkpoint (Qwen3-FP8 layout) merges into bf16: every FP8 weight is dequantised and its
  // scale dropped, so the result is a plain bf16 model (config.json loses its quantization_config).
  const bool fp8 = is_fp8_block_checkpoint(config, model_dir);
  std::set<std::string> used;
  std::vector<StreamedTensor> tensors;
  for (const std::string& name : base.names()) {
    const TensorEntry& e = base.entry(name);
    const bool stored_fp8 = fp8 && stored_as_fp8(base, name);
    if (fp8 && name.ends_with("_scale_inv") && stored_as_fp8(base, name.substr(0, name.size() - 10))) continue;
    const DType out_dtype = stored_fp8 ? DType::BF16 : e.dtype;
    auto it = deltas.find(name);
    if (it == deltas.end() && stored_fp8) {
      tensors.push_back({name, out_dtype, e.shape, [&base, name](void* dst) {
                           const TensorEntry& we = base.entry(name);
                           std::vector<float> w(size_t(shape_numel(we.shape)));
                           read_weight_f32(base, name, we.shape, w.data());
                           const std::vector<char> bytes = encode(w, DType::BF16);
                           std::memcpy(dst, bytes.data(), bytes.size());
                         }});
      continue;
    }
    if (it == deltas.end()) {  // unchanged: the bytes as they are
      tensors.push_back({name, e.dtype, e.shape, [&e](void* dst) { std::memcpy(dst, e.data, e.bytes); }});
      continue;
    }
    if (e.shape.size() != 2) user_error(base.describe(name), ": expected a matrix, got ", shape_str(e.shape));
    const int64_t out = e.shape[0], in = e.shape[1], r = lora.r;
    const auto& [a_name, b_name] = it->second;
    const TensorEntry &ae = adapter.at(a_name), &be = adapter.at(b_name);
    if (ae.shape != Shape{r, in} || be.shape != Shape{out, r})
      user_error(adapter_file.string(), ": ", a_name, " / ", b_name, " are ", shape_str(ae.shape), " / ",
                 shape_str(be.shape), ", expected ", shape_str({r, in}), " / ", shape_str({out, r}));
    used.insert(a_name);
    used.insert(b_name);
    tensors.push_back({name, out_dtype, e.shape, [&, name, out, in, r, out_dtype](void* dst) {
                         const TensorEntry& we = base.entry(name);
                         std::vector<float> w(size_t(out * in)), a(size_t(r * in)), b(size_t(out * r));
                         read_weight_f32(base, name, we.shape, w.data());
                         read_as_f32(ae, {r, in}, a.data(), adapter_file.string() + ": " + a_name);
                         read_as_f32(be, {out, r}, b.data(), adapter_file.string() + ": " + b_name);
                         // W + scale·(B·A), each entry's r-term dot product in double, rounded once to fp32.
                         for (int64_t o = 0; o < out; ++o)
                           for (int64_t i = 0; i < in; ++i) {
                             double d = 0;
                             for (int64_t k = 0; k < r; ++k) d += double(b[size_t(o * r + k)]) * a[size_t(k * in + i)];
                             float& x = w[size_t(o * in + i)];
                             x = float(double(x) + double(scale) * d);
                           }
                         const std::vector<char> bytes = encode(w, out_dtype);
                         std::memcpy(dst, bytes.data(), bytes.size());
                       }});
  }
  for (const auto& [name, e] : adapter.entries())
    if (!used.count(name))
      user_error(adapter_file.string(), ": tensor '", name, "' does not match a weight of ", model_dir.string());

  StagedDir staged(out_dir);
  write_checkpoint_streamed(staged.path(), tensors, max_shard_bytes);
  if (fp8) {
    nlohmann::json cfg = config.raw;
    cfg.erase("quantization_config");
    cfg["dtype"] = "bfloat16";
    if (cfg.contains("torch_dtype")) cfg["torch_dtype"] = "bfloat16";
    write_file_atomic(staged.path() / "config.json", cfg.dump(2) + "\n");
  }
  if (!fp8) {  // (an FP8 base's config.json was rewritten above, dequantised)
    std::error_code ec;
    fs::copy_file(model_dir / "config.json", staged.path() / "config.json", ec);
    if (ec) user_error((model_dir / "config.json").string(), ": cannot copy (", ec.message(), ")");
  }
  copy_model_side_files(model_dir, staged.path());
  staged.commit();
}

}  // namespace soltrain
