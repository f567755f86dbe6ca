// Model FLOPs utilisation, counted as PERFORMANCE.md does (PaLM's convention): FLOPs per token of the
// model over the matmul rate measured on the same device, so figures compare with other reports.
#pragma once
#include "kernels/ops.h"
#include "model/config.h"

namespace soltrain {

// 6·N + 12·L·H·hd·T for full fine-tuning, 4·N + 12·L·H·hd·T with LoRA (no base-weight gradients);
// N = parameters in matmuls (every linear layer and the LM head, not the embedding lookup).
double model_flops_per_token(const ModelConfig& c, int seq_len, bool lora);

// The device's matmul rate in TFLOP/s through the backend's own linear op (bf16 8192³ on a GPU, fp32
// 1024³ on the CPU), on random data, median of timed repeats after warm-up.
double measure_matmul_tflops(Ops& ops);

}  // namespace soltrain
