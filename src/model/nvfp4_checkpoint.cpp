#include "model/nvfp4_checkpoint.h"

#include <cstring>

#include "core/error.h"
#include "kernels/quant.h"

namespace soltrain {

namespace {
std::string base_of(const std::string& weight_name) {
  return weight_name.ends_with(".weight") ? weight_name.substr(0, weight_name.size() - 7) : weight_name;
}
}  // namespace

bool is_nvfp4_checkpoint(const ModelConfig& c, const std::filesystem::path& dir) {
  if (!c.raw.contains("quantization_config") || !c.raw["quantization_config"].is_object()) return false;
  const nlohmann::json& q = c.raw["quantization_config"];
  if (q.value("quant_method", std::string()) != "modelopt") return false;
  const std::string where = (dir / "config.json").string() + ": quantization_config";
  const std::string algo = q.value("quant_algo", std::string());
  if (algo != "NVFP4")
    user_error(where, ".quant_algo \"", algo, "\" is not supported: soltrain reads ModelOpt's NVFP4 checkpoints");
  if (q.contains("group_size") && q["group_size"] != 16)
    user_error(where, ".group_size ", q["group_size"].dump(), " is not supported: NVFP4 scales blocks of 16");
  return true;
}

std::vector<std::string> nvfp4_side_names(const std::string& weight_name) {
  const std::string b = base_of(weight_name);
  return {b + ".weight_scale", b + ".weight_scale_2", b + ".input_scale"};
}

bool stored_as_nvfp4(const CheckpointReader& ckpt, const std::string& name) {
  return ckpt.has(name) && ckpt.entry(name).dtype == DType::U8 && ckpt.has(base_of(name) + ".weight_scale");
}

void read_nvfp4_weight(const CheckpointReader& ckpt, const std::string& name, const Shape& shape,
                       std::vector<uint8_t>& codes, std::vector<uint8_t>& scale) {
  const std::string b = base_of(name), block_name = b + ".weight_scale", tensor_name = b + ".weight_scale_2";
  if (shape.size() != 2 || shape[1] % quant::kNvfp4Block != 0)
    user_error(ckpt.describe(name), ": stored as NVFP4, but it is not a matrix of rows in blocks of 16");
  const TensorEntry& w = ckpt.entry(name);
  const Shape packed{shape[0], shape[1] / 2}, blocks{shape[0], shape[1] / quant::kNvfp4Block};
  if (w.shape != packed)
    user_error(ckpt.describe(name), ": shape ", shape_str(w.shape), " is not NVFP4's packed ", shape_str(packed),
               " for ", shape_str(shape));
  if (!ckpt.has(block_name) || !ckpt.has(tensor_name))
    user_error(ckpt.describe(name), ": NVFP4 codes without ", block_name, " and ", tensor_name);
  const TensorEntry& s = ckpt.entry(block_name);
  if (s.dtype != DType::F8E4M3 || s.shape != blocks)
    user_error(ckpt.describe(block_name), ": ", dtype_name(s.dtype), " ", shape_str(s.shape), " is not F8_E4M3 ",
               shape_str(blocks), " (one scale per 16 values)");
  const TensorEntry& t = ckpt.entry(tensor_name);
  if (t.dtype != DType::F32 || shape_numel(t.shape) != 1)
    user_error(ckpt.describe(tensor_name), ": expected one F32 value (the tensor scale)");
  codes.resize(w.bytes);
  std::memcpy(codes.data(), w.data, w.bytes);
  scale.assign(size_t(quant::nvfp4_scale_bytes(shape[0], shape[1])), 0);
  std::memcpy(scale.data(), t.data, 4);
  std::memcpy(scale.data() + quant::kNvfp4BlockScalesAt, s.data, s.bytes);
}

}  // namespace soltrain
