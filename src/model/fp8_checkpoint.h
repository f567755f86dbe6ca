// Reading weights that may be stored as FP8 blocks, the layout of the official Qwen3 FP8 releases
// (transformers' "fine-grained FP8"): config.json `quantization_config` {quant_method: fp8, fmt: e4m3,
// weight_block_size: [128, 128]}, each quantised `X.weight` F8_E4M3 [out, in] next to
// `X.weight_scale_inv` [ceil(out/128), ceil(in/128)] in F32 (transformers writes F32; BF16 scales, as later
// Qwen FP8 releases store, are widened exactly). w = fp8 · scale_inv per 128×128 tile.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"

namespace soltrain {

// True when config.json declares FP8 blocks; a quantization_config other than FP8 or bitsandbytes 4-bit
// (model/bnb_checkpoint.h), or FP8 with another block size or format, is a UserError naming the key.
bool is_fp8_block_checkpoint(const ModelConfig& c, const std::filesystem::path& dir);

// The name of a weight's scale tensor, and whether the checkpoint stores `name` as FP8 blocks.
std::string fp8_scale_name(const std::string& weight_name);
bool stored_as_fp8(const CheckpointReader& ckpt, const std::string& name);

// An FP8-stored weight as stored: codes [out·in] and fp32 scale_inv [tiles]. Wrong dtypes or a scale of
// another shape (another block size) are one UserError naming the tensor.
void read_fp8_weight(const CheckpointReader& ckpt, const std::string& name, const Shape& shape,
                     std::vector<uint8_t>& codes, std::vector<float>& scale_inv);

// Any weight as fp32: dequantised when stored as FP8 blocks, bitsandbytes 4-bit or ModelOpt NVFP4 codes, else widened
// (read_as_f32).
void read_weight_f32(const CheckpointReader& ckpt, const std::string& name, const Shape& shape, float* dst);

}  // namespace soltrain
