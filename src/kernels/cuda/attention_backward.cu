// CUDA: flash attention backward, deterministic: one kernel owns a key tile and accumulates dK, dV over
// the query tiles (and every query head of its GQA group), another owns a query tile and accumulates dQ
// over key tiles. Both recompute the probabilities from the saved log-sum-exp; no float atomics. The
// streamed operand (Q/dO, or K/V) is double-buffered by cp.async; B operands come through ldmatrix(.trans).
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using namespace cuda::attn;
using cuda::bf16;

namespace {

constexpr int kWarps = 4;  // 16 rows each: 64 keys (dK/dV) or 64 queries (dQ) per block

// delta[h, n] = Σ_d dO[n,h,d] · O[n,h,d]  (one warp per token and head)
__global__ void attention_delta(float* delta, const bf16* dout, const bf16* out, int64_t N, int H, int hd) {
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // n * H + h
  if (i >= N * H) return;
  float s = 0.f;
  for (int d = threadIdx.x % 32; d < hd; d += 32) s += cuda::to_f(dout[i * hd + d]) * cuda::to_f(out[i * hd + d]);
  s = cuda::warp_sum(s);
  if (threadIdx.x % 32 == 0) delta[(i % H) * N + i / H] = s;
}

// The same for hd = 8 * kLanes: kLanes lanes per (token, head) row, 16-byte loads (a bandwidth-bound pass
// over dO and O that the scalar version above ran at a fraction of the memory rate).
template <int kLanes>
__global__ void attention_delta_vec(float* delta, const bf16* dout, const bf16* out, int64_t N, int H) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;  // n * H + h
  const int lane = threadIdx.x % kLanes;
  float s = 0.f;
  if (i < N * H) {
    const uint4 a = reinterpret_cast<const uint4*>(dout + i * kLanes * 8)[lane];
    const uint4 b = reinterpret_cast<const uint4*>(out + i * kLanes * 8)[lane];
    const auto* x = reinterpret_cast<const __nv_bfloat162*>(&a);
    const auto* y = reinterpret_cast<const __nv_bfloat162*>(&b);
    for (int j = 0; j < 4; ++j) {
      const float2 u = __bfloat1622float2(x[j]), v = __bfloat1622float2(y[j]);
      s += u.x * v.x + u.y * v.y;
    }
  }
  for (int o = kLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (i < N * H && lane == 0) delta[(i % H) * N + i / H] = s;
}

template <int D>
constexpr size_t dkdv_smem() {
  return size_t(6 * kTile) * (D + kPad) * sizeof(bf16) + 4 * kTile * sizeof(float);
}

template <int D, bool kAsync>
__global__ void __launch_bounds__(kWarps * 32)
    flash_backward_dkdv(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                        const float* lse, const float* delta, const int32_t* cu, int64_t N, int H, int Hkv, int hd,
                        float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = D + kPad;
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + kTile * ld;
  // double buffers by offset arithmetic (an array of pointers indexed at run time would live in local memory)
  bf16* const Qb = Vs + kTile * ld;
  bf16* const dOb = Qb + 2 * kTile * ld;
  float* const lse_b = reinterpret_cast<float*>(dOb + 2 * kTile * ld);
  float* const delta_b = lse_b + 2 * kTile;

  const int kh = blockIdx.y, group = H / Hkv, doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int k0 = (gridDim.x - 1 - blockIdx.x) * kTile;  // early keys see the most queries: start them first
  if (k0 >= len) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float scale_log2 = scale * kLog2e;
  const int q_tiles = (len - k0 + kTile - 1) / kTile;  // causal: query tiles from this key tile on
  const int items = group * q_tiles;

  // item i = (query head h = kh * group + i / q_tiles, query tile starting at k0 + (i % q_tiles) * kTile)
  auto load_item = [&](int i, int b) {
    const int h = kh * group + i / q_tiles, q0 = k0 + (i % q_tiles) * kTile;
    load_rows<D, kTile, kAsync>((Qb + (b)*kTile * ld), q, start + q0, len - q0, H, h, hd);
    load_rows<D, kTile, kAsync>((dOb + (b)*kTile * ld), dout, start + q0, len - q0, H, h, hd);
    cp_async_commit();
    for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
      const bool ok = q0 + r < len;
      lse_b[(b)*kTile + r] = ok ? lse[int64_t(h) * N + start + q0 + r] * kLog2e : 0.f;
      delta_b[(b)*kTile + r] = ok ? delta[int64_t(h) * N + start + q0 + r] : 0.f;
    }
  };
  load_rows<D, kTile, kAsync>(Ks, k, start + k0, len - k0, Hkv, kh, hd);
  load_rows<D, kTile, kAsync>(Vs, v, start + k0, len - k0, Hkv, kh, hd);
  load_item(0, 0);
  cp_async_wait_all();
  __syncthreads();

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
  for (int i = 0; i < D / 8; ++i)
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.f;
  const int wk0 = k0 + warp * 16;
  const int key[2] = {wk0 + g, wk0 + g + 8};

