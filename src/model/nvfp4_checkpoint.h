// Reading ModelOpt's NVFP4 checkpoints (config.json `quantization_config` {quant_method: modelopt, quant_algo: NVFP4,
// group_size: 16}, as nvidia/*-NVFP4 and surogate/*-NVFP4 releases store them): each quantised `X.weight` U8
// [out, in/2] (two E2M1 codes a byte, the even element in the low nibble) beside `X.weight_scale` F8_E4M3 [out, in/16],
// `X.weight_scale_2` F32 (the tensor scale) and `X.input_scale` F32 (the activations' calibration, unused: the
// GEMMs read the dequantised weight). w = code · (weight_scale_2 · weight_scale) (kernels/quant.h, Nvfp4).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"

namespace soltrain {

// True when config.json declares ModelOpt NVFP4 (another ModelOpt algorithm or group size is one UserError).
bool is_nvfp4_checkpoint(const ModelConfig& c, const std::filesystem::path& dir);
// Whether the checkpoint stores `name` (an X.weight) as NVFP4, and the names of the tensors beside it.
bool stored_as_nvfp4(const CheckpointReader& ckpt, const std::string& name);
std::vector<std::string> nvfp4_side_names(const std::string& weight_name);
// An NVFP4-stored weight as soltrain holds it: codes [out·in / 2] and the scale blob (kernels/quant.h). Wrong dtypes
// or shapes are one UserError naming the tensor.
void read_nvfp4_weight(const CheckpointReader& ckpt, const std::string& name, const Shape& shape,
                       std::vector<uint8_t>& codes, std::vector<uint8_t>& scale);

}  // namespace soltrain
