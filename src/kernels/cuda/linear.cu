// CUDA: linear layers through cuBLASLt (bf16 operands, fp32 accumulation, bias in the epilogue); the
// weight gradient accumulates straight into the fp32 gradient (beta = 1), the bias gradient is a
// deterministic column sum.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launchers.h"

namespace soltrain {

namespace {
cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    case DType::F8E5M2: return CUDA_R_8F_E5M2;
    default: throw std::logic_error("cuBLASLt: unsupported dtype");
  }
}
__device__ __forceinline__ float as_f(float x) {
  return x;
}
__device__ __forceinline__ float as_f(cuda::bf16 x) {
  return cuda::to_f(x);
}

// D[i, j] += bias[i] for the column-major m x n product D (leading dimension ldd): the bias epilogue done apart.
template <typename TD, typename TB>
__global__ void add_bias_kernel(TD* d, int64_t ldd, int m, int64_t n, const TB* bias) {
  const int64_t total = int64_t(m) * n;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = t / m, i = t % m;
    TD& x = d[j * ldd + i];
    if constexpr (std::is_same_v<TD, float>) {
      x += as_f(bias[i]);
    } else {
      x = cuda::to_bf(cuda::to_f(x) + as_f(bias[i]));
    }
  }
}

void add_bias_apart(const Tensor& D, int64_t ldd, int m, int n, const Tensor& bias, cudaStream_t stream) {
  const int64_t total = int64_t(m) * n;
  const int blocks = int(std::min<int64_t>((total + 255) / 256, 4096));
  auto launch = [&](auto* d) {
    if (bias.dtype == DType::F32)
      add_bias_kernel<<<blocks, 256, 0, stream>>>(d, ldd, m, n, static_cast<const float*>(bias.data));
    else
      add_bias_kernel<<<blocks, 256, 0, stream>>>(d, ldd, m, n, static_cast<const cuda::bf16*>(bias.data));
  };
  if (D.dtype == DType::F32)
    launch(static_cast<float*>(D.data));
  else if (D.dtype == DType::BF16)
    launch(static_cast<cuda::bf16*>(D.data));
  else
    throw std::logic_error("add_bias_apart: output dtype");
  CUDA_CHECK(cudaGetLastError());
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
                   Tensor D, int ldd, float beta, const Tensor* bias, float alpha, const Fp8Gemm* fp8,
                   const Tensor* C) {
  const void* c_data = C ? C->data : D.data;
  const std::vector<int64_t> key{trans_a,
                                 trans_b,
                                 m,
                                 n,
                                 k,
                                 lda,
                                 ldb,
                                 ldd,
                                 int(A.dtype),
                                 int(B.dtype),
                                 int(D.dtype),
                                 fp8 ? 1 + int(fp8->fast_accumulation) : 0,
                                 bias != nullptr,
                                 alignment(A.data),
                                 alignment(B.data),
                                 alignment(D.data),
                                 bias ? alignment(bias->data) : 0,
                                 alignment(c_data)};
  auto& plan = plans_[key];
  if (!plan) {
    plan = std::make_unique<Plan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (fp8) {
      // The scale pointers are set before the algorithm is chosen (an algorithm picked without them may not
      // take them), and again on every call below.
      const int8_t fast = fp8->fast_accumulation ? 1 : 0;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &fp8->a_scale_inv,
                                                  sizeof(void*)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &fp8->b_scale_inv,
                                                  sizeof(void*)));
    }
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
    const uint32_t al_a = uint32_t(key[13]), al_b = uint32_t(key[14]), al_d = uint32_t(key[15]),
                   al_c = uint32_t(key[17]);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, 4));
    // FP8 asks for several candidates: the first suggestion is not always one that runs (cuBLASLt's own FP8
    // sample says to try them in turn); the first call keeps the first that does.
    cublasLtMatmulHeuristicResult_t results[8] = {};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref,
                                                             fp8 ? 8 : 1, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && bias) {
      plan->bias_apart = true;
    } else if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      throw std::runtime_error(cat("cuBLASLt has no algorithm for m=", m, " n=", n, " k=", k, " (", dtype_name(A.dtype),
                                   " x ", dtype_name(B.dtype), " -> ", dtype_name(D.dtype), ")"));
    }
    for (int i = 0; i < found; ++i) plan->algos[i] = results[i].algo;
    plan->algo_count = found;
  }
  if (plan->bias_apart) {
    gemm(trans_a, trans_b, m, n, k, A, lda, B, ldb, D, ldd, beta, nullptr, alpha, fp8, C);
    add_bias_apart(D, ldd, m, n, *bias, stream_);
    return;
  }
  if (bias)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias->data, sizeof(void*)));
  if (fp8) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &fp8->a_scale_inv,
                                                sizeof(void*)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &fp8->b_scale_inv,
                                                sizeof(void*)));
  }
  const size_t first = plan->chosen >= 0 ? size_t(plan->chosen) : 0;
  for (size_t i = first; i < size_t(plan->algo_count); ++i) {
    const cublasStatus_t st =
        cublasLtMatmul(lt_, plan->desc, &alpha, A.data, plan->a, B.data, plan->b, &beta, c_data, plan->d, D.data,
                       plan->d, &plan->algos[i], workspace_.data(), workspace_.bytes(), stream_);
    if (plan->chosen >= 0) {
      CUBLAS_CHECK(st);
      return;
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      plan->chosen = int(i);
      return;
    }
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);
  }
  throw std::runtime_error(cat("cuBLASLt runs none of its ", plan->algo_count, " algorithms for m=", m, " n=", n,
                               " k=", k, " (", dtype_name(A.dtype), " x ", dtype_name(B.dtype), " -> ",
                               dtype_name(D.dtype), ")"));
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

// Row-major y[M,N] = a[M,K]·bᵀ is column-major yᵀ = b_cm ᵀ · a_cm: the TN layout, the only one Hopper's FP8
// GEMMs take (a and b are K-contiguous). The scale_inv of each operand rides as cuBLASLt's A/B scale.
void CudaOps::fp8_matmul(Tensor y, const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                         const Tensor* bias, float alpha, bool accumulate, bool precise) {
  const auto prof = profile(precise ? "fp8_matmul precise" : "fp8_matmul");
  const int M = int(a.dim(0)), K = int(a.dim(1)), N = int(b.dim(0));
  SOLTRAIN_CHECK(b.dim(1) == K && y.dim(0) == M && y.dim(1) == N, "fp8_matmul shapes");
  SOLTRAIN_CHECK(!(a.dtype == DType::F8E5M2 && b.dtype == DType::F8E5M2), "fp8_matmul: E5M2 x E5M2");
  SOLTRAIN_CHECK(K % 16 == 0 && N % 16 == 0 && M % 16 == 0, "fp8_matmul: dims must be multiples of 16, got ", M, "x", N,
                 "x", K);
  SOLTRAIN_CHECK(cuda::aligned16(a_scale.data) && cuda::aligned16(b_scale.data), "fp8_matmul: scale records");
  const Fp8Gemm f{b_scale.f32(), a_scale.f32(), !precise};
  gemm(true, false, N, M, K, b, K, a, K, y, N, accumulate ? 1.0f : 0.0f, bias, alpha, &f);
}

}  // namespace soltrain
