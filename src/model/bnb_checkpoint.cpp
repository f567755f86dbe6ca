#include "model/bnb_checkpoint.h"

#include <cstring>

#include "core/error.h"
#include "kernels/quant.h"

namespace soltrain {

namespace {
const char* const kStateKeys[] = {".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"};
const char* const kSideSuffixes[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"};

std::string state_name(const CheckpointReader& ckpt, const std::string& name) {
  for (const char* k : kStateKeys)
    if (ckpt.has(name + k)) return name + k;
  return "";
}

nlohmann::json quant_state(const CheckpointReader& ckpt, const std::string& name) {
  const std::string key = state_name(ckpt, name);
  const TensorEntry& e = ckpt.entry(key);
  if (e.dtype != DType::U8) user_error(ckpt.describe(key), ": dtype ", dtype_name(e.dtype), ", expected U8");
  try {
    nlohmann::json j = nlohmann::json::parse(std::string(static_cast<const char*>(e.data), e.bytes));
    if (!j.is_object()) throw std::runtime_error("not an object");
    return j;
  } catch (const std::exception& x) {
    user_error(ckpt.describe(key), ": not bitsandbytes' quant state JSON (", x.what(), ")");
  }
}

// A side tensor of `weight` as fp32, checked to hold `count` values.
std::vector<float> side_f32(const CheckpointReader& ckpt, const std::string& name, int64_t count) {
  if (!ckpt.has(name)) user_error(ckpt.describe(name.substr(0, name.rfind('.'))), ": 4-bit weight without its ", name);
  const TensorEntry& e = ckpt.entry(name);
  if (shape_numel(e.shape) != count)
    user_error(ckpt.describe(name), ": ", shape_numel(e.shape), " values, expected ", count);
  std::vector<float> v(static_cast<size_t>(count));
  read_as_f32(e, e.shape, v.data(), ckpt.describe(name));
  return v;
}
}  // namespace

bool is_bnb_4bit_checkpoint(const ModelConfig& c, const std::filesystem::path& dir) {
  if (!c.raw.contains("quantization_config") || !c.raw["quantization_config"].is_object()) return false;
  const nlohmann::json& q = c.raw["quantization_config"];
  if (q.value("quant_method", std::string()) != "bitsandbytes") return false;
  if (q.value("load_in_8bit", false))
    user_error((dir / "config.json").string(),
               ": quantization_config: a pre-quantised 8-bit bitsandbytes checkpoint is not read yet; train from the "
               "bf16 checkpoint with load_in_8bit: true (soltrain quantises it the same way)");
  return true;
}

bool stored_as_bnb_4bit(const CheckpointReader& ckpt, const std::string& name) {
  return ckpt.has(name) && !state_name(ckpt, name).empty();
}

bool is_bnb_4bit_side_tensor(const CheckpointReader& ckpt, const std::string& name) {
  for (const char* k : kStateKeys)
    if (name.ends_with(k)) return stored_as_bnb_4bit(ckpt, name.substr(0, name.size() - std::strlen(k)));
  for (const char* s : kSideSuffixes)
    if (name.ends_with(s)) return stored_as_bnb_4bit(ckpt, name.substr(0, name.size() - std::strlen(s)));
  return false;
}

Shape bnb_4bit_shape(const CheckpointReader& ckpt, const std::string& name) {
  const nlohmann::json q = quant_state(ckpt, name);
  if (!q.contains("shape") || !q["shape"].is_array())
    user_error(ckpt.describe(state_name(ckpt, name)), ": no \"shape\"");
  Shape s;
  for (const auto& d : q["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      user_error(ckpt.describe(state_name(ckpt, name)), ": shape ", q["shape"].dump(), " is not a list of sizes");
    s.push_back(d.get<int64_t>());
  }
  return s;
}

void read_bnb_4bit_weight(const CheckpointReader& ckpt, const std::string& name, const Shape& shape, float* dst) {
  const nlohmann::json q = quant_state(ckpt, name);
  const std::string where = ckpt.describe(state_name(ckpt, name));
  if (bnb_4bit_shape(ckpt, name) != shape)
    user_error(where, ": shape ", shape_str(bnb_4bit_shape(ckpt, name)), " does not match the expected ",
               shape_str(shape));
  const int64_t n = shape_numel(shape);
  const int64_t block = q.value("blocksize", int64_t(0));
  if (block <= 0) user_error(where, ": blocksize ", q.value("blocksize", nlohmann::json()).dump(), " is not valid");
  const int64_t blocks = (n + block - 1) / block;
  const TensorEntry& packed = ckpt.entry(name);
  if (int64_t(packed.bytes) < (n + 1) / 2)
    user_error(ckpt.describe(name), ": ", packed.bytes, " bytes hold fewer than the ", n, " 4-bit codes of ",
               shape_str(shape));
  const std::vector<float> code = side_f32(ckpt, name + ".quant_map", 16);
  std::vector<float> absmax(static_cast<size_t>(blocks));
  if (ckpt.has(name + ".nested_absmax")) {  // the scales quantised again: 8-bit codes of a dynamic map
    const TensorEntry& a = ckpt.entry(name + ".absmax");
    if (a.dtype != DType::U8 || int64_t(a.bytes) != blocks)
      user_error(ckpt.describe(name + ".absmax"), ": expected ", blocks, " U8 codes (nested quantisation)");
    const int64_t nested_block = q.value("nested_blocksize", int64_t(0));
    if (nested_block <= 0) user_error(where, ": nested_blocksize is not valid");
    const std::vector<float> nested_code = side_f32(ckpt, name + ".nested_quant_map", 256);
    const std::vector<float> nested =
        side_f32(ckpt, name + ".nested_absmax", (blocks + nested_block - 1) / nested_block);
    if (!q.contains("nested_offset") || !q["nested_offset"].is_number()) user_error(where, ": no nested_offset");
    const float offset = q["nested_offset"].get<float>();
    const auto* c = static_cast<const uint8_t*>(a.data);
    // dequantize_blockwise (fp32 code · scale), then + offset, as bitsandbytes restores them
    for (int64_t b = 0; b < blocks; ++b) {
      const float scaled = quant::mul_rn(nested_code[c[b]], nested[size_t(b / nested_block)]);  // (no FMA)
      absmax[size_t(b)] = scaled + offset;
    }
  } else {
    absmax = side_f32(ckpt, name + ".absmax", blocks);
  }
  const auto* bytes = static_cast<const uint8_t*>(packed.data);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = bytes[i / 2];
    const int idx = (i % 2 == 0) ? byte >> 4 : byte & 0xF;
    dst[i] = code[size_t(idx)] * absmax[size_t(i / block)];
  }
}

}  // namespace soltrain
