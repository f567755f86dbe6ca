// The activation plan as arithmetic: every buffer a training pass holds for a (rows × seq_len) batch, by
// name, shape and dtype, computed from the config alone. Transformer::plan() allocates exactly this list;
// a plan can also be printed or checked without the weights (a 500k-token Qwen3-8B plan on a laptop).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/lora.h"

namespace soltrain {

// Activation recompute: `none` keeps every layer's activations for backward; `selective` keeps the
// attention side (its recompute would cost a flash-attention forward) and recomputes each layer's MLP
// (norm, gate/up, SwiGLU: 3·F + D values per token, the largest share); `full` keeps only each layer's input
// and recomputes the whole layer before its backward. All three give bitwise-identical results.
// What backward recomputes instead of keeping from forward, each level including the one before: nothing;
// the elementwise outputs (SwiGLU's silu(gate)·up, q and k after their norms and RoPE: ~1-3% of a step for
// ~25% of the activations); the MLP; whole layers (only the layer inputs kept). All give the same bits.
enum class Recompute { None, Elementwise, Selective, Full };
Recompute parse_recompute(const std::string& s, const std::string& where);  // none|elementwise|selective|full
const char* recompute_name(Recompute r);

// Long sequences: the MLP (gate/up, SwiGLU, down; forward, backward and its recompute) runs over the tokens
// in tiles of at most this many, so its [tokens, intermediate] buffers are tile-sized unless recompute
// `none` keeps them for every layer. 0 chooses kTokenTileBytes' worth (token_tile_for).
inline constexpr int64_t kTokenTileAuto = 0;
// The automatic tile: as many tokens as fit one [tile, intermediate] buffer of this size, a multiple of
// 1024. At Qwen3-8B (intermediate 12288, bf16) that is 21504 tokens: its GEMMs (M = 21504, K = 4096) are far
// inside cuBLAS's efficient range (the LM head ran well at 1770-token chunks, transformer.cpp), the six tile
// buffers take 3 GiB, and micro-batches of up to 21504 tokens (every bench/NOTES.md run) stay one tile.
inline constexpr int64_t kTokenTileBytes = int64_t(512) << 20;
// The tile for `tokens` tokens (at most `tokens`) under the setting `token_tile` (0 = automatic).
int64_t token_tile_for(int64_t token_tile, int64_t tokens, int64_t intermediate, DType act);

// The residual stream's dtype: fp32 on the fp32 backend; else the user's setting, or by default fp32 with
// LoRA (adapter gradients read it) and the activation dtype without.
DType residual_dtype_for(DType act, std::optional<DType> setting, bool lora);
// Bytes of fp32 logits the LM head materialises per token chunk. On the GPU the chunk must stay a good GEMM
// shape: 64 MiB chunks (110 tokens at vocab 151936) made the LM head 150 thin GEMMs per step. A trained head
// adds each chunk's weight gradient into its fp32 [vocab, hidden] gradient (a read and a write of it per
// chunk: 5 GB for Qwen3-8B), so it takes 1 GiB of fp32 logits (+0.5 GiB bf16 gradient, ~1770-token chunks);
// a frozen head (LoRA) has no such cost and takes 256 MiB (384 tokens, three 128-row GEMM tiles: 1.1 GiB
// less memory at the same GEMM efficiency). The CPU keeps 64 MiB.
int64_t head_chunk_bytes_for(DType act, bool head_trains);

struct ActivationSettings {
  int rows = 1, seq_len = 1;
  Recompute recompute = Recompute::None;
  DType act = DType::F32, res = DType::F32;  // activation and residual-stream dtypes
  const LoraConfig* lora = nullptr;          // adapters (their saved u and scratch); null: none
  int64_t token_tile = kTokenTileAuto;
  int64_t head_chunk_bytes = int64_t(64) << 20;  // fp32 logits of the LM head's token chunk
  // `offload_activations` (recompute full only): the layer-input checkpoints live in pinned host memory, one
  // copy per layer, and the device keeps a ring of kCheckpointSlots of them (model/transformer.cpp).
  bool offload_checkpoints = false;
  // Expert parallelism's group size (model/expert_parallel.h): an MoE layer's experts' side holds what this
  // rank's experts receive, at most ep_size × its own pairs.
  int expert_parallel = 1;
};

// Device slots of the offloaded checkpoints' ring. Two suffice: forward overwrites a slot one layer after its
// download was queued, and backward prefetches one layer ahead, so each copy has a whole layer's compute to
// hide behind (at 512k tokens of Qwen3-8B a checkpoint is 8 GiB, ~150 ms at 55 GB/s; a layer's forward with
// its attention takes seconds; at 4k tokens 64 MiB, ~1.2 ms, against a few ms of a layer).
inline constexpr int64_t kCheckpointSlots = 2;

// One named buffer: `layers` per-layer entries (0: one tensor, not per layer) backed by `copies` distinct
// allocations (layers when each layer keeps its own, 1 when every layer's entry aliases one: recomputed).
struct PlannedBuffer {
  std::string name;
  Shape shape;
  DType dtype;
  int64_t layers = 0, copies = 1;
  bool checkpoint = false;  // a layer-input checkpoint: what recompute full keeps (offload's candidates)
  // Entries held in pinned host memory besides the `copies` on the device (offloaded checkpoints: layer i's
  // entry is device copy i % copies, and its host copy for i < host_copies).
  int64_t host_copies = 0;
  size_t bytes() const { return size_t(shape_numel(shape)) * dtype_size(dtype); }  // of one copy
  size_t total_bytes() const { return bytes() * size_t(copies); }                  // on the device
  size_t host_bytes() const { return bytes() * size_t(host_copies); }
};

struct ActivationPlan {
  int64_t tokens = 0, tile = 0, head_chunk = 0;
  std::vector<PlannedBuffer> buffers;  // in allocation order
  size_t total_bytes() const;          // on the device, before the arena's alignment padding
  size_t host_bytes() const;           // offloaded checkpoints in host memory (0 without offload)
  const PlannedBuffer* find(const std::string& name) const;
  // The buffers by the size of one copy, largest first (what the memory plan prints).
  std::vector<const PlannedBuffer*> largest() const;
};

ActivationPlan plan_activations(const ModelConfig& c, const ActivationSettings& s);

// "name 4.00 GiB, name 37 x 8.00 GiB (layer inputs), ...": the `n` largest buffers, for the memory plan
// (offloaded checkpoints: "resid 2 x 8.00 GiB (layer inputs; 35 more in host memory)").
std::string describe_largest(const ActivationPlan& p, size_t n);

}  // namespace soltrain
