// Reading weights stored by bitsandbytes in 4 bits: the checkpoints transformers writes after loading a model with
// load_in_4bit (config.json `quantization_config` {quant_method: bitsandbytes, load_in_4bit: true}), as the
// hub's *-bnb-4bit and BNB-NF4 releases are. Each quantised `X.weight` is stored packed (two 4-bit codes a
// byte, the first in the high nibble; bytes of any quant_storage dtype) beside
//   X.weight.absmax          one scale per `blocksize` values: F32, or U8 codes when the scales are quantised
//                            again (compress_statistics: nested_absmax F32 per nested_blocksize scales,
//                            nested_quant_map F32[256], and nested_offset added back);
//   X.weight.quant_map       F32[16], the code's values (NF4 or FP4);
//   X.weight.quant_state.bitsandbytes__nf4 (or __fp4)  U8 bytes of a JSON object: quant_type, blocksize,
//                            dtype, shape, nested_blocksize, nested_offset.
// w = quant_map[code] · absmax[block] in fp32, as bitsandbytes' dequantize_4bit computes it before its cast to
// `dtype`.
#pragma once
#include <string>

#include "io/safetensors.h"
#include "model/config.h"

namespace soltrain {

// True when config.json declares a bitsandbytes 4-bit checkpoint; an 8-bit one (not read yet) is a UserError.
bool is_bnb_4bit_checkpoint(const ModelConfig& c, const std::filesystem::path& dir);

// Whether the checkpoint stores `name` as bitsandbytes 4-bit codes.
bool stored_as_bnb_4bit(const CheckpointReader& ckpt, const std::string& name);

// Whether `name` is one of a 4-bit-stored weight's side tensors (absmax, quant_map, nested_*, quant_state).
bool is_bnb_4bit_side_tensor(const CheckpointReader& ckpt, const std::string& name);

// The weight's shape as its quant_state records it (the stored tensor is the packed bytes).
Shape bnb_4bit_shape(const CheckpointReader& ckpt, const std::string& name);

// A 4-bit-stored weight dequantised to fp32; a shape other than `shape`, a missing or ill-sized side tensor is one
// UserError naming the tensor.
void read_bnb_4bit_weight(const CheckpointReader& ckpt, const std::string& name, const Shape& shape, float* dst);

}  // namespace soltrain
