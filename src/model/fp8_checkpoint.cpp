#include "model/fp8_checkpoint.h"

#include <cstring>

#include "kernels/cpu/quantize.h"
#include "kernels/quant.h"
#include "model/bnb_checkpoint.h"
#include "model/nvfp4_checkpoint.h"

namespace soltrain {

bool is_fp8_block_checkpoint(const ModelConfig& c, const std::filesystem::path& dir) {
  const std::string where = (dir / "config.json").string() + ": quantization_config";
  if (!c.raw.contains("quantization_config") || c.raw["quantization_config"].is_null()) return false;
  const nlohmann::json& q = c.raw["quantization_config"];
  if (!q.is_object()) user_error(where, " is not an object");
  const std::string method = q.value("quant_method", std::string());
  if (method == "bitsandbytes") {
    is_bnb_4bit_checkpoint(c, dir);  // (which refuses an 8-bit one)
    return false;
  }
  if (method == "modelopt") {
    is_nvfp4_checkpoint(c, dir);  // (which refuses another ModelOpt algorithm)
    return false;
  }
  if (method != "fp8")
    user_error(where, ".quant_method \"", method,
               "\" is not supported: soltrain reads FP8 block (quant_method: fp8), bitsandbytes 4-bit and ModelOpt "
               "NVFP4 checkpoints, and quantises bf16/fp32 checkpoints itself (qlora_nf4: true)");
  if (q.contains("fmt") && q["fmt"] != "e4m3")
    user_error(where, ".fmt ", q["fmt"].dump(), " is not supported: expected \"e4m3\"");
  if (q.contains("weight_block_size") && q["weight_block_size"] != nlohmann::json::array({128, 128}))
    user_error(where, ".weight_block_size ", q["weight_block_size"].dump(),
               " is not supported: expected [128, 128] (the Qwen3 FP8 layout)");
  if (q.contains("scale_fmt") && q["scale_fmt"] != "float")
    user_error(where, ".scale_fmt ", q["scale_fmt"].dump(), " is not supported: expected \"float\"");
  return true;
}

std::string fp8_scale_name(const std::string& weight_name) {
  return weight_name + "_scale_inv";
}

bool stored_as_fp8(const CheckpointReader& ckpt, const std::string& name) {
  return ckpt.has(name) && (ckpt.entry(name).dtype == DType::F8E4M3 || ckpt.has(fp8_scale_name(name)));
}

void read_fp8_weight(const CheckpointReader& ckpt, const std::string& name, const Shape& shape,
                     std::vector<uint8_t>& codes, std::vector<float>& scale_inv) {
  const TensorEntry& w = ckpt.entry(name);
  if (shape.size() != 2) user_error(ckpt.describe(name), ": stored as FP8 blocks, but it is not a matrix");
  if (w.dtype != DType::F8E4M3)
    user_error(ckpt.describe(name), ": dtype ", dtype_name(w.dtype), " next to a weight_scale_inv: expected F8_E4M3");
  if (w.shape != shape)
    user_error(ckpt.describe(name), ": shape ", shape_str(w.shape), " does not match the expected ", shape_str(shape));
  const std::string sname = fp8_scale_name(name);
  if (!ckpt.has(sname)) user_error(ckpt.describe(name), ": F8_E4M3 weight without its ", sname);
  const TensorEntry& s = ckpt.entry(sname);
  const int64_t T = quant::kFp8Tile;
  const Shape tiles{(shape[0] + T - 1) / T, (shape[1] + T - 1) / T};
  if (s.shape != tiles)
    user_error(ckpt.describe(sname), ": shape ", shape_str(s.shape), " is not one scale per 128x128 block of ",
               shape_str(shape), " (expected ", shape_str(tiles), "): unsupported block size or scale layout");
  if (s.dtype != DType::F32 && s.dtype != DType::BF16)
    user_error(ckpt.describe(sname), ": dtype ", dtype_name(s.dtype), " is not supported: expected F32 or BF16");
  codes.resize(size_t(shape_numel(shape)));
  std::memcpy(codes.data(), w.data, codes.size());
  scale_inv.resize(size_t(shape_numel(tiles)));
  read_as_f32(s, tiles, scale_inv.data(), ckpt.describe(sname));
}

void read_weight_f32(const CheckpointReader& ckpt, const std::string& name, const Shape& shape, float* dst) {
  if (stored_as_bnb_4bit(ckpt, name)) return read_bnb_4bit_weight(ckpt, name, shape, dst);
  if (stored_as_nvfp4(ckpt, name)) {
    std::vector<uint8_t> codes, scale;
    read_nvfp4_weight(ckpt, name, shape, codes, scale);
    return nvfp4_dequantize(codes.data(), scale.data(), shape[0], shape[1], dst);
  }
  if (!stored_as_fp8(ckpt, name)) return read_as_f32(ckpt.entry(name), shape, dst, ckpt.describe(name));
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
  read_fp8_weight(ckpt, name, shape, codes, scale_inv);
  fp8_block_dequantize(codes.data(), scale_inv.data(), shape[0], shape[1], dst);
}

}  // namespace soltrain
