// CUDA: linear layers through cuBLASLt (bf16 operands, fp32 accumulation, bias in the epilogue); the
// weight gradient accumulates straight into the fp32 gradient (beta = 1), the bias gradient is a
// deterministic column sum.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launchers.h"

namespace soltrain {

namespace {
cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    default: throw std::logic_error("cuBLASLt: unsupported dtype");
  }
}
// Largest power of two (up to 256) dividing the address: cuBLASLt picks kernels by alignment.
int64_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 256;
  while (al > 1 && a % uintptr_t(al)) al /= 2;
  return al;
}
}  // namespace

CudaOps::Plan::~Plan() {
  if (desc) cublasLtMatmulDescDestroy(desc);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (d) cublasLtMatrixLayoutDestroy(d);
}

void CudaOps::gemm(bool trans_a, bool trans_b, int m, int n, int k, const Tensor& A, int lda, const Tensor& B, int ldb,
                   Tensor D, int ldd, float beta, const Tensor* bias, float alpha) {
  const std::vector<int64_t> key{trans_a,
                                 trans_b,
                                 m,
                                 n,
                                 k,
                                 lda,
                                 ldb,
                                 ldd,
                                 int(A.dtype),
                                 int(D.dtype),
                                 bias != nullptr,
                                 alignment(A.data),
                                 alignment(B.data),
                                 alignment(D.data),
                                 bias ? alignment(bias->data) : 0};
  auto& plan = plans_[key];
  if (!plan) {
    plan = std::make_unique<Plan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      const cudaDataType_t bt = lt_type(bias->dtype);
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, lt_type(A.dtype), trans_a ? k : m, trans_a ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, lt_type(B.dtype), trans_b ? n : k, trans_b ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, lt_type(D.dtype), m, n, ldd));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = workspace_.bytes();
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const uint32_t al_a = uint32_t(key[11]), al_b = uint32_t(key[12]), al_d = uint32_t(key[13]);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, 4));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      throw std::runtime_error(cat("cuBLASLt has no algorithm for m=", m, " n=", n, " k=", k));
    plan->algo = result.algo;
  }
  if (bias)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias->data, sizeof(void*)));
  CUBLAS_CHECK(cublasLtMatmul(lt_, plan->desc, &alpha, A.data, plan->a, B.data, plan->b, &beta, D.data, plan->d, D.data,
                              plan->d, &plan->algo, workspace_.data(), workspace_.bytes(), stream_));
}

// Row-major y[N,out] = x[N,in]·wᵀ is column-major yᵀ = w_cm ᵀ · xᵀ with w_cm = wᵀ (in × out, ld in).
void CudaOps::linear_forward(Tensor y, const Tensor& x, const Weight& weight, const Tensor* bias, float alpha,
                             bool accumulate) {
  const auto prof = profile("linear_forward");
  const Tensor w = dense_weight(weight);
  const int N = int(x.dim(0)), in = int(x.dim(1)), out = int(w.dim(0));
  SOLTRAIN_CHECK(w.dim(1) == in && y.dim(0) == N && y.dim(1) == out, "linear shapes");
  gemm(true, false, out, N, in, w, in, x, in, y, out, accumulate ? 1.0f : 0.0f, bias, alpha);
}

void CudaOps::linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, Tensor* dbias, const Tensor& dy,
                              const Tensor& x, const Weight& weight, float dx_alpha) {
  SOLTRAIN_CHECK(!dw || weight.format == WeightFormat::Dense, "a quantised weight is frozen: no dW");
  // A quantised weight is dequantised only when dx needs it (a frozen base computes no dW).
  const Tensor w = dx ? dense_weight(weight) : weight.data;
  const int N = int(dy.dim(0)), out = int(weight.out()), in = int(weight.in());
  // dx[N,in] = dy[N,out]·w[out,in]  →  column-major dxᵀ = w_cm · dyᵀ
  if (dx) {
    const auto prof = profile("linear_backward dx");
    gemm(false, false, in, N, out, w, in, dy, out, *dx, in, accumulate_dx ? 1.0f : 0.0f, nullptr, dx_alpha);
  }
  // dw[out,in] += dyᵀ·x  →  column-major dwᵀ = xᵀ · dy
  if (dw) {
    const auto prof = profile("linear_backward dw");
    gemm(false, true, in, out, N, x, in, dy, out, *dw, in, 1.0f, nullptr);
  }
  if (dbias) {
    const auto prof = profile("linear_backward dbias");
    float* partials =
        static_cast<float*>(scratch(size_t(cuda::column_sum_partial_floats(N, out, sm_count_)) * sizeof(float)));
    cuda::column_sum(dbias->f32(), dy.as<__nv_bfloat16>(), static_cast<const __nv_bfloat16*>(nullptr), nullptr, N, out,
                     partials, sm_count_, stream_);
  }
}

}  // namespace soltrain