  for (int it = 0; it < items; ++it) {
    const int b = it % 2, q0 = k0 + (it % q_tiles) * kTile;
    if (it + 1 < items) load_item(it + 1, b ^ 1);
    for (int n0 = 0; n0 < kTile; n0 += 32) {  // 32 queries at a time keeps the register count down
      if (q0 + n0 + 31 < wk0) continue;       // all these queries precede this warp's keys
      float p[4][4], ds[4][4];
      for (int i = 0; i < 4; ++i)
        for (int e = 0; e < 4; ++e) p[i][e] = ds[i][e] = 0.f;
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t ak[4], av[4];
        load_a(ak, Ks + warp * 16 * ld + ks * 16, ld);
        load_a(av, Vs + warp * 16 * ld + ks * 16, ld);
        for (int qp = 0; qp < 2; ++qp) {
          uint32_t b0[2], b1[2];
          load_b2(b0, b1, (Qb + (b)*kTile * ld) + (n0 + qp * 16) * ld + ks * 16, ld);
          mma(p[2 * qp], ak, b0);  // Sᵀ: keys x queries
          mma(p[2 * qp + 1], ak, b1);
          load_b2(b0, b1, (dOb + (b)*kTile * ld) + (n0 + qp * 16) * ld + ks * 16, ld);
          mma(ds[2 * qp], av, b0);  // dPᵀ
          mma(ds[2 * qp + 1], av, b1);
        }
      }
      const bool masked = q0 + n0 < wk0 + 15 || q0 + n0 + 32 > len || wk0 + 16 > len;
      for (int nt = 0; nt < 4; ++nt)
        for (int e = 0; e < 4; ++e) {
          const int qc = n0 + nt * 8 + 2 * t + (e & 1), query = q0 + qc, kr = key[e / 2];
          const bool ok = !masked || (kr <= query && query < len && kr < len);
          const float pe = ok ? exp2f(p[nt][e] * scale_log2 - lse_b[(b)*kTile + qc]) : 0.f;
          p[nt][e] = pe;
          ds[nt][e] = pe * (ds[nt][e] - delta_b[(b)*kTile + qc]);
        }
      for (int kk = 0; kk < 2; ++kk) {
        uint32_t ap[4], ad[4];
        c_to_a(ap, p[2 * kk], p[2 * kk + 1]);
        c_to_a(ad, ds[2 * kk], ds[2 * kk + 1]);
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b0[2], b1[2];
          load_b2_trans(b0, b1, (dOb + (b)*kTile * ld) + (n0 + kk * 16) * ld + dp * 16, ld);
          mma(dv_acc[2 * dp], ap, b0);
          mma(dv_acc[2 * dp + 1], ap, b1);
          load_b2_trans(b0, b1, (Qb + (b)*kTile * ld) + (n0 + kk * 16) * ld + dp * 16, ld);
          mma(dk_acc[2 * dp], ad, b0);
          mma(dk_acc[2 * dp + 1], ad, b1);
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();
  }
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= len) continue;
    const int64_t base = ((start + key[r]) * Hkv + kh) * int64_t(hd);
    for (int dt = 0; dt < D / 8; ++dt) {
      const int c = dt * 8 + 2 * t;
      if (c >= hd) continue;  // hd is even: c < hd means the pair fits
      *reinterpret_cast<__nv_bfloat162*>(dk + base + c) =
          __floats2bfloat162_rn(dk_acc[dt][2 * r] * scale, dk_acc[dt][2 * r + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dv + base + c) =
          __floats2bfloat162_rn(dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
    }
  }
}

template <int D>
constexpr size_t dq_smem() {
  return size_t(6 * kTile) * (D + kPad) * sizeof(bf16);
}

template <int D, bool kAsync>
__global__ void __launch_bounds__(kWarps * 32)
    flash_backward_dq(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,
                      const float* delta, const int32_t* cu, int64_t N, int H, int Hkv, int hd, float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = D + kPad;
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dOs = Qs + kTile * ld;
  bf16* const Kb = Qs + 2 * kTile * ld;
  bf16* const Vb = Kb + 2 * kTile * ld;

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;  // late queries see the most keys: start them first
  if (q0 >= len) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float scale_log2 = scale * kLog2e;

  load_rows<D, kTile, kAsync>(Qs, q, start + q0, len - q0, H, h, hd);
  load_rows<D, kTile, kAsync>(dOs, dout, start + q0, len - q0, H, h, hd);
  load_rows<D, kTile, kAsync>((Kb + (0) * kTile * ld), k, start, len, Hkv, kh, hd);
  load_rows<D, kTile, kAsync>((Vb + (0) * kTile * ld), v, start, len, Hkv, kh, hd);
  cp_async_commit();
  const int wq0 = q0 + warp * 16;
  const int row[2] = {wq0 + g, wq0 + g + 8};
  float lse2[2], dl[2];
  for (int r = 0; r < 2; ++r) {
    const bool ok = row[r] < len;
    lse2[r] = ok ? lse[int64_t(h) * N + start + row[r]] * kLog2e : 0.f;
    dl[r] = ok ? delta[int64_t(h) * N + start + row[r]] : 0.f;
  }
  float acc[D / 8][4];
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  cp_async_wait_all();
  __syncthreads();

  const int last_tile = min(q0 + kTile - 1, len - 1) / kTile;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kTile, b = kt % 2;
    if (kt < last_tile) {
      load_rows<D, kTile, kAsync>((Kb + (b ^ 1) * kTile * ld), k, start + k0 + kTile, len - k0 - kTile, Hkv, kh, hd);
      load_rows<D, kTile, kAsync>((Vb + (b ^ 1) * kTile * ld), v, start + k0 + kTile, len - k0 - kTile, Hkv, kh, hd);
      cp_async_commit();
    }
    float p[kTile / 8][4], ds[kTile / 8][4];
    for (int i = 0; i < kTile / 8; ++i)
      for (int e = 0; e < 4; ++e) p[i][e] = ds[i][e] = 0.f;
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t aq[4], ado[4];
      load_a(aq, Qs + warp * 16 * ld + ks * 16, ld);
      load_a(ado, dOs + warp * 16 * ld + ks * 16, ld);
      for (int np = 0; np < kTile / 16; ++np) {
        uint32_t b0[2], b1[2];
        load_b2(b0, b1, (Kb + (b)*kTile * ld) + np * 16 * ld + ks * 16, ld);
        mma(p[2 * np], aq, b0);  // S
        mma(p[2 * np + 1], aq, b1);
        load_b2(b0, b1, (Vb + (b)*kTile * ld) + np * 16 * ld + ks * 16, ld);
        mma(ds[2 * np], ado, b0);  // dP
        mma(ds[2 * np + 1], ado, b1);
      }
    }
    const bool masked = k0 + kTile - 1 > wq0 || k0 + kTile > len || wq0 + 16 > len;
    for (int nt = 0; nt < kTile / 8; ++nt)
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, kc = k0 + nt * 8 + 2 * t + (e & 1);
        const bool ok = !masked || (kc <= row[r] && kc < len && row[r] < len);
        const float pe = ok ? exp2f(p[nt][e] * scale_log2 - lse2[r]) : 0.f;
        ds[nt][e] = pe * (ds[nt][e] - dl[r]);
      }
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t a[4];
      c_to_a(a, ds[2 * kk], ds[2 * kk + 1]);
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b0[2], b1[2];
        load_b2_trans(b0, b1, (Kb + (b)*kTile * ld) + kk * 16 * ld + dp * 16, ld);
        mma(acc[2 * dp], a, b0);
        mma(acc[2 * dp + 1], a, b1);
      }
    }
    cp_async_wait_all();
    __syncthreads();
  }
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    bf16* dst = dq + ((start + row[r]) * H + h) * int64_t(hd);
    for (int dt = 0; dt < D / 8; ++dt) {
      const int c = dt * 8 + 2 * t;
      if (c < hd)
        *reinterpret_cast<__nv_bfloat162*>(dst + c) =
            __floats2bfloat162_rn(acc[dt][2 * r] * scale, acc[dt][2 * r + 1] * scale);
    }
  }
}

