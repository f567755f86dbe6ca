// The attention backward's form as a setting (kernels/ops.h, AttentionBackward).
#include "core/error.h"
#include "kernels/ops.h"

namespace soltrain {

AttentionBackward parse_attention_backward(const std::string& s, const std::string& where) {
  if (s == "split") return AttentionBackward::Split;
  if (s == "ordered") return AttentionBackward::Ordered;
  if (s == "atomic") return AttentionBackward::Atomic;
  user_error(where, " is '", s, "': expected split, ordered or atomic");
}

size_t attention_backward_scratch_bytes(AttentionBackward f, int64_t tokens, int64_t docs, int64_t max_seqlen,
                                        int64_t heads, int64_t head_dim) {
  if (f == AttentionBackward::Split || head_dim != 128) return 0;
  // A document's tiles are numbered from start / 64 + its index (cuda/attention_backward_sm90.cu, DqTile):
  // fewer than tokens / 64 + docs + 1 of them.
  const int64_t tiles = (tokens / 64 + docs + 1) * heads, turns = docs * heads * ((max_seqlen + 63) / 64);
  return size_t(tiles) * 64 * 128 * sizeof(float) + size_t(turns) * sizeof(int);
}

const char* attention_backward_name(AttentionBackward f) {
  switch (f) {
    case AttentionBackward::Ordered:
      return "ordered";
    case AttentionBackward::Atomic:
      return "atomic";
    case AttentionBackward::Split:
      break;
  }
  return "split";
}

}  // namespace soltrain
