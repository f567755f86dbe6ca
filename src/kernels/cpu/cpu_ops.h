// The CPU backend: fp32 loops and BLAS. It is the reference every other backend is checked against, so
// it favours exactness (double accumulators in reductions) over speed.
#pragma once
#include "kernels/ops.h"

namespace soltrain {

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::CPU; }
  DType activation_dtype() const override { return DType::F32; }
  Buffer alloc(size_t bytes) override;  // (host memory, in the device ledger: core/device_memory.h)
  void copy(Tensor dst, const Tensor& src) override;
  void convert(Tensor dst, const Tensor& src) override;  // F32 <-> BF16 (bf16 masters), else a copy
  void zero(Tensor t) override;

  void embedding_forward(Tensor out, const Tensor& ids, const Tensor& table) override;
  void embedding_backward(Tensor dtable, const Tensor& ids, const Tensor& dout, int32_t padding_idx = -1) override;
  void linear_forward(Tensor y, const Tensor& x, const Weight& w, const Tensor* bias, float alpha,
                      bool accumulate) override;
  void dequantize(Tensor out, const Weight& w) override;
  void fake_quantize(Tensor out, const Tensor& x, const FakeQuant& q, Tensor amax) override;
  void fake_quantize_backward(Tensor dx, bool accumulate, const Tensor& g, const Tensor& x,
                              const FakeQuant& q) override;
  void linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, Tensor* dbias, const Tensor& dy, const Tensor& x,
                       const Weight& w, float dx_alpha) override;
  void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) override;
  void rmsnorm_backward(Tensor dx, bool accumulate_dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                        const Tensor& rstd, Tensor dx_rounded = {}) override;
  void rope(Tensor x, const SeqLayout& seq, const Tensor& inv_freq, bool inverse) override;
  void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const SeqLayout& seq, float scale) override;
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& out, const Tensor& lse, const SeqLayout& seq,
                          float scale) override;
  void kv_append(Tensor k_pool, Tensor v_pool, const Tensor& k, const Tensor& v, const Tensor& lens,
                 const Tensor& table) override;
  void attention_decode(Tensor out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& lens,
                        const Tensor& table, float scale) override;
  void sample_tokens(Tensor ids, Tensor logits, Tensor seen, const SamplingParams& p, uint64_t step,
                     Tensor logprobs = {}) override;
  void flag_tokens(Tensor seen, const Tensor& ids) override;
  void advance_decode(Tensor ids, Tensor positions, Tensor lens, const Tensor& drawn) override;
  void decode_qkv(Tensor q, Tensor k_pool, Tensor v_pool, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm,
                  const Tensor& positions, const Tensor& inv_freq, float eps, const Tensor& lens,
                  const Tensor& table) override;
  void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) override;
  void moe_route(Tensor probs, Tensor expert, Tensor weight, Tensor prob_sum, const Tensor& logits,
                 bool norm_topk) override;
  void moe_permute(Tensor rows, Tensor slot, Tensor offsets, Tensor counts, const Tensor& expert) override;
  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override;
  void moe_combine(Tensor out, const Tensor& y, const Tensor& slot, const Tensor& weight) override;
  void moe_combine_backward(Tensor dy, Tensor dweight, const Tensor& dout, const Tensor& y, const Tensor& slot,
                            const Tensor& weight) override;
  void moe_unpermute_sum(Tensor dx, bool accumulate, const Tensor& dxs, const Tensor& slot) override;
  void grouped_linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& offsets, float alpha,
                              bool accumulate) override;
  void grouped_linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, const Tensor& dy, const Tensor& x,
                               const Tensor& w, const Tensor& offsets, float alpha) override;
  void moe_router_backward(Tensor dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& expert,
                           const Tensor& weight, bool norm_topk, const Tensor& aux_grad) override;
  void sigmoid_gate_add(Tensor out, const Tensor& x, const Tensor& gate) override;
  void sigmoid_gate_backward(Tensor dx, Tensor dgate, const Tensor& dout, const Tensor& x, const Tensor& gate) override;
  void moe_aux_loss(Tensor aux_grad, Tensor loss, const Tensor& counts, const Tensor& prob_sum, float coef,
                    double rows) override;
  void add_inplace(Tensor x, const Tensor& y) override;
  void dropout_scale(Tensor y, const Tensor& x, float factor, float p, uint64_t seed) override;
  void cross_entropy(const Tensor& logits, Tensor dlogits, Tensor row_loss, const Tensor& targets,
                     const Tensor& row_weight, Tensor row_entropy) override;
  double sum(const Tensor& x) override;
  double sum_squares(const Tensor& x) override;
  void reduce_sum(Tensor out, const Tensor& x, bool squares, bool accumulate) override;
  void segment_sum(Tensor out, const Tensor& x, const Tensor& cu_seqlens) override;
  void segment_broadcast(Tensor out, const Tensor& x, const Tensor& cu_seqlens) override;
  void preference_loss(Tensor doc_weight, Tensor stats, const Tensor& doc_nll, const Tensor& ref_doc_nll,
                       const Tensor& pairs, const PreferenceParams& p, bool accumulate) override;
  void reward_loss(Tensor weight, Tensor stats, const Tensor& scores, const Tensor& pairs, const Tensor& margins,
                   const RewardParams& p, bool accumulate) override;
  void policy_loss(Tensor weight, Tensor stats, const Tensor& token_nll, const Tensor& targets, const Tensor& old_nll,
                   const Tensor& ref_nll, const Tensor& keep, const Tensor& doc_advantage, const Tensor& doc_scale,
                   const Tensor& cu_seqlens, const PolicyLossParams& p, bool accumulate) override;
  void fill(Tensor x, float value) override;
  void scale(Tensor x, float factor) override;
  void adamw(Tensor master, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
             Tensor* compute_copy) override;
  void adamw_8bit(Tensor master, const Tensor& grad, const Blockwise8& m, const Blockwise8& v, const AdamWParams& p,
                  Tensor* compute_copy) override;
  void adamw_4bit(Tensor master, const Tensor& grad, const Blockwise8& m, const Blockwise8& v, const AdamWParams& p,
                  Tensor* compute_copy) override;
  void muon_momentum(Tensor u, Tensor m, const Tensor& grad, Tensor sumsq, const MuonParams& p) override;
  void newton_schulz(Tensor x, const Tensor& sumsq, Tensor scratch, const MuonParams& p) override;
  void muon_update(Tensor master, const Tensor& x, float decay, float step, Tensor* compute_copy) override;
  void normuon_variance(Tensor x, Tensor buffer, float beta2) override;
  void normuon_update(Tensor master, const Tensor& x, float wd_step, float step, Tensor* compute_copy) override;
  // FP8: the twin of the CUDA backend's (same codes bit for bit; the GEMM on the decoded values in fp32).
  void fp8_quantize(Tensor out, Tensor out_t, const Tensor& x, const Fp8Scaling& s) override;
  void fp8_matmul(Tensor y, const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                  const Tensor* bias, float alpha, bool accumulate, bool precise) override;
  void fp8_update_scales(Tensor history, Tensor scales, float fp8_max, int margin) override;
  std::string fp8_unsupported() const override { return ""; }
};

}  // namespace soltrain