template <int D, bool kAsync>
void launch(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
            const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq, float scale, cudaStream_t s) {
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dkdv<D, kAsync>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(dkdv_smem<D>())));
    CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dq<D, kAsync>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(dq_smem<D>())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1)), hd = int(q.dim(2));
  const int64_t N = q.dim(0);
  const unsigned tiles = unsigned((seq.max_seqlen + kTile - 1) / kTile), docs = unsigned(seq.cu_seqlens.numel() - 1);
  flash_backward_dkdv<D, kAsync><<<dim3(tiles, unsigned(Hkv), docs), kWarps * 32, dkdv_smem<D>(), s>>>(
      dk.as<bf16>(), dv.as<bf16>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), dout.as<bf16>(), lse.f32(), delta,
      seq.cu_seqlens.i32(), N, H, Hkv, hd, scale);
  CUDA_CHECK_LAUNCH();
  flash_backward_dq<D, kAsync><<<dim3(tiles, unsigned(H), docs), kWarps * 32, dq_smem<D>(), s>>>(
      dq.as<bf16>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), dout.as<bf16>(), lse.f32(), delta, seq.cu_seqlens.i32(),
      N, H, Hkv, hd, scale);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq,
                     float scale, cudaStream_t s) {
  if (q.dim(2) == D)
    launch<D, true>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, s);
  else
    launch<D, false>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, s);
}

}  // namespace

