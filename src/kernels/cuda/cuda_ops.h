// The CUDA backend: bf16 activations and weight copies, fp32 masters/gradients/statistics, GEMMs through
// cuBLASLt, everything else in our kernels (one op per .cu file, each with its CPU twin in ../cpu).
// Work is queued on the main stream (hooks' work on a side stream); only sum()/sum_squares() and copies
// into host memory wait for it.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <vector>

#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/op_profiler.h"
#include "kernels/ops.h"

namespace soltrain {

class CudaOps final : public Ops {
 public:
  // stream_priority: cudaStreamCreateWithPriority's (lower is more urgent; 0 is the default's)
  explicit CudaOps(int stream_priority = 0);
  ~CudaOps() override;
  Device device() const override { return Device::CUDA; }
  DType activation_dtype() const override { return DType::BF16; }
  Buffer alloc(size_t bytes) override;
  void copy(Tensor dst, const Tensor& src) override;
  void convert(Tensor dst, const Tensor& src) override;
  void zero(Tensor t) override;
  void synchronize() override;
  void use_stream(Stream s) override { stream_ = streams_[int(s)]; }
  void wait(Stream waiter, Stream on) override;
  void* native_stream(Stream s) override { return streams_[int(s)]; }
  Buffer alloc_host(size_t bytes) override;
  void upload_async(Tensor dst, const Tensor& src) override;
  void download_async(Tensor dst, const Tensor& src) override;
  std::function<void()> fence() override;
  uint64_t mark() override;
  void host_wait(uint64_t mark) override;
  void wait_mark(uint64_t mark) override;
  void enable_profiling(bool on) override { profiler_.enable(on); }
  std::unique_ptr<Recorded> record(const std::function<void()>& ops, std::string* why = nullptr) override;
  // Every stream finished first: ops queued on Side (a data-parallel step's gathers) end after Main's last.
  std::map<std::string, double> collect_profile() override {
    synchronize();
    return profiler_.collect(stream_);
  }
  double memory_used_gib() const override;
  double memory_total_gib() const override;
  double memory_free_gib() const override;

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
  void add_rmsnorm_forward(Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,
                           float eps) override;
  void qk_norm_rope_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, const SeqLayout& seq,
                            const Tensor& inv_freq, float eps) override;
  void qk_norm_rope_backward(Tensor dx, Tensor dw, Tensor dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                             const SeqLayout& seq, const Tensor& inv_freq) override;
  int64_t max_attention_head_dim() const override;
  void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const SeqLayout& seq, float scale) override;
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& out, const Tensor& lse, const SeqLayout& seq,
                          float scale) override;
  void set_attention_backward(AttentionBackward form) override {
    if (!attention_backward_from_env_) attention_backward_ = form;
  }
  AttentionBackward attention_backward_form() const override { return attention_backward_; }
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
  void swiglu_packed_forward(Tensor out, const Tensor& gate_up) override;
  void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) override;
  std::string moe_unsupported(int experts, int top_k) const override;  // (cuda/moe.cu)
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
  void grouped_linear_sum(Tensor y, const std::vector<GroupedTerm>& terms, GroupedOrient orient, const Tensor& offsets,
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

  void fp8_quantize(Tensor out, Tensor out_t, const Tensor& x, const Fp8Scaling& s) override;
  void fp8_matmul(Tensor y, const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                  const Tensor* bias, float alpha, bool accumulate, bool precise) override;
  void fp8_update_scales(Tensor history, Tensor scales, float fp8_max, int margin) override;
  std::string fp8_unsupported() const override;

  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }
  // Whether attention of this head dim runs on the Hopper kernels (attention_*_sm90.cu).
  bool hopper_attention(int64_t head_dim) const;

 private:
  // FP8 operands of a GEMM: their scale_inv (device pointers, read when the GEMM runs) and whether Hopper's
  // fast (reduced-precision) accumulation may be used.
  struct Fp8Gemm {
    const float *a_scale_inv, *b_scale_inv;
    bool fast_accumulation;
  };
  // D = alpha·op(A)·op(B) + beta·C in cuBLASLt's column-major terms; FP8 A/B with `fp8`. C is D unless `c` is
  // given (laid out as D: Newton–Schulz's W·B + a·W reads W and writes another buffer without copying W there).
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const Tensor& a, int lda, const Tensor& b, int ldb,
            Tensor d, int ldd, float beta, const Tensor* bias, float alpha = 1.0f, const Fp8Gemm* fp8 = nullptr,
            const Tensor* c = nullptr);
  OpProfiler::Scope profile(const char* name) { return OpProfiler::Scope(&profiler_, name, stream_); }
  // Scratch of at least `bytes` bytes on the device (grows; only between steps in practice).
  void* scratch(size_t bytes);

  cudaStream_t stream_ = nullptr;                          // the current one of streams_
  cudaStream_t streams_[3] = {nullptr, nullptr, nullptr};  // [Main, Side, Upload]
  // A ring of events: a mark older than kMarks has had its event recorded again, so waiting on it waits for
  // every stream instead (never too early, only later than needed). Sized above a step's marks so that rarely
  // happens: the data-parallel gathers take one per group, offload_weights one per layer and pass, and the
  // offloaded update three per piece (Qwen3-4B with 8-bit moments: ~530 pieces, ~1,600 marks).
  static constexpr int kMarks = 4096;
  cudaEvent_t marks_[kMarks] = {}, order_ = nullptr;
  uint64_t marks_made_ = 0;
  cublasLtHandle_t lt_ = nullptr;
  Buffer workspace_, scratch_, reduce_out_;
  // A quantised weight dequantised to bf16 for one GEMM (sized to the widest weight; grows only on the first
  // steps, never holds more than one weight: the quantised base stays quantised).
  Buffer dequantised_;
  Tensor dense_weight(const Weight& w);
  // The 8-bit update's quantisation tables (adamw.cu's QuantTables) for the maps they were built from.
  Buffer quant_tables_;
  const void* quant_maps_[2] = {nullptr, nullptr};
  const void* quant_tables(const Tensor& mmap, const Tensor& vmap);
  double* host_result_ = nullptr;  // pinned
  int sm_count_ = 0;
  int compute_capability_ = 0;     // major · 10 + minor
  bool hopper_attention_ = false;  // compute capability 9.0 and not SOLTRAIN_ATTENTION=portable
  // The Hopper kernels' dQ: split unless the setting or SOLTRAIN_ATTENTION_BACKWARD (which wins) says otherwise
  AttentionBackward attention_backward_ = AttentionBackward::Split;
  bool attention_backward_from_env_ = false;
  // SOLTRAIN_ATTENTION_ORDER=shortest|longest (the dK/dV blocks' launch order; the form's default unless set)
  cuda::LaunchOrder attention_order_ = cuda::LaunchOrder::Default;
  bool sm90_ = false;  // compute capability 9.0: the sm_90a kernels (clusters, wgmma) run
  OpProfiler profiler_;
  struct Plan {  // one cuBLASLt problem: descriptors and the algorithm picked once
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algos[8] = {};  // the heuristic's candidates, best first
    int algo_count = 0, chosen = -1;     // chosen: the first that ran
    // cuBLASLt has no BIAS epilogue for this problem (seen: a token classifier's two-label head, bf16 operands and
    // bias into fp32 logits): the product runs plain and a kernel adds the bias after it.
    bool bias_apart = false;
    ~Plan();
  };
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;  // cuBLASLt set-ups by shape
};

}  // namespace soltrain
