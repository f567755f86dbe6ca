// The op interface the transformer is written against, once for every backend. The CPU backend
// (fp32 loops + BLAS, cpu/) is the numeric reference; the CUDA backend implements the same interface.
// Shapes use N = tokens of the batch (B*T flattened), D = model width, H/Hkv = query/kv heads.
// "accumulate" means add into the output instead of overwriting it (gradients of shared inputs).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"
#include "kernels/fake_quant.h"
#include "kernels/sampling.h"

namespace soltrain {

// How the attention backward forms dQ where a backend has the choice (the CUDA Hopper kernels at head dim 128,
// cuda/attention_backward_sm90.cu; elsewhere every form runs the one the backend has):
// - split (the default): a dK/dV kernel and a dQ kernel, no float adds across blocks: bitwise repeatable and
//   no scratch (seven products where five suffice);
// - ordered: one kernel adds each key block's share of dQ into fp32 sums, tile by tile in a fixed order:
//   bitwise repeatable, now a few % below split on the H200 (bench/NOTES.md runs 58-62: ordered 399-423 TFLOP/s
//   at 4k-16k, split 413-467 since it launches longest first), with a scratch of 512 bytes per token and query
//   head plus 32 KB per document and query head;
// - atomic: the same adds in any order: the fastest (8-17% over split at 4k-16k, runs 59 and 62), not
//   bitwise repeatable.
enum class AttentionBackward { Split, Atomic, Ordered };
// "split", "ordered" or "atomic"; anything else is a user error naming `where`.
AttentionBackward parse_attention_backward(const std::string& s, const std::string& where);
const char* attention_backward_name(AttentionBackward f);
// The device scratch the Hopper kernels take for `f` over `tokens` tokens in `docs` documents of at most
// `max_seqlen` (0 for split and head dims other than 128): fp32 dQ sums, one 64 x 128 tile (32 KB) per
// 64-query tile of each document and query head, and a counter per tile.
size_t attention_backward_scratch_bytes(AttentionBackward f, int64_t tokens, int64_t docs, int64_t max_seqlen,
                                        int64_t heads, int64_t head_dim);

// Packed sequences: documents [cu_seqlens[i], cu_seqlens[i+1]) of the flattened tokens attend only
// within themselves (causally). A plain batch of B rows of T tokens is {0, T, 2T, ..., B*T}.
struct SeqLayout {
  Tensor cu_seqlens;  // I32 [docs + 1]
  Tensor positions;   // I32 [N], position of each token inside its document (RoPE)
  int max_seqlen = 0;
};

struct AdamWParams {
  float lr;
  double beta1, beta2;  // as given (torch computes 1 - beta and the bias corrections from the Python float)
  float eps, weight_decay;
  int step;                 // 1-based, for bias correction
  float grad_scale = 1.0f;  // gradient clipping's factor, applied as the gradient is read (no extra pass)
  // Clipping decided on the device: with `grad_sumsq` (F64 [1], Σg² over every gradient, on the ops'
  // device) the update itself computes torch's factor max_grad_norm / (‖g‖ + 1e-6), capped at 1, in double,
  // and multiplies it into grad_scale. No host round trip between backward and the update.
  const Tensor* grad_sumsq = nullptr;
  float max_grad_norm = 0;
  // A BF16 master (`bf16_stochastic_round`: no fp32 copy exists) is updated in fp32 and rounded stochastically,
  // element i with the bits stochastic_bits(sr_seed, i) (kernels/stochastic_round.h).
  uint64_t sr_seed = 0;
};

// Muon (Keller Jordan's; torch.optim.Muon, Axolotl's `optimizer: muon`) on one 2-D parameter: momentum with
// Nesterov's look-ahead, orthogonalised by Newton–Schulz, applied with decoupled weight decay.
struct MuonParams {
  float momentum = 0.95f;
  float grad_scale = 1.0f;             // as AdamWParams: clipping's factor, folded into the gradient's read
  const Tensor* grad_sumsq = nullptr;  // ... or decided on the device from Σg²
  float max_grad_norm = 0;
  float eps = 1e-7f;  // the Newton–Schulz input is divided by its Frobenius norm · norm_scale + eps
  float norm_scale = 1.0f;
  int ns_steps = 5;
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;  // the quintic iteration's coefficients
  // Per iteration (ns_steps rows of a, b, c) instead of the one triple: Polar Express's schedule (NorMuon's)
  const float (*coefficients)[3] = nullptr;
  bool nesterov = true;  // false: the iteration's input is the momentum itself (NorMuon's)
};

// NorMuon's extra state and step (Surogate's optimizer: normuon, after modded-nanogpt's NorMuon; arXiv 2510.05491):
// Polar Express's coefficients (arXiv 2505.16932: 5 iterations, safety factor 2e-2, cushion 2) and its input's
// scale, the Frobenius norm times 1.02 plus 1e-6.
inline constexpr float kPolarExpress[5][3] = {{8.156554524902461f, -22.48329292557795f, 15.878769915207462f},
                                              {4.042929935166739f, -2.808917465908714f, 0.5000178451051316f},
                                              {3.8916678022926607f, -2.772484153217685f, 0.5060648178503393f},
                                              {3.285753657755655f, -2.3681294933425376f, 0.46449024233003106f},
                                              {2.3465413258596377f, -1.7097828382687081f, 0.42323551169305323f}};

// A moment stored 8-bit blockwise: U8 codes [n], F32 absmax [ceil(n / 256)], and the F32 [256] map the codes
// index (on the ops' device).
struct Blockwise8 {
  Tensor code, absmax, map;
};

#ifdef __CUDACC__
#define SOLTRAIN_HOST_DEVICE __host__ __device__
#else
#define SOLTRAIN_HOST_DEVICE
#endif
// torch.nn.utils.clip_grad_norm_'s factor from Σg²: max_norm / (‖g‖ + 1e-6) when that is below 1, else 1
// (and 1 when max_norm <= 0: no clipping). One definition for the host and the device, in double.
SOLTRAIN_HOST_DEVICE inline float clip_factor(double sumsq, float max_norm) {
  const double coef = max_norm > 0 ? double(max_norm) / (sqrt(sumsq) + 1e-6) : 1.0;
  return coef < 1.0 ? float(coef) : 1.0f;
}
// The factor an update applies for p's device-side clipping (the CPU reads Σg² directly).
inline float host_clip_factor(const AdamWParams& p) {
  return p.grad_sumsq ? clip_factor(*static_cast<const double*>(p.grad_sumsq->data), p.max_grad_norm) : 1.0f;
}

// Preference optimisation (DPO and relatives): the loss per pair of z = (π_c − π_r) − (ref_c − ref_r), where π
// and ref are the answers' summed log-probs (averaged over their tokens for IPO, as TRL does):
//   sigmoid: −(1−ε)·logσ(βz) − ε·logσ(−βz)     ipo: (z − 1/(2β))²     hinge: relu(1 − βz)
// and two without a reference, on the answers' mean token log-probs π̄:
//   simpo (TRL's CPOTrainer): sigmoid's form on z = π̄_c − π̄_r − γ/β
//   orpo (TRL's ORPOTrainer): −β·logσ(log odds(π̄_c) − log odds(π̄_r)), odds(x) = eˣ / (1 − eˣ)
// The op's loss is pair_scale · Σ_pairs ℓ + nll_alpha · nll_scale · Σ_pairs NLL(chosen): TRL's rpo_alpha term
// (DPO), cpo_alpha (SimPO), ORPO's own NLL term (nll_alpha 1, over the chosen prompt's tokens too): the chosen
// answers' mean token NLL, nll_scale = 1 / their counted tokens.
// kto (TRL's KTOTrainer) is unpaired: a "pair" is an example (its prompt and completion, desirable or not) and its
// KL document (the prompt with another example's completion). With x = π − ref of the example (summed log-probs)
// and kl = max(0, mean over the call's pairs of π − ref of the KL documents) (no gradient through kl):
//   desirable: w_d·(1 − σ(β(x − kl)))     undesirable: w_u·(1 − σ(β(kl − x)))
enum class PreferenceLoss { Sigmoid, Ipo, Hinge, Simpo, Orpo, Kto };
// Losses that need no reference model (its sums are not read).
inline bool reference_free(PreferenceLoss l) {
  return l == PreferenceLoss::Simpo || l == PreferenceLoss::Orpo;
}
struct PreferenceParams {
  PreferenceLoss loss = PreferenceLoss::Sigmoid;
  float beta = 0.1f, label_smoothing = 0, nll_alpha = 0, simpo_gamma = 0.5f;
  float desirable_weight = 1, undesirable_weight = 1;  // KTO's
  // KTO's KL estimate (TRL's calculate_KL); false: loss_type apo_zero_unpaired, the KTO loss with kl 0
  bool kto_kl = true;
  float pair_scale = 1, nll_scale = 0;
};
// Ints per pair of preference_loss's pairs: chosen (KTO: the example), rejected (KTO: its KL document), their
// counted targets, the chosen prompt (or -1), KTO's label (1 desirable, 0 not; 0 for pairs).
inline constexpr int kPairFields = 6;
// The sums preference_loss accumulates (F64 each): Σ ℓ, Σ chosen reward β(π_c − ref_c), Σ rejected reward,
// Σ [chosen reward > rejected reward], Σ π_c, Σ π_r, Σ NLL(chosen) (summed, not averaged), pairs; KTO: the
// rewards and log-probs of desirable examples as chosen, of the others as rejected, the desirable count, Σ kl
// over calls and the calls.
enum PreferenceStat {
  kPrefLoss,
  kPrefRewardChosen,
  kPrefRewardRejected,
  kPrefAccuracy,
  kPrefLogpChosen,
  kPrefLogpRejected,
  kPrefChosenNll,
  kPrefPairs,
  kPrefDesirable,
  kPrefKl,
  kPrefKlCalls,
  kPreferenceStats
};

// A Bradley–Terry reward model's loss (TRL's RewardTrainer) over one micro-batch's pairs, on the score head's
// outputs r (one per sequence: its last scored token's): ℓ = −log σ(r_c − r_r − margin) + center_coef·(r_c + r_r)²,
// averaged over the update's pairs (pair_scale = 1 / pairs), as TRL's per-batch mean.
struct RewardParams {
  float center_coef = 0, pair_scale = 1;
};
// The sums reward_loss accumulates (F64 each): Σ ℓ, Σ [r_c > r_r], Σ (r_c − r_r), Σ r_c, Σ r_r, the smallest and
// the largest reward seen, pairs.
enum RewardStat {
  kRewLoss,
  kRewAccuracy,
  kRewMargin,
  kRewChosen,
  kRewRejected,
  kRewMin,
  kRewMax,
  kRewPairs,
  kRewardStats
};

// GRPO's policy loss (TRL's GRPOTrainer; kernels/policy_math.h has the per-token definitions): ε_low / ε_high
// clip the importance ratio, δ > 0 caps it (TRL's `delta`), β weighs the k3 KL to the reference.
// `sequence_level`: one importance weight per completion (the mean log ratio of its tokens: GSPO).
struct PolicyLossParams {
  float epsilon_low = 0.2f, epsilon_high = 0.2f, delta = 0, beta = 0;
  bool sequence_level = false;
  // TRL's use_bias_correction_kl (its default): the KL term times the importance ratio (before δ's cap), which
  // makes its gradient the unbiased reverse-KL one; the ratio's derivative counts even where its value is 1.
  bool kl_ratio = true;
};
// The sums policy_loss accumulates (F64 each): Σ scale·ℓ (the loss), the micro-batch's KL mean (Σ KL / tokens,
// the KL times the ratio with kl_ratio, as TRL logs it),
// its clip ratios (low, high, region: means over its tokens, or over its completions with sequence-level
// weights), the smallest completion's low-clip ratio and the largest's high-clip ratio (TRL's low_min and
// high_max), and its counted tokens. With `accumulate` each is added to the previous micro-batches' (the driver
// divides the means by their count, as TRL averages its per-micro-batch values).
enum PolicyStat {
  kPolicyLoss,
  kPolicyKl,
  kPolicyClipLow,
  kPolicyClipHigh,
  kPolicyClipRegion,
  kPolicyClipLowMin,
  kPolicyClipHighMax,
  kPolicyTokens,
  kPolicyStats
};

// How a weight is stored for the matmuls that read it. Dense: plain values in the tensor's dtype (the
// activation dtype on the GPU, fp32 on the CPU). The quantised formats hold a frozen base (QLoRA; the layouts
// and their arithmetic are kernels/quant.h): Nf4: `data` U8 [ceil(out·in / 2)] packed codes, `scale` U8, the
// byte blob of Nf4Layout (absmax codes, nested absmax, their mean, the map); Fp8Block: `data` F8E4M3
// [out, in], `scale` F32 [ceil(out/128), ceil(in/128)] (scale_inv, what the checkpoints store); Int8Row
// (LLM.int8, load_in_8bit): `data` U8 [out, in] holding int8 codes, `scale` F32 [out] (each row's absmax); Nvfp4
// (ModelOpt's NVFP4, qlora_fp4): `data` U8 [out·in / 2] packed E2M1 codes, `scale` U8, its blob (the tensor scale, then
// the E4M3 block scales). A backend dequantises a quantised weight into scratch in the activation dtype, one weight at
// a time, and runs its dense GEMM on that: never the whole model.
enum class WeightFormat { Dense, Nf4, Fp8Block, Int8Row, Nvfp4 };
struct Weight {
  Tensor data;
  WeightFormat format = WeightFormat::Dense;
  Tensor scale;  // the format's scales; empty for Dense
  Shape shape;   // the logical [out, in] (data's own shape for Dense)
  Weight(const Tensor& dense) : data(dense), shape(dense.shape) {}  // NOLINT: a dense tensor is a weight
  Weight(const Tensor& d, WeightFormat f, const Tensor& s, Shape logical)
      : data(d), format(f), scale(s), shape(std::move(logical)) {}
  int64_t out() const { return shape[0]; }
  int64_t in() const { return shape[1]; }
};
inline std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::Nf4: return "nf4";
    case WeightFormat::Fp8Block: return "fp8";
    case WeightFormat::Int8Row: return "int8";
    case WeightFormat::Nvfp4: return "nvfp4";
  }
  return "?";
}

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  // The dtype of activations and of the weights' compute copy: F32 on CPU, BF16 on CUDA. Gradients of
  // parameters, master weights, optimizer moments, norms' rstd and attention's lse are always F32.
  virtual DType activation_dtype() const = 0;
  virtual Buffer alloc(size_t bytes) = 0;                   // zeroed
  virtual void copy(Tensor dst, const Tensor& src) = 0;     // same dtype; either side may be host memory
  virtual void convert(Tensor dst, const Tensor& src) = 0;  // device tensors, F32 <-> activation dtype
  virtual void zero(Tensor t) = 0;
  virtual void synchronize() {}  // wait for queued work (timing only)

  // Streams. Main runs the step; Side runs what per-layer hooks queue (communication, prefetch, offload
  // copies) so it overlaps compute; Upload carries host-to-device copies (offload_weights' layers, the offloaded
  // update's pieces) apart from Side's device-to-host ones, so that PCIe moves both directions at once. Work on
  // one stream is ordered; across streams only by wait() and marks. The CPU backend runs every op as it is
  // called, so there all are the same and these do nothing.
  enum class Stream { Main, Side, Upload };
  virtual void use_stream(Stream) {}                       // where the ops called next are queued
  virtual void wait(Stream /*waiter*/, Stream /*on*/) {}   // waiter's later work starts after on's queued work
  virtual void* native_stream(Stream) { return nullptr; }  // cudaStream_t, for libraries (NCCL)
  // Host memory the device copies from asynchronously (pinned on CUDA), and such a copy: it is queued and
  // returns at once, so `src` must stay unchanged until host_wait(mark()) taken after it returns.
  virtual Buffer alloc_host(size_t bytes) { return Buffer::host(bytes); }
  virtual void upload_async(Tensor dst, const Tensor& src) { copy(dst, src); }
  // The other direction: `dst` (such host memory) is complete only after host_wait(mark()) taken after it, or
  // for later work on the current stream; unlike copy(), nothing waits here (offload's write-back overlaps).
  virtual void download_async(Tensor dst, const Tensor& src) { copy(dst, src); }
  // A device-to-host copy for a snapshot: `queued` (into alloc_host memory) it is download_async's, complete
  // once a fence() taken after it has returned; otherwise copy()'s. Host sources are always copied at once.
  void copy_to_host(Tensor dst, const Tensor& src, bool queued) {
    if (queued && src.device != Device::CPU)
      download_async(dst, src);
    else
      copy(dst, src);
  }
  // A recorded run of ops, replayed as one unit with the same buffers (a CUDA graph: one launch for what were
  // hundreds). record() calls `ops` once, recording what it queues on the current stream instead of running it
  // (nothing runs until replay()). It returns null where the backend records nothing (the CPU runs ops as they
  // are called; CUDA while profiling, or when an op inside could not be recorded: `why`, when given, says
  // which): the caller then calls its ops itself. What the ops read must stay at the same addresses while the
  // recording is used, and they must not wait on the host (lazily grown scratch is grown by an earlier run).
  class Recorded {
   public:
    virtual ~Recorded() = default;
    virtual void replay() = 0;
  };
  virtual std::unique_ptr<Recorded> record(const std::function<void()>& ops, std::string* why = nullptr) {
    (void)ops;
    if (why) *why = "this backend runs ops as they are called";
    return nullptr;
  }
  // A point in the current stream's queue as a callable that blocks until the device has passed it, callable
  // once from any thread (a background checkpoint's writer waits there for the snapshot's queued copies).
  virtual std::function<void()> fence() {
    return [] {};
  }
  virtual uint64_t mark() { return 0; }  // a point in the current stream's queue
  virtual void host_wait(uint64_t) {}    // returns once the device has passed that point
  // The current stream's later work starts after `mark` (taken on any stream): a finer wait() that orders
  // one piece of another stream's work, not all of it (a layer's gathered weights, not every layer's).
  virtual void wait_mark(uint64_t) {}
  virtual double memory_used_gib() const { return 0.0; }  // device memory in use (all processes)
  // The device's memory in all, and free now (0 where the backend does not know: the CPU's is the host's).
  virtual double memory_total_gib() const { return 0.0; }
  virtual double memory_free_gib() const { return 0.0; }
  // Per-op device time: enable, run, then collect milliseconds by op name (empty where unsupported).
  virtual void enable_profiling(bool) {}
  virtual std::map<std::string, double> collect_profile() { return {}; }

  // out[n] = table[ids[n]]; backward: dtable[ids[n]] += dout[n], accumulated deterministically, except where
  // ids[n] is padding_idx (torch's nn.Embedding padding_idx: that row gets no gradient). out and dout are in the
  // residual stream's dtype.
  virtual void embedding_forward(Tensor out, const Tensor& ids, const Tensor& table) = 0;
  virtual void embedding_backward(Tensor dtable, const Tensor& ids, const Tensor& dout, int32_t padding_idx = -1) = 0;

  // y[N,out] = alpha · x[N,in] · w[out,in]ᵀ (+ bias[out]), or with `accumulate` added onto y. The alpha and
  // the accumulation ride on the GEMM (LoRA's scale and its B product cost no extra pass over y).
  // The weight's storage format is the weight's own (Weight); x and y are in the activation dtype.
  virtual void linear_forward(Tensor y, const Tensor& x, const Weight& w, const Tensor* bias, float alpha = 1.0f,
                              bool accumulate = false) = 0;
  // dx (= or +=) dx_alpha · dy · w;  dw += dyᵀ · x;  dbias += Σₙ dy. Null outputs are skipped. dx_alpha rides
  // on the GEMM (LoRA's scale on its A-side gradient: one rounding, no extra pass).
  virtual void linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, Tensor* dbias, const Tensor& dy,
                               const Tensor& x, const Weight& w, float dx_alpha = 1.0f) = 0;

  // FP8 GEMMs (the fp8-hybrid recipe, model/fp8_recipe.h). A per-tensor FP8 operand is its codes (F8E4M3 or
  // F8E5M2) with an F32 [4] `scale` record on the device, 16-byte aligned: {scale_inv, scale, unused, unused};
  // the codes are round_sat(x · scale) and stand for codes · scale_inv (scale_inv first: cuBLASLt reads it
  // through an aligned pointer). Scales never come back to the host: the step stays free of syncs.
  //
  // fp8_quantize: out (= codes of x [R, C], when defined) and out_t (= codes of xᵀ [C, R], when defined) in
  // the dtype each has, scaled by s.scale. With s.current, scale is first set from this x's own max|x|
  // (current scaling: scale = fp8_max / amax; 1 when amax is 0 or not finite); otherwise the scale already
  // there is used (delayed scaling). max|x| is max-ed into s.amax when it is defined (delayed scaling's
  // history slot 0). Rounding is kernels/quant.h's, saturating: every backend's codes are bitwise equal.
  struct Fp8Scaling {
    Tensor scale;  // F32 [4]: {scale_inv, scale, -, -}
    Tensor amax;   // F32 [1] or empty
    bool current = false;
  };
  virtual void fp8_quantize(Tensor /*out*/, Tensor /*out_t*/, const Tensor& /*x*/, const Fp8Scaling& /*s*/) {
    throw std::logic_error(fp8_unsupported());
  }
  // y[M, N] (= or += with accumulate) = alpha · (a · a_scale_inv)[M, K] · (b · b_scale_inv)[N, K]ᵀ (+ bias[N]),
  // a and b FP8 codes (not both E5M2), a_scale / b_scale their scale records; y bf16, or F32 on the CPU
  // and for weight gradients. `precise` keeps fp32 accumulation throughout (Hopper's fast FP8 accumulation
  // is used only without it: the forward GEMMs; dgrad and wgrad are precise, as TransformerEngine runs them).
  virtual void fp8_matmul(Tensor y, const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                          const Tensor* bias, float alpha, bool accumulate, bool precise) {
    (void)y, (void)a, (void)a_scale, (void)b, (void)b_scale, (void)bias, (void)alpha, (void)accumulate, (void)precise;
    throw std::logic_error(fp8_unsupported());
  }
  // Delayed scaling's update (TransformerEngine's DelayedScaling, amax_compute_algo "max") for Q tensors at
  // once: history [Q, H] (slot 0 holds this step's amax), scales [Q, 4] (records as above). Per q: amax = max over the
  // window; the window rolls (slot i ← i+1, the last ← old slot 0, slot 0 ← 0); if amax is finite and > 0, scale =
  // fp8_max · 2^-margin / amax (inf clamped to FLT_MAX) and scale_inv = 1 / scale, else both are kept.
  virtual void fp8_update_scales(Tensor /*history*/, Tensor /*scales*/, float /*fp8_max*/, int /*margin*/) {
    throw std::logic_error(fp8_unsupported());
  }
  // Empty when this backend runs fp8_matmul, else why not (one line naming what is needed).
  virtual std::string fp8_unsupported() const { return "this backend has no FP8 operations"; }

  // out [out, in] (activation dtype) = a quantised weight's values (kernels/quant.h: fp32 arithmetic, then
  // rounded once to the activation dtype); what the linear ops run on before their dense GEMM.
  virtual void dequantize(Tensor out, const Weight& w) = 0;

  // Quantisation-aware training (kernels/fake_quant.h): out = x fake-quantised by `q` along x's last dim (x [R, C],
  // C a multiple of the group; out in x's dtype, may not alias it). Nvfp4 needs `amax` (F32 [1] on the device) for
  // its per-tensor scale.
  virtual void fake_quantize(Tensor out, const Tensor& x, const FakeQuant& q, Tensor amax) = 0;
  // dx (= or +=) the gradient through fake_quantize given g = d loss / d out: straight through, masked where the
  // clamp bound (Int8Token, Int4Weight), plus Int4Weight's terms at each group's max and min. With dx and g the same
  // tensor (not accumulating) the mask applies in place; masking again what it masked changes nothing.
  virtual void fake_quantize_backward(Tensor dx, bool accumulate, const Tensor& g, const Tensor& x,
                                      const FakeQuant& q) = 0;

  // Row-wise over the last dim C of x [R, C]: y = x / sqrt(mean(x²) + eps) * w; rstd [R] saved. x may be in
  // the residual stream's dtype (fp32 next to bf16 activations), y is in the activation dtype.
  virtual void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) = 0;
  // dx (= or +=), dw += (skipped when dw is undefined: a frozen weight). x and dx may be the residual
  // stream's dtype (fp32 next to bf16 activations); then dx_rounded, when given, receives dx's new value in
  // the activation dtype too (what the GEMMs of the layer below read) in the same pass.
  virtual void rmsnorm_backward(Tensor dx, bool accumulate_dx, Tensor dw, const Tensor& dy, const Tensor& x,
                                const Tensor& w, const Tensor& rstd, Tensor dx_rounded = {}) = 0;

  // In place on x [N, heads, hd], half-rotation layout (pairs i, i + hd/2); inverse = the backward.
  virtual void rope(Tensor x, const SeqLayout& seq, const Tensor& inv_freq, bool inverse) = 0;

  // Fused forms. The defaults run the separate ops in turn and define the result; a backend may do the
  // same work in one pass (the CUDA backend does), matching them within rounding.
  //
  // The residual add and the RMSNorm that follows it: sum = a + b (in the residual stream's dtype, a's; b in
  // the activation dtype), then rmsnorm_forward(y, rstd, sum, w, eps). sum may be a (the add in place).
  virtual void add_rmsnorm_forward(Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,
                                   float eps) {
    if (sum.data != a.data) copy(sum, a);
    add_inplace(sum, b);
    rmsnorm_forward(y, rstd, sum, w, eps);
  }
  // Qwen3's per-head q/k norm and then RoPE: y = rope(rmsnorm(x) · w) on x [N, heads, hd], rstd [N·heads].
  virtual void qk_norm_rope_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, const SeqLayout& seq,
                                    const Tensor& inv_freq, float eps) {
    rmsnorm_forward(y, rstd, x, w, eps);
    rope(y, seq, inv_freq, false);
  }
  // Its backward: dy is rotated back in place (and left so), then rmsnorm_backward(dx, false, dw, dy, ...).
  virtual void qk_norm_rope_backward(Tensor dx, Tensor dw, Tensor dy, const Tensor& x, const Tensor& w,
                                     const Tensor& rstd, const SeqLayout& seq, const Tensor& inv_freq) {
    rope(dy, seq, inv_freq, true);
    rmsnorm_backward(dx, false, dw, dy, x, w, rstd);
  }

  // The widest head the attention ops serve on this backend (models with wider heads are refused at load).
  virtual int64_t max_attention_head_dim() const { return std::numeric_limits<int64_t>::max(); }

  // Causal attention within documents. q [N,H,hd], k/v [N,Hkv,hd], out [N,H,hd], lse [H,N] (natural log
  // of each softmax denominator, fp32, saved for backward). Query head h reads kv head h / (H/Hkv).
  virtual void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const SeqLayout& seq, float scale) = 0;
  virtual void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const SeqLayout& seq,
                                  float scale) = 0;
  // The form attention_backward uses from now on (the setting `attention_backward`); backends with one form
  // ignore it.
  virtual void set_attention_backward(AttentionBackward) {}
  // The form the backend runs (where an environment setting won over set_attention_backward, that one).
  virtual AttentionBackward attention_backward_form() const { return AttentionBackward::Split; }

  // Decoding's KV cache is paged: a layer's keys (and values) are a pool of blocks [P, bs, Hkv, hd], and
  // sequence b's position p lives in block table[b, p / bs] at row p % bs (table I32 [B, nb] on the ops'
  // device, nb · bs positions a sequence at most). Sequences may share blocks (a prompt fed once for its group);
  // entries past a sequence's length are not read. lens [B] (I32, on the ops' device) is each sequence's length
  // after the new tokens.
  //
  // The new tokens' keys and values into each sequence's blocks, one call for every sequence: k/v
  // [B*Tq, Hkv, hd] (sequence b's rows b*Tq ..); token t of sequence b goes to position lens[b] − Tq + t.
  virtual void kv_append(Tensor k_pool, Tensor v_pool, const Tensor& k, const Tensor& v, const Tensor& lens,
                         const Tensor& table) = 0;

  // New query tokens against the cache, which already holds the new tokens' keys and values. q/out
  // [B*Tq, H, hd] (sequence b's queries are rows b*Tq ..). Query t of sequence b sits at position lens[b] − Tq + t
  // and attends to positions [0, that position] (causal within the new tokens too, so a whole prompt is one
  // call); GQA as above, fp32 softmax.
  virtual void attention_decode(Tensor out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                const Tensor& lens, const Tensor& table, float scale) = 0;

  // Decoding: one token drawn per row from logits (F32 [B,V]; the repetition penalty rewrites them in place) into
  // ids (I32 [B], on the ops' device), with the settings and order of kernels/sampling.h. seen (U8 [B,V], or
  // empty when p.repetition_penalty is 1) flags the tokens each row already holds: their logits are penalised,
  // and the drawn token is flagged. Row b draws sample_uniform(p.seed + b, step) and takes, in token order, the
  // first kept token where the running kept probability exceeds it (greedy: the first largest logit).
  // logprobs (F32 [B], or empty) receives the drawn token's log-probability under the distribution it was drawn
  // from (vLLM's processed_logprobs, which TRL's importance-sampling correction reads): log softmax of the penalised
  // logits / temperature renormalised over the kept set; greedy: log softmax of the penalised logits.
  virtual void sample_tokens(Tensor ids, Tensor logits, Tensor seen, const SamplingParams& p, uint64_t step,
                             Tensor logprobs = {}) = 0;
  // seen[b, ids[b·T + t]] = 1 for the T tokens of each row b of seen (U8 [B,V]); ids I32 [B·T].
  virtual void flag_tokens(Tensor seen, const Tensor& ids) = 0;
  // Decoding: each row's drawn token becomes its next input, fed at the row's length. I32 [B] each, on the ops'
  // device: ids[b] = drawn[b], positions[b] = lens[b], lens[b] += 1. Keeps a decode step's inputs on the device
  // (nothing uploaded per token), so the step can be recorded once and replayed (record()).
  virtual void advance_decode(Tensor ids, Tensor positions, Tensor lens, const Tensor& drawn) = 0;

  // Decoding's q, k and v from one GEMM over the three weights stored side by side: qkv [N, (H + 2·Hkv)·hd] holds
  // each token's q, k and v projections in that order, for B = table.dim(0) sequences of Tq = N / B new tokens
  // (sequence b's rows b·Tq ..). q [N, H, hd] receives qk_norm_rope_forward of the q part with q_norm's weight
  // (rope alone when q_norm is undefined), the k part the same with k_norm, and the rotated k part and the v part
  // go into the pools as kv_append puts them (lens: each sequence's length after the new tokens). positions [N]
  // (I32) are RoPE's. head_dim a multiple of 4, at most 256. For inference: no rstd is saved; qkv may be
  // overwritten.
  virtual void decode_qkv(Tensor q, Tensor k_pool, Tensor v_pool, Tensor qkv, const Tensor& q_norm,
                          const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq, float eps,
                          const Tensor& lens, const Tensor& table) = 0;

  // out = silu(gate) * up; backward writes dgate, dup.
  virtual void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) = 0;
  // The same over one GEMM's output for gate and up stored side by side: gate_up [N, 2F] holds each token's gate
  // (columns 0 .. F) then up; out [N, F]. The default runs swiglu_forward row by row.
  virtual void swiglu_packed_forward(Tensor out, const Tensor& gate_up) {
    const int64_t N = out.dim(0), F = out.dim(1);
    SOLTRAIN_CHECK(gate_up.numel() == 2 * N * F, "swiglu_packed_forward shapes");
    const size_t e = dtype_size(out.dtype);
    for (int64_t n = 0; n < N; ++n) {
      char* row = static_cast<char*>(gate_up.data) + size_t(2 * n * F) * e;
      swiglu_forward(out.rows(n, n + 1), Tensor{row, gate_up.dtype, {1, F}, gate_up.device},
                     Tensor{row + size_t(F) * e, gate_up.dtype, {1, F}, gate_up.device});
    }
  }
  virtual void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) = 0;

  // Mixture-of-Experts (model/moe.h). N tokens, E experts, each token routed to k of them; the N·k (token,
  // choice) pairs are "sorted" into expert order for the experts' GEMMs and back. A backend that cannot route
  // this many experts says why in moe_unsupported() (the model then refuses the model in one line).
  virtual std::string moe_unsupported(int /*experts*/, int /*top_k*/) const { return ""; }
  // probs (F32 [N,E]) = softmax(logits [N,E]); expert (I32 [N,k]) its k largest, largest first (ties: the
  // lower expert); weight (F32 [N,k]) their probabilities, divided by their sum with norm_topk (Qwen3-MoE's
  // norm_topk_prob); prob_sum (F32 [E]) += Σ over tokens of probs (the load-balancing loss's statistic).
  virtual void moe_route(Tensor probs, Tensor expert, Tensor weight, Tensor prob_sum, const Tensor& logits,
                         bool norm_topk) = 0;
  // The pairs sorted by expert, stably (token, then choice, within an expert): rows (I32 [N·k]) the token of
  // each sorted pair, slot (I32 [N·k]) the sorted position of pair n·k + j, offsets (I32 [E+1]) where each
  // expert's pairs start; counts (F32 [E]) += the pairs per expert. No host sync.
  virtual void moe_permute(Tensor rows, Tensor slot, Tensor offsets, Tensor counts, const Tensor& expert) = 0;
  // out[i] = x[rows[i]] (activation dtype).
  virtual void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) = 0;
  // out[n] = Σ_j weight[n,j] · y[slot[n·k + j]], j in order; y [N·k, D] in expert order.
  virtual void moe_combine(Tensor out, const Tensor& y, const Tensor& slot, const Tensor& weight) = 0;
  // Its backward: dy[slot[n·k + j]] = weight[n,j] · dout[n]; dweight (F32 [N,k]) = dout[n] · y[slot[n·k + j]].
  virtual void moe_combine_backward(Tensor dy, Tensor dweight, const Tensor& dout, const Tensor& y, const Tensor& slot,
                                    const Tensor& weight) = 0;
  // dx[n] (= or +=) Σ_j dxs[slot[n·k + j]]: gather_rows' backward without atomics, in a fixed order.
  virtual void moe_unpermute_sum(Tensor dx, bool accumulate, const Tensor& dxs, const Tensor& slot) = 0;
  // The experts' projections: rows [offsets[e], offsets[e+1]) of x [M,in] times w[e]ᵀ (w [E,out,in]), times
  // alpha, into y [M,out] (= or +=).
  virtual void grouped_linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& offsets,
                                      float alpha = 1.0f, bool accumulate = false) = 0;
  // dx (= or +=) alpha · dy · w[e] per expert's rows; dw[e] += alpha · dy_eᵀ · x_e (F32 [E,out,in]); either may
  // be null.
  virtual void grouped_linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, const Tensor& dy, const Tensor& x,
                                       const Tensor& w, const Tensor& offsets, float alpha = 1.0f) = 0;
  // y[rows_e] (= or +=) Σ_i a_i[rows_e] · op(w_i[e]) over the terms (at most three): an expert projection with its
  // LoRA factor's product, or dx through several, as one product over the terms' concatenated contraction where
  // a backend can (one pass over y, one rounding); otherwise the terms one after another, added. Forward: w_i
  // [E, N, K_i], op(w) = wᵀ (as grouped_linear_forward); Dx: w_i [E, K_i, N], op(w) = w (as its dx).
  enum class GroupedOrient { Forward, Dx };
  struct GroupedTerm {
    Tensor a, w;
  };
  virtual void grouped_linear_sum(Tensor y, const std::vector<GroupedTerm>& terms, GroupedOrient orient,
                                  const Tensor& offsets, bool accumulate = false) {
    for (const GroupedTerm& t : terms) {
      if (orient == GroupedOrient::Forward)
        grouped_linear_forward(y, t.a, t.w, offsets, 1.0f, accumulate);
      else  // (dx alone: the x argument, unread without dw, is given y for its shape)
        grouped_linear_backward(&y, accumulate, nullptr, t.a, y, t.w, offsets);
      accumulate = true;
    }
  }
  // The router's backward, from d loss / d weight (F32 [N,k]) through the top-k renormalisation (norm_topk)
  // and the softmax to dlogits [N,E] (activation dtype); aux_grad (F32 [E], or empty) is added to every
  // token's d loss / d probs (the load-balancing loss's gradient, one value per expert).
  virtual void moe_router_backward(Tensor dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& expert,
                                   const Tensor& weight, bool norm_topk, const Tensor& aux_grad) = 0;
  // Qwen2-MoE's shared expert: out[n] += sigmoid(gate[n]) · x[n] (gate [N,1], activation dtype).
  virtual void sigmoid_gate_add(Tensor out, const Tensor& x, const Tensor& gate) = 0;
  // Its backward: dx[n] = sigmoid(gate[n]) · dout[n]; dgate[n] = sigmoid'(gate[n]) · (dout[n] · x[n]).
  virtual void sigmoid_gate_backward(Tensor dx, Tensor dgate, const Tensor& dout, const Tensor& x,
                                     const Tensor& gate) = 0;
  // transformers' load-balancing loss from the pass's statistics over R = (MoE layers × tokens) rows:
  // loss (F64 [1]) += coef · E · Σ_e counts[e] · prob_sum[e] / R²; aux_grad[e] = coef · E · counts[e] / R²,
  // its derivative by each row's probability of expert e (counts are not differentiable).
  virtual void moe_aux_loss(Tensor aux_grad, Tensor loss, const Tensor& counts, const Tensor& prob_sum, float coef,
                            double rows) = 0;

  virtual void add_inplace(Tensor x, const Tensor& y) = 0;  // x += y (activation dtype, or F32)
  // y = x · factor, times keep/(1-p) when p > 0: keep[i] = dropout_keep(seed, i, p) (kernels/dropout_mask.h),
  // identical on every backend, so a backward pass regenerates forward's mask from the seed alone.
  // Activation dtype; y may alias x.
  virtual void dropout_scale(Tensor y, const Tensor& x, float factor, float p, uint64_t seed) = 0;

  // logits [n,V] (fp32) → row_nll[n] = -log softmax(logits)[target] (0 where target == -100), and, when
  // row_weight (F32 [n], d loss / d row_nll) is given, dlogits [n,V] (activation dtype; may be the logits
  // themselves when that is F32) = (softmax − onehot(target)) · row_weight (0 on rows with target -100).
  // Targets outside [0,V) are the caller's bug. With row_entropy (F32 [n]) given, also the entropy of each row's
  // softmax, lse − Σ softmax·logits (0 on rows with target -100): TRL's `entropy` metric.
  virtual void cross_entropy(const Tensor& logits, Tensor dlogits, Tensor row_nll, const Tensor& targets,
                             const Tensor& row_weight, Tensor row_entropy) = 0;

  // Σ x over all elements, read back to the host (a sync point: keep out of the step).
  virtual double sum(const Tensor& x) = 0;
  virtual double sum_squares(const Tensor& x) = 0;
  // The same on the device, no sync: out (F64 [1]) = or += Σx (or Σx² with `squares`), in a fixed order.
  virtual void reduce_sum(Tensor out, const Tensor& x, bool squares, bool accumulate) = 0;
  // out[s] (F32) = Σ x[n] over document s, n in [cu_seqlens[s], cu_seqlens[s+1]), in a fixed order.
  virtual void segment_sum(Tensor out, const Tensor& x, const Tensor& cu_seqlens) = 0;
  // out[n] (F32) = x[s] for every n of document s (the inverse of segment_sum's grouping): per-document
  // gradient weights spread onto the document's tokens.
  virtual void segment_broadcast(Tensor out, const Tensor& x, const Tensor& cu_seqlens) = 0;
  // Preference losses over the P pairs of one micro-batch (model/dpo_objective.h; TRL's definitions).
  // pairs (I32 [P,6]): chosen document, rejected document, their counted targets (IPO, SimPO and ORPO average
  // log-probs over them), the chosen prompt's document (ORPO: its tokens count in the NLL term only) or -1, and
  // KTO's label (see PreferenceLoss);
  // doc_nll / ref_doc_nll (F32 [D]): Σ NLL per document (segment) of the policy and of the reference.
  // doc_weight (F32 [D]) = d loss / d doc_nll (0 for documents in no pair); stats (F64 [kPreferenceStats],
  // = or += with accumulate) sums over the pairs, in pair order: see PreferenceStat.
  virtual void preference_loss(Tensor doc_weight, Tensor stats, const Tensor& doc_nll, const Tensor& ref_doc_nll,
                               const Tensor& pairs, const PreferenceParams& p, bool accumulate) = 0;
  // Bradley–Terry reward loss over the P pairs of one micro-batch (model/reward_objective.h). scores (F32 [N]): the
  // score head's output at every token; pairs (I32 [P,2]): the tokens whose scores are the chosen and the rejected
  // sequence's reward; margins (F32 [P]; empty: 0). weight (F32 [N]): d loss / d score written at those tokens
  // (others untouched: the caller zeroes it); stats (F64 [kRewardStats], = or += with accumulate; min / max
  // folded): see RewardStat.
  virtual void reward_loss(Tensor weight, Tensor stats, const Tensor& scores, const Tensor& pairs,
                           const Tensor& margins, const RewardParams& p, bool accumulate) = 0;
  // GRPO's loss over the D completions of one micro-batch (documents of cu_seqlens, I32 [D+1]). Per token (F32
  // [N]): token_nll, and old_nll / ref_nll (−log p of the target under the policy that sampled the completion
  // and under the reference; old_nll empty: the current ones, a ratio of 1; ref_nll read only when β ≠ 0); a
  // token counts
  // where targets (I32 [N]) is not -100. Per completion (F32 [D]): its advantage and its scale (the loss type's
  // normaliser, 0 for padding). keep (F32 [N]; empty: all 1) multiplies each token's policy term, not its
  // KL: TRL's top_entropy_quantile mask (1 or 0) times its importance-sampling correction. weight (F32 [N]) = d loss /
  // d token_nll (0 where not counted); stats (F64 [kPolicyStats]) as PolicyStat says.
  virtual void policy_loss(Tensor weight, Tensor stats, const Tensor& token_nll, const Tensor& targets,
                           const Tensor& old_nll, const Tensor& ref_nll, const Tensor& keep,
                           const Tensor& doc_advantage, const Tensor& doc_scale, const Tensor& cu_seqlens,
                           const PolicyLossParams& p, bool accumulate) = 0;
  virtual void fill(Tensor x, float value) = 0;  // F32
  virtual void scale(Tensor x, float factor) = 0;
  // torch.optim.AdamW on one flat range of fp32 master parameters (decoupled decay, bias correction);
  // `compute_copy`, when given, receives the updated values in the activation dtype in the same pass. A BF16
  // master is read, updated in fp32 and written back rounded stochastically (AdamWParams::sr_seed); its compute
  // copy, if any (an fp32 one on the CPU), receives the rounded value. adamw_8bit takes such masters too.
  virtual void adamw(Tensor master, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                     Tensor* compute_copy) = 0;
  // The same update with m and v stored 8-bit blockwise (kernels/blockwise8.h: bitsandbytes' format): each is
  // dequantised, updated in fp32 exactly as adamw() does, and quantised again with fresh per-block absmax.
  // `master` is one parameter, or a piece of one that starts on a block boundary (blocks start there).
  virtual void adamw_8bit(Tensor master, const Tensor& grad, const Blockwise8& m, const Blockwise8& v,
                          const AdamWParams& p, Tensor* compute_copy) = 0;
  // The same update with m and v stored 4-bit blockwise as torchao's AdamW4bit stores them (kernels/blockwise4.h):
  // m.code / v.code U8 [n / 2] (two codes a byte), absmax F32 [n / 128] (the scales), map F32 [16]. `master` is one
  // parameter of whole 128-element blocks.
  virtual void adamw_4bit(Tensor master, const Tensor& grad, const Blockwise8& m, const Blockwise8& v,
                          const AdamWParams& p, Tensor* compute_copy) = 0;
  // Muon's momentum on one parameter (F32 grad and m [n]): m ← m + (1−μ)(g − m), then u (activation dtype [n]) =
  // g + μ(m − g), Nesterov's input (torch's two lerps), the gradient read times the clip factor; sumsq (F64 [1]) =
  // Σu² over the stored u.
  virtual void muon_momentum(Tensor u, Tensor m, const Tensor& grad, Tensor sumsq, const MuonParams& p) = 0;
  // x [r, c] (activation dtype) ← Newton–Schulz's orthogonalisation of x / (√sumsq + eps): ns_steps of
  // X ← aX + (bA + cA·A)·X with A = X·Xᵀ, on the wide orientation (a tall x iterates on xᵀ, as torch does), every
  // product stored in x's dtype (torch's bf16 matmuls). scratch: at least 2·k² + r·c elements of x's dtype, k =
  // min(r, c).
  virtual void newton_schulz(Tensor x, const Tensor& sumsq, Tensor scratch, const MuonParams& p) = 0;
  // master (F32 [n]) ← master · decay − step · x (x in the activation dtype): Muon's decoupled weight decay (decay =
  // 1 − lr·wd) and its scaled step; `compute_copy` as adamw()'s.
  virtual void muon_update(Tensor master, const Tensor& x, float decay, float step, Tensor* compute_copy) = 0;
  // NorMuon's variance reduction on x [r, c] (activation dtype, orthogonalised): the mean of x² over each row when
  // r >= c (else over each column) moves the F32 EMA `buffer` [r] (else [c]) by 1 − beta2, and the row's (column's)
  // values are scaled by 1/√max(buffer, 1e-10).
  virtual void normuon_variance(Tensor x, Tensor buffer, float beta2) = 0;
  // master (F32 [n]) ← master − wd_step · master · [x·master ≥ 0] − step · x: NorMuon's cautious weight decay (only
  // where the update and the weight agree in sign) and step; `compute_copy` as adamw()'s.
  virtual void normuon_update(Tensor master, const Tensor& x, float wd_step, float step, Tensor* compute_copy) = 0;
};

std::unique_ptr<Ops> make_cpu_ops();
// The CUDA backend on the current device; a UserError when this build has none or no GPU is present.
std::unique_ptr<Ops> make_cuda_ops();
// Another backend of `device`'s kind for work run beside the first one's from a host thread of its own (GRPO's
// one-step-off-policy generation): its own streams, BLAS handle and scratch, so neither waits on the other's queue.
// On CUDA its streams take the device's highest priority: a decode step's small kernels are then scheduled ahead of
// the waiting blocks of the training step's large ones instead of queueing behind them.
std::unique_ptr<Ops> make_ops_beside(Device device);

}  // namespace soltrain