void CudaOps::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& lse, const SeqLayout& seq,
                                 float scale) {
  const auto prof = profile("attention_backward");
  const int64_t N = q.dim(0), H = q.dim(1), hd = q.dim(2);
  // One scratch: delta, then what the Hopper backward's form needs (fp32 dQ sums when dQ is fused)
  const size_t delta_bytes = (size_t(N * H) * sizeof(float) + 255) / 256 * 256;
  const size_t form_bytes = hopper_attention(hd) ? cuda::flash_backward_sm90_scratch(attention_backward_, q, seq) : 0;
  unsigned char* const scratch_bytes = static_cast<unsigned char*>(scratch(delta_bytes + form_bytes));
  float* delta = reinterpret_cast<float*>(scratch_bytes);
  const auto vec = [&](auto lanes) {  // hd / 8 lanes per row
    attention_delta_vec<lanes.value><<<unsigned((N * H * lanes.value + 255) / 256), 256, 0, stream_>>>(
        delta, dout.as<bf16>(), out.as<bf16>(), N, int(H));
  };
  if (hd == 128)
    vec(std::integral_constant<int, 16>{});
  else if (hd == 64)
    vec(std::integral_constant<int, 8>{});
  else
    attention_delta<<<unsigned((N * H + 7) / 8), 256, 0, stream_>>>(delta, dout.as<bf16>(), out.as<bf16>(), N, int(H),
                                                                    int(hd));
  CUDA_CHECK_LAUNCH();
  if (hopper_attention(hd))
    return cuda::flash_backward_sm90(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, attention_backward_,
                                     attention_order_, scratch_bytes + delta_bytes, stream_);
  with_head_dim(hd,
                [&](auto D) { launch_backward<D.value>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, stream_); });
}

}  // namespace soltrain
