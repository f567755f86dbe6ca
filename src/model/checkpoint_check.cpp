#include "model/checkpoint_check.h"

#include "core/error.h"
#include "model/bnb_checkpoint.h"
#include "model/nvfp4_checkpoint.h"

namespace soltrain {

void check_config_fits_checkpoint(const ModelConfig& c, const CheckpointReader& ckpt,
                                  const std::filesystem::path& dir) {
  const std::string cfg = (dir / "config.json").string();
  const std::string embed = "model.embed_tokens.weight";
  if (ckpt.has(embed)) {
    const Shape& s = ckpt.entry(embed).shape;
    const int rows = c.stored_vocab_size > 0 ? c.stored_vocab_size : c.vocab_size;  // (before a resize)
    if (s.size() != 2 || s[0] != rows || s[1] != c.hidden_size)
      user_error(cfg, ": vocab_size ", rows, " and hidden_size ", c.hidden_size, " disagree with ",
                 ckpt.describe(embed), " of shape ", shape_str(s));
  }
  const std::string last = cat("model.layers.", c.num_layers - 1, ".input_layernorm.weight");
  if (!ckpt.has(last))
    user_error(cfg, ": num_hidden_layers is ", c.num_layers, " but the checkpoint has no tensor '", last,
               "' (does config.json match the weights?)");
  // Parameters the config implies (in double: no overflow), against what the checkpoint holds. LoRA and
  // biases only add to the checkpoint's side, so a config needing more can never load.
  const double D = c.hidden_size;
  const double attention = D * c.num_heads * double(c.head_dim) * 2 + D * c.num_kv_heads * double(c.head_dim) * 2;
  // an MoE layer: its router, E experts and Qwen2-MoE's shared expert with its gate
  const double moe = double(c.moe.num_experts) * (D + 3 * D * c.moe.intermediate_size) +
                     (c.moe.shared_intermediate_size ? 3 * D * c.moe.shared_intermediate_size + D : 0);
  const double needed = c.dense_mlp_layers() * (attention + 3 * D * c.intermediate_size) +
                        c.moe_layers() * (attention + moe) +
                        double(c.stored_vocab_size > 0 ? c.stored_vocab_size : c.vocab_size) * D;
  double held = 0;
  for (const std::string& n : ckpt.names())  // (a bitsandbytes 4-bit weight holds the shape its quant state says)
    if (!is_bnb_4bit_side_tensor(ckpt, n))
      held += double(shape_numel(stored_as_bnb_4bit(ckpt, n) ? bnb_4bit_shape(ckpt, n) : ckpt.entry(n).shape)) *
              (stored_as_nvfp4(ckpt, n) ? 2 : 1);  // (NVFP4: two values a byte)
  if (needed > held)
    user_error(cfg, ": describes a model of at least ", needed, " parameters, but the checkpoint's tensors hold ", held,
               " (does config.json match the weights?)");
}

}  // namespace soltrain
