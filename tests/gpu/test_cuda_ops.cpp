// Every CUDA op against its CPU twin on fresh random bf16-representable inputs, at several shapes
// (odd sizes included). Outputs start as NaN, so an element a kernel forgets to write fails the test.
#include <bit>

#include "gpu_test_util.h"
#include "kernels/blockwise4.h"
#include "kernels/blockwise8.h"
#include "kernels/stochastic_round.h"

namespace soltrain::test {
namespace {

using CudaOps = CudaTest;

TEST_F(CudaOps, LinearForwardAndBackward) {
  for (auto [N, in, out, with_bias] : {std::tuple{77, 96, 136, true}, {256, 512, 384, false}, {5, 64, 320, true}}) {
    auto x = randn(static_cast<size_t>(N * in)), w = randn(static_cast<size_t>(out * in), 0.05f),
         b = randn(static_cast<size_t>(out));
    auto dy = randn(static_cast<size_t>(N * out)), dx0 = randn(static_cast<size_t>(N * in)),
         dw0 = randn(static_cast<size_t>(out * in)), db0 = randn(static_cast<size_t>(out));
    // GPU
    Tensor gx = upload(x, {N, in}), gw = upload(w, {out, in}), gb = upload(b, {out}), gdy = upload(dy, {N, out});
    Tensor gy = poisoned({N, out}), gdx = upload(dx0, {N, in}), gdw = upload(dw0, {out, in}, DType::F32),
           gdb = upload(db0, {out}, DType::F32);
    gpu->linear_forward(gy, gx, gw, with_bias ? &gb : nullptr);
    gpu->linear_backward(&gdx, true, &gdw, with_bias ? &gdb : nullptr, gdy, gx, gw);
    // CPU twin
    std::vector<float> y(static_cast<size_t>(N * out)), dx = dx0, dw = dw0, db = db0;
    Tensor cy = host(y, {N, out}), cdx = host(dx, {N, in}), cdw = host(dw, {out, in}), cdb = host(db, {out});
    Tensor cb = host(b, {out});
    cpu->linear_forward(cy, host(x, {N, in}), host(w, {out, in}), with_bias ? &cb : nullptr);
    cpu->linear_backward(&cdx, true, &cdw, with_bias ? &cdb : nullptr, host(dy, {N, out}), host(x, {N, in}),
                         host(w, {out, in}));
    EXPECT_LE(rel(download(gy), y), 1e-2) << N << "x" << in << "x" << out;
    EXPECT_LE(rel(download(gdx), dx), 1e-2);
    EXPECT_LE(rel(download(gdw), dw), 1e-5);  // fp32 output, fp32 accumulation
    if (with_bias) {
      EXPECT_LE(rel(download(gdb), db), 1e-5);
    }
    // fp32 output (the LM head's logits)
    Tensor gy32 = poisoned({N, out}, DType::F32);
    gpu->linear_forward(gy32, gx, gw, nullptr);
    cpu->linear_forward(cy, host(x, {N, in}), host(w, {out, in}), nullptr);
    EXPECT_LE(rel(download(gy32), y), 1e-5);
  }
}

TEST_F(CudaOps, RmsNormForwardAndBackward) {
  for (auto [R, C] : {std::pair{100, 160}, {4096, 128}, {33, 1024}, {64, 4096}}) {  // a block a row below 512
    auto x = randn(static_cast<size_t>(R * C), 2.0f), w = randn(static_cast<size_t>(C)),
         dy = randn(static_cast<size_t>(R * C));
    auto dx0 = randn(static_cast<size_t>(R * C)), dw0 = randn(static_cast<size_t>(C));
    Tensor gy = poisoned({R, C}), grs = poisoned({R}, DType::F32), gx = upload(x, {R, C}), gw = upload(w, {C});
    Tensor gdx = upload(dx0, {R, C}), gdw = upload(dw0, {C}, DType::F32);
    gpu->rmsnorm_forward(gy, grs, gx, gw, 1e-6f);
    gpu->rmsnorm_backward(gdx, true, gdw, upload(dy, {R, C}), gx, gw, grs);
    std::vector<float> y(static_cast<size_t>(R * C)), rs(static_cast<size_t>(R)), dx = dx0, dw = dw0;
    cpu->rmsnorm_forward(host(y, {R, C}), host(rs, {R}), host(x, {R, C}), host(w, {C}), 1e-6f);
    cpu->rmsnorm_backward(host(dx, {R, C}), true, host(dw, {C}), host(dy, {R, C}), host(x, {R, C}), host(w, {C}),
                          host(rs, {R}));
    EXPECT_LE(rel(download(gy), y), 1e-2) << R << "x" << C;
    EXPECT_LE(rel(download(grs), rs), 1e-5);
    EXPECT_LE(rel(download(gdx), dx), 1e-2);
    EXPECT_LE(rel(download(gdw), dw), 1e-4);
  }
}

TEST_F(CudaOps, RopeBothDirections) {
  const int64_t N = 50, heads = 3, hd = 64;
  std::vector<int32_t> pos(N), cu = {0, int32_t(N)};
  for (auto& p : pos) p = int32_t(rng() % 5000);
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(hd));
  auto x = randn(static_cast<size_t>(N * heads * hd));
  for (bool inverse : {false, true}) {
    Tensor gx = upload(x, {N, heads, hd});
    gpu->rope(gx, SeqLayout{upload_i32(cu), upload_i32(pos), int(N)}, upload(inv, {hd / 2}, DType::F32), inverse);
    std::vector<float> cx = x;
    cpu->rope(host(cx, {N, heads, hd}), SeqLayout{host_i32(cu), host_i32(pos), int(N)}, host(inv, {hd / 2}), inverse);
    EXPECT_LE(rel(download(gx), cx), 1e-2) << (inverse ? "inverse" : "forward");
  }
}

// The fused residual-add + RMSNorm: against the CPU's separate ops, and bitwise against the GPU's own
// separate norm of the sum it wrote (a recompute normalises that stored sum with rmsnorm_forward).
TEST_F(CudaOps, AddRmsNormMatchesTheSeparateOps) {
  // a block a row (fewer than 512 rows; 5120 takes two vectors a thread), a warp a row, the scalar path
  for (auto [R, C] : {std::pair{100, 160}, {300, 5120}, {64, 4096}, {513, 1024}, {37, 100}}) {
    auto a = randn(static_cast<size_t>(R * C), 2.0f), b = randn(static_cast<size_t>(R * C)),
         w = randn(static_cast<size_t>(C));
    Tensor gsum = poisoned({R, C}), gy = poisoned({R, C}), grs = poisoned({R}, DType::F32), gw = upload(w, {C});
    gpu->add_rmsnorm_forward(gsum, gy, grs, upload(a, {R, C}), upload(b, {R, C}), gw, 1e-6f);
    std::vector<float> sum(a.size()), y(a.size()), rs(static_cast<size_t>(R));
    cpu->add_rmsnorm_forward(host(sum, {R, C}), host(y, {R, C}), host(rs, {R}), host(a, {R, C}), host(b, {R, C}),
                             host(w, {C}), 1e-6f);
    EXPECT_LE(rel(download(gsum), sum), 1e-2) << R << "x" << C;
    EXPECT_LE(rel(download(gy), y), 1e-2);
    EXPECT_LE(rel(download(grs), rs), 2e-3);  // the GPU normalises the bf16-rounded sum
    Tensor gy2 = poisoned({R, C}), grs2 = poisoned({R}, DType::F32);
    gpu->rmsnorm_forward(gy2, grs2, gsum, gw, 1e-6f);
    EXPECT_EQ(download(gy2), download(gy));
    EXPECT_EQ(download(grs2), download(grs));
  }
}

// Qwen3's q/k norm fused with RoPE, both directions, against the CPU's separate ops (its default).
TEST_F(CudaOps, QkNormRopeMatchesTheSeparateOps) {
  for (auto [heads, hd] : {std::pair{16, 128}, {3, 64}, {5, 24}, {2, 256}, {3, 18}}) {  // 18: separate ops
    const int64_t N = 70, H = heads;
    std::vector<int32_t> pos(N), cu = {0, 30, int32_t(N)};
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i < 30 ? i : i - 30) + int32_t(rng() % 3000);
    std::vector<float> inv(size_t(hd / 2));
    for (int i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(1e6f, -2.0f * float(i) / float(hd));
    auto x = randn(static_cast<size_t>(N * H * hd), 3.0f), w = randn(static_cast<size_t>(hd)),
         dy = randn(static_cast<size_t>(N * H * hd));
    auto dw0 = randn(static_cast<size_t>(hd));
    const SeqLayout gs{upload_i32(cu), upload_i32(pos), int(N)}, cs{host_i32(cu), host_i32(pos), int(N)};
    const Tensor ginv = upload(inv, {hd / 2}, DType::F32), gx = upload(x, {N, H, hd}), gw = upload(w, {hd});
    Tensor gy = poisoned({N, H, hd}), grs = poisoned({N * H}, DType::F32);
    gpu->qk_norm_rope_forward(gy, grs, gx, gw, gs, ginv, 1e-6f);
    Tensor gdx = poisoned({N, H, hd}), gdy = upload(dy, {N, H, hd}), gdw = upload(dw0, {hd}, DType::F32);
    gpu->qk_norm_rope_backward(gdx, gdw, gdy, gx, gw, grs, gs, ginv);

    std::vector<float> y(x.size()), rs(static_cast<size_t>(N * H)), dx(x.size()), cdy = dy, dw = dw0;
    cpu->qk_norm_rope_forward(host(y, {N, H, hd}), host(rs, {N * H}), host(x, {N, H, hd}), host(w, {hd}), cs,
                              host(inv, {hd / 2}), 1e-6f);
    cpu->qk_norm_rope_backward(host(dx, {N, H, hd}), host(dw, {hd}), host(cdy, {N, H, hd}), host(x, {N, H, hd}),
                               host(w, {hd}), host(rs, {N * H}), cs, host(inv, {hd / 2}));
    EXPECT_LE(rel(download(gy), y), 1e-2) << H << "x" << hd;
    EXPECT_LE(rel(download(grs), rs), 1e-5);
    EXPECT_LE(rel(download(gdy), cdy), 1e-2);  // dy rotated back in place
    EXPECT_LE(rel(download(gdx), dx), 1e-2);
    EXPECT_LE(rel(download(gdw), dw), 5e-3);  // from the bf16-rounded, rotated-back dy
  }
}

TEST_F(CudaOps, SwiGluAndResidualAddBothPaths) {
  for (int64_t n : {int64_t(3 * 1000 + 7), int64_t(3 * 4096)}) {  // scalar tail path, 16-byte vector path
    auto g = randn(static_cast<size_t>(n), 2.0f), u = randn(static_cast<size_t>(n)), d = randn(static_cast<size_t>(n));
    Tensor go = poisoned({n}), gdg = poisoned({n}), gdu = poisoned({n});
    Tensor gg = upload(g, {n}), gu = upload(u, {n});
    gpu->swiglu_forward(go, gg, gu);
    gpu->swiglu_backward(gdg, gdu, upload(d, {n}), gg, gu);
    std::vector<float> o(static_cast<size_t>(n)), dg(static_cast<size_t>(n)), du(static_cast<size_t>(n));
    cpu->swiglu_forward(host(o, {n}), host(g, {n}), host(u, {n}));
    cpu->swiglu_backward(host(dg, {n}), host(du, {n}), host(d, {n}), host(g, {n}), host(u, {n}));
    EXPECT_LE(rel(download(go), o), 1e-2) << n;
    EXPECT_LE(rel(download(gdg), dg), 1e-2) << n;
    EXPECT_LE(rel(download(gdu), du), 1e-2) << n;
    // x += y, against the CPU on the same bf16 inputs
    Tensor gx = upload(g, {n});
    gpu->add_inplace(gx, gu);
    std::vector<float> x = g;
    cpu->add_inplace(host(x, {n}), host(u, {n}));
    EXPECT_LE(rel(download(gx), x), 1e-2) << n;
    // and in fp32 (ZeRO-3's gradient slices): exactly the CPU's sums
    std::vector<float> fx = randn(static_cast<size_t>(n)), fy = randn(static_cast<size_t>(n));
    Tensor fdx = upload(fx, {n}, DType::F32);
    gpu->add_inplace(fdx, upload(fy, {n}, DType::F32));
    cpu->add_inplace(host(fx, {n}), host(fy, {n}));
    EXPECT_EQ(download(fdx), fx) << n;
  }
}

TEST_F(CudaOps, CrossEntropyWithIgnoredTargetsAndRowWeights) {
  // vocabularies split evenly, unevenly, odd (scalar accesses), and smaller than one block per cluster slot
  for (auto [n, V] : {std::pair{37, 1000}, {8, 151936}, {5, 997}, {3, 10}}) {
    auto logits = randn(static_cast<size_t>(n * V), 3.0f);
    std::vector<int32_t> tgt(static_cast<size_t>(n));
    for (auto& t : tgt) t = rng() % 4 == 0 ? -100 : int32_t(rng() % uint32_t(V));
    auto weight = randn(static_cast<size_t>(n), 0.3f);  // any sign: DPO's weights are
    Tensor gl = upload(logits, {n, V}, DType::F32), gd = poisoned({n, V}), gloss = poisoned({n}, DType::F32),
           gent = poisoned({n}, DType::F32);
    gpu->cross_entropy(gl, gd, gloss, upload_i32(tgt), upload(weight, {n}, DType::F32), gent);
    std::vector<float> d = logits, loss(static_cast<size_t>(n)), ent(static_cast<size_t>(n));
    cpu->cross_entropy(host(d, {n, V}), host(d, {n, V}), host(loss, {n}), host_i32(tgt), host(weight, {n}),
                       host(ent, {n}));
    EXPECT_LE(rel(download(gloss), loss), 1e-5) << n << "x" << V;
    EXPECT_LE(rel(download(gent), ent), 1e-5) << n << "x" << V;  // the entropy (GRPO's metric), -100 rows 0
    const auto got = download(gd);
    EXPECT_LE(rel(got, d), 1e-2);
    EXPECT_TRUE(all_close(got, d, 1e-2 * rms(d), 1e-2));
    // Without weights only the loss is written: the gradient buffer keeps what it had.
    Tensor untouched = poisoned({n, V}), gloss2 = poisoned({n}, DType::F32);
    gpu->cross_entropy(gl, untouched, gloss2, upload_i32(tgt), Tensor{}, Tensor{});
    EXPECT_EQ(download(gloss2), download(gloss));
    EXPECT_TRUE(std::isnan(download(untouched)[0]));
  }
}

TEST_F(CudaOps, DeviceSideReductionsFillAndDocumentSums) {
  const int64_t n = 200003;
  auto x = randn(static_cast<size_t>(n));
  Tensor gx = upload(x, {n}, DType::F32);
  Buffer acc = gpu->alloc(sizeof(double));
  const Tensor gacc{acc.data(), DType::F64, {1}, Device::CUDA};
  auto read = [&] {
    double v = 0;
    gpu->copy(Tensor{&v, DType::F64, {1}, Device::CPU}, gacc);
    return v;
  };
  gpu->reduce_sum(gacc, gx, true, false);
  const double sq = read();
  EXPECT_EQ(sq, gpu->sum_squares(gx));  // the same fixed order as the host-returning sum
  gpu->reduce_sum(gacc, gx, false, true);
  EXPECT_NEAR(read(), sq + cpu->sum(host(x, {n})), 1e-9 * sq);
  // documents of random lengths, one of a single token
  std::vector<int32_t> cu = {0, 1};
  while (cu.back() < n) cu.push_back(std::min<int32_t>(int32_t(n), cu.back() + 1 + int32_t(rng() % 3000)));
  const int64_t docs = int64_t(cu.size()) - 1;
  Tensor gs = poisoned({docs}, DType::F32);
  gpu->segment_sum(gs, gx, upload_i32(cu));
  std::vector<float> want(static_cast<size_t>(docs));
  cpu->segment_sum(host(want, {docs}), host(x, {n}), host_i32(cu));
  EXPECT_TRUE(all_close(download(gs), want, 1e-5, 1e-6));
  gpu->fill(gx, -0.25f);
  for (float v : download(gx)) ASSERT_EQ(v, -0.25f);
}

TEST_F(CudaOps, AdamWClipsFromTheDeviceSideNormLikeTheHost) {
  const int64_t n = 4099;
  auto w = randn(static_cast<size_t>(n)), g = randn(static_cast<size_t>(n), 3.0f);
  std::vector<float> m(static_cast<size_t>(n), 0.0f), v = m;
  Tensor gw = upload(w, {n}, DType::F32), gm = upload(m, {n}, DType::F32), gv = upload(v, {n}, DType::F32);
  Tensor gg = upload(g, {n}, DType::F32);
  Buffer acc = gpu->alloc(sizeof(double));
  const Tensor gsum{acc.data(), DType::F64, {1}, Device::CUDA};
  gpu->reduce_sum(gsum, gg, true, false);
  AdamWParams p{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  p.grad_sumsq = &gsum;
  p.max_grad_norm = 1.0f;
  gpu->adamw(gw, gg, gm, gv, p, nullptr);
  // The host path: the factor from the norm, passed in.
  const double sumsq = cpu->sum_squares(host(g, {n}));
  AdamWParams q{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, clip_factor(sumsq, 1.0f)};
  ASSERT_LT(q.grad_scale, 0.5f) << "the gradient must be clipped for this test to mean anything";
  cpu->adamw(host(w, {n}), host(g, {n}), host(m, {n}), host(v, {n}), q, nullptr);
  EXPECT_LE(rel(download(gw), w), 1e-6);
  EXPECT_LE(rel(download(gm), m), 1e-6);
}

TEST_F(CudaOps, AsyncUploadsFromPinnedMemoryAndASideStream) {
  const int64_t n = 1 << 20;
  Buffer pinned = gpu->alloc_host(size_t(n) * 4);
  auto* h = static_cast<float*>(pinned.data());
  auto x = randn(static_cast<size_t>(n));
  std::copy(x.begin(), x.end(), h);
  Tensor dst = poisoned({n}, DType::F32);
  gpu->upload_async(dst, Tensor{h, DType::F32, {n}, Device::CPU});
  gpu->host_wait(gpu->mark());
  std::fill(h, h + n, 0.0f);  // the copy is done: changing the source changes nothing
  EXPECT_EQ(download(dst), x);
  // Work on the side stream, ordered after the main stream's and before the main stream's next.
  Tensor y = upload(x, {n}, DType::F32);
  gpu->use_stream(Ops::Stream::Side);
  gpu->wait(Ops::Stream::Side, Ops::Stream::Main);
  gpu->scale(y, 2.0f);
  gpu->use_stream(Ops::Stream::Main);
  gpu->wait(Ops::Stream::Main, Ops::Stream::Side);
  gpu->scale(y, 0.5f);
  EXPECT_EQ(download(y), x);
  EXPECT_NE(gpu->native_stream(Ops::Stream::Main), gpu->native_stream(Ops::Stream::Side));
}

TEST_F(CudaOps, EmbeddingForwardAndDeterministicBackward) {
  const int64_t V = 1000, D = 96, N = 500;
  auto table = randn(static_cast<size_t>(V * D)), dout = randn(static_cast<size_t>(N * D)),
       dt0 = randn(static_cast<size_t>(V * D));
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& i : ids) i = int32_t(rng() % 40);  // many repeats: the accumulation order matters
  Tensor gids = upload_i32(ids), gout = poisoned({N, D}), gdt = upload(dt0, {V, D}, DType::F32);
  gpu->embedding_forward(gout, gids, upload(table, {V, D}));
  const Tensor gdout = upload(dout, {N, D});
  gpu->embedding_backward(gdt, gids, gdout);
  std::vector<float> out(static_cast<size_t>(N * D)), dt = dt0;
  cpu->embedding_forward(host(out, {N, D}), host_i32(ids), host(table, {V, D}));
  cpu->embedding_backward(host(dt, {V, D}), host_i32(ids), host(dout, {N, D}));
  EXPECT_EQ(download(gout), out);  // a copy: exact
  const auto first = download(gdt);
  EXPECT_LE(rel(first, dt), 1e-6);
  gpu->copy(gdt, upload(dt0, {V, D}, DType::F32));
  gpu->embedding_backward(gdt, gids, gdout);
  EXPECT_EQ(download(gdt), first) << "not bitwise repeatable";
  // torch's padding_idx: that row gets nothing (the CPU's twin), the others as before
  gpu->copy(gdt, upload(dt0, {V, D}, DType::F32));
  gpu->embedding_backward(gdt, gids, gdout, ids[7]);
  std::vector<float> padded = dt0;
  cpu->embedding_backward(host(padded, {V, D}), host_i32(ids), host(dout, {N, D}), ids[7]);
  const auto got = download(gdt);
  EXPECT_LE(rel(got, padded), 1e-6);
  for (int64_t d = 0; d < D; ++d) EXPECT_EQ(got[size_t(ids[7] * D + d)], dt0[size_t(ids[7] * D + d)]);
}

TEST_F(CudaOps, AdamWMatchesTheCpuAndWritesTheBf16Copy) {
  const int64_t n = 10007;
  auto w = randn(static_cast<size_t>(n)), m0 = randn(static_cast<size_t>(n), 0.01f),
       v0 = randn(static_cast<size_t>(n), 0.01f);
  for (float& x : v0) x = x * x;
  Tensor gw = upload(w, {n}, DType::F32), gm = upload(m0, {n}, DType::F32), gv = upload(v0, {n}, DType::F32);
  Tensor copy = poisoned({n});
  std::vector<float> cw = w, cm = m0, cv = v0;
  for (int step = 1; step <= 3; ++step) {
    auto g = randn(static_cast<size_t>(n), 0.1f);
    const AdamWParams p{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, step == 2 ? 0.37f : 1.0f, nullptr, 0};  // clipped too
    gpu->adamw(gw, upload(g, {n}, DType::F32), gm, gv, p, &copy);
    cpu->adamw(host(cw, {n}), host(g, {n}), host(cm, {n}), host(cv, {n}), p, nullptr);
  }
  const auto got = download(gw);
  EXPECT_LE(rel(got, cw), 1e-6);
  const auto c = download(copy);
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], bf16_to_f32(f32_to_bf16(got[i]))) << i;
}

// bf16_stochastic_round: a BF16 master (no fp32 copy) updated in fp32 and rounded stochastically with the bits
// stochastic_bits(sr_seed, i): the device and the CPU twin draw the same bits, so the masters agree but where the
// fp32 update itself differs by rounding near a bf16 boundary (then by one ulp), fp32 and 8-bit moments, three steps
// each; the moments to fp32 rounding.
TEST_F(CudaOps, AdamWBf16StochasticMastersMatchTheCpu) {
  // (41 whole blocks take the 16-byte kernel, the 77 left the element-wise one; each moment's codes start 4-byte
  // aligned, as the store's do, so the 16-byte path is the one taken)
  const int64_t n = 256 * 41 + 77, blocks = (n + 255) / 256, stride = blocks * 256;
  const auto w0 = random_vec(static_cast<size_t>(n), rng, 1.0f);
  const auto ms = dynamic_quant_map(true), us = dynamic_quant_map(false);
  std::vector<float> maps(ms.begin(), ms.end());
  maps.insert(maps.end(), us.begin(), us.end());
  for (const bool eight : {false, true}) {
    SCOPED_TRACE(eight ? "8-bit moments" : "fp32 moments");
    std::vector<uint16_t> cb(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) cb[size_t(i)] = f32_to_bf16(w0[size_t(i)]);
    Tensor gw = upload(w0, {n}, DType::BF16);  // (rounded to nearest, as cb)
    std::vector<float> cm(static_cast<size_t>(n), 0.0f), cv(static_cast<size_t>(n), 0.0f);
    Tensor gm = upload(cm, {n}, DType::F32), gv = upload(cv, {n}, DType::F32), gmaps = upload(maps, {512}, DType::F32);
    buffers.push_back(gpu->alloc(size_t(2 * stride)));
    Tensor gcodes{buffers.back().data(), DType::U8, {2 * stride}, Device::CUDA};
    gpu->zero(gcodes);
    Tensor gabs = upload(std::vector<float>(size_t(2 * blocks), 0.0f), {2 * blocks}, DType::F32);
    std::vector<uint8_t> ccodes(size_t(2 * stride), 0);
    std::vector<float> cabs(size_t(2 * blocks), 0.0f);
    auto part = [&](Tensor codes, Tensor abs, Tensor map, int k) {
      return Blockwise8{Tensor{codes.as<uint8_t>() + k * stride, DType::U8, {n}, codes.device},
                        Tensor{abs.as<float>() + k * blocks, DType::F32, {blocks}, abs.device},
                        Tensor{map.as<float>() + k * 256, DType::F32, {256}, map.device}};
    };
    Tensor hcodes{ccodes.data(), DType::U8, {2 * stride}}, habs = host(cabs, {2 * blocks}), hmaps = host(maps, {512});
    Tensor cmaster{cb.data(), DType::BF16, {n}};
    for (int step = 1; step <= 3; ++step) {
      auto g = random_vec(static_cast<size_t>(n), rng, 0.1f);
      AdamWParams p{1e-2f, 0.9, 0.999, 1e-8f, 0.1f, step, 1.0f, nullptr, 0};
      p.sr_seed = stochastic_seed_at(stochastic_step_seed(step), 4242);
      if (eight) {
        gpu->adamw_8bit(gw, upload(g, {n}, DType::F32), part(gcodes, gabs, gmaps, 0), part(gcodes, gabs, gmaps, 1), p,
                        nullptr);
        cpu->adamw_8bit(cmaster, host(g, {n}), part(hcodes, habs, hmaps, 0), part(hcodes, habs, hmaps, 1), p, nullptr);
      } else {
        gpu->adamw(gw, upload(g, {n}, DType::F32), gm, gv, p, nullptr);
        cpu->adamw(cmaster, host(g, {n}), host(cm, {n}), host(cv, {n}), p, nullptr);
      }
    }
    const auto got = download(gw);
    int64_t differ = 0, moved = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t a = f32_to_bf16(got[size_t(i)]), b = cb[size_t(i)];
      ASSERT_LE(std::abs(int(a) - int(b)), 1) << i << ": " << got[size_t(i)] << " vs " << bf16_to_f32(b);
      differ += a != b;
      moved += b != f32_to_bf16(w0[size_t(i)]);
    }
    EXPECT_LE(differ, n / 200) << "masters one ulp apart";
    EXPECT_GT(moved, n / 2) << "the updates moved the weights";
    if (eight) {
      EXPECT_LE(rel(download(gabs), cabs), 1e-5);
    } else {
      EXPECT_LE(rel(download(gm), cm), 1e-5);
      EXPECT_LE(rel(download(gv), cv), 1e-5);
    }
  }
}

// torchao's 4-bit AdamW against the CPU twin over three steps: parameters to fp32 rounding, the scales equal but for
// rounding, and codes equal but where a moment lands within rounding of a bucket edge (fused multiply-adds here).
TEST_F(CudaOps, AdamW4bitMatchesTheCpu) {
  const int64_t n = 128 * 70, blocks = n / 128;
  auto w = randn(static_cast<size_t>(n));
  Tensor gw = upload(w, {n}, DType::F32), copy = poisoned({n});
  std::vector<float> cw = w;
  std::vector<uint8_t> codes[2] = {std::vector<uint8_t>(size_t(n / 2), 0), std::vector<uint8_t>(size_t(n / 2), 0)};
  std::vector<float> scales[2] = {std::vector<float>(size_t(blocks), 0), std::vector<float>(size_t(blocks), 0)};
  std::vector<float> maps[2] = {std::vector<float>(std::begin(kTorchao4SignedMap), std::end(kTorchao4SignedMap)),
                                std::vector<float>(std::begin(kTorchao4UnsignedMap), std::end(kTorchao4UnsignedMap))};
  Tensor gcodes[2], gscales[2], gmaps[2];
  for (int k = 0; k < 2; ++k) {
    buffers.push_back(gpu->alloc(size_t(n / 2)));
    gcodes[k] = Tensor{buffers.back().data(), DType::U8, {n / 2}, Device::CUDA};
    gscales[k] = upload(scales[k], {blocks}, DType::F32);
    gmaps[k] = upload(maps[k], {16}, DType::F32);
  }
  auto host_state = [&](int k) {
    return Blockwise8{Tensor{codes[k].data(), DType::U8, {n / 2}}, host(scales[k], {blocks}), host(maps[k], {16})};
  };
  for (int step = 1; step <= 3; ++step) {
    auto g = randn(static_cast<size_t>(n), 0.1f);
    const AdamWParams p{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step, step == 2 ? 0.5f : 1.0f, nullptr, 0};
    gpu->adamw_4bit(gw, upload(g, {n}, DType::F32), Blockwise8{gcodes[0], gscales[0], gmaps[0]},
                    Blockwise8{gcodes[1], gscales[1], gmaps[1]}, p, &copy);
    cpu->adamw_4bit(host(cw, {n}), host(g, {n}), host_state(0), host_state(1), p, nullptr);
  }
  EXPECT_LE(rel(download(gw), cw), 1e-5);
  for (int k = 0; k < 2; ++k) {
    EXPECT_LE(rel(download(gscales[k]), scales[k]), 1e-5) << k;
    std::vector<uint8_t> got(size_t(n / 2));
    gpu->copy(Tensor{got.data(), DType::U8, {n / 2}}, gcodes[k]);
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != codes[k][i];
    EXPECT_LE(differ, n / 200) << "moment " << k << ": " << differ << " code bytes differ";
  }
  const auto c = download(copy), got = download(gw);
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], bf16_to_f32(f32_to_bf16(got[i]))) << i;
}

// Muon's three ops against the CPU twin (fp32 there; bf16 Newton-Schulz here, as torch's bf16 matmuls), a wide and a
// tall matrix, with clipping decided on the device: the momentum to fp32 rounding, Σu² to bf16's, the orthogonalised
// update to bf16 GEMM rounding, and the masters after the step.
TEST_F(CudaOps, MuonMatchesTheCpu) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{48, 200}, {320, 96}}) {
    const int64_t n = rows * cols, k = std::min(rows, cols);
    auto w = randn(static_cast<size_t>(n)), m0 = randn(static_cast<size_t>(n), 0.01f),
         g = randn(static_cast<size_t>(n), 0.1f);
    MuonParams p;
    p.momentum = 0.9f;
    double clip_sumsq = 9.0;  // ‖g‖ 3 over a max norm of 1: a factor of 1/3
    auto f64 = [&] {
      buffers.push_back(gpu->alloc(sizeof(double)));
      return Tensor{buffers.back().data(), DType::F64, {1}, Device::CUDA};
    };
    Tensor gclip = f64();
    gpu->copy(gclip, Tensor{&clip_sumsq, DType::F64, {1}, Device::CPU});
    p.max_grad_norm = 1.0f;
    // GPU
    Tensor gw = upload(w, {n}, DType::F32), gm = upload(m0, {n}, DType::F32), gu = poisoned({rows, cols});
    Tensor gss = f64();
    Tensor scratch = poisoned({2 * k * k + n});
    MuonParams pg = p;
    pg.grad_sumsq = &gclip;
    gpu->muon_momentum(gu.view({n}), gm, upload(g, {n}, DType::F32), gss, pg);
    double gpu_ss = 0;
    gpu->copy(Tensor{&gpu_ss, DType::F64, {1}, Device::CPU}, gss);
    const std::vector<float> gpu_u = download(gu);
    gpu->newton_schulz(gu, gss, scratch, pg);
    const std::vector<float> gpu_x = download(gu);
    Tensor copy = poisoned({n});
    gpu->muon_update(gw, gu.view({n}), 0.999f, 0.02f, &copy);
    // CPU
    std::vector<float> cw = w, cm = m0, cu(static_cast<size_t>(n)), cscratch(static_cast<size_t>(2 * k * k + n));
    double cpu_ss = 0;
    MuonParams pc = p;
    Tensor csum{&clip_sumsq, DType::F64, {1}, Device::CPU};
    pc.grad_sumsq = &csum;
    cpu->muon_momentum(host(cu, {n}), host(cm, {n}), host(g, {n}), Tensor{&cpu_ss, DType::F64, {1}, Device::CPU}, pc);
    EXPECT_LE(rel(download(gm), cm), 1e-6) << rows << "x" << cols;
    EXPECT_LE(rel(gpu_u, cu), 5e-3);
    EXPECT_NEAR(gpu_ss, cpu_ss, 1e-2 * cpu_ss);
    cpu->newton_schulz(host(cu, {rows, cols}), Tensor{&cpu_ss, DType::F64, {1}, Device::CPU},
                       host(cscratch, {2 * k * k + n}), pc);
    EXPECT_LE(rel(gpu_x, cu), 4e-2) << rows << "x" << cols;
    cpu->muon_update(host(cw, {n}), host(cu, {n}), 0.999f, 0.02f, nullptr);
    EXPECT_LE(rel(download(gw), cw), 1e-4);
    const auto c = download(copy), got = download(gw);
    for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], bf16_to_f32(f32_to_bf16(got[i]))) << i;
  }
}

// NorMuon's ops (Surogate's optimizer: normuon) against the CPU twin: the plain momentum, Polar Express's schedule in
// bf16 GEMMs, the variance EMA per row (tall) or column (wide) and the cautious step; two steps, so the EMA carries.
TEST_F(CudaOps, NorMuonMatchesTheCpu) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{48, 200}, {320, 96}}) {
    const int64_t n = rows * cols, k = std::min(rows, cols), lines = std::max(rows, cols);
    auto w = randn(static_cast<size_t>(n)), m0 = randn(static_cast<size_t>(n), 0.01f);
    MuonParams p;
    p.nesterov = false, p.coefficients = kPolarExpress, p.norm_scale = 1.02f, p.eps = 1e-6f;
    auto f64 = [&] {
      buffers.push_back(gpu->alloc(sizeof(double)));
      return Tensor{buffers.back().data(), DType::F64, {1}, Device::CUDA};
    };
    Tensor gw = upload(w, {n}, DType::F32), gm = upload(m0, {n}, DType::F32), gu = poisoned({rows, cols});
    Tensor gv = upload(std::vector<float>(size_t(lines), 0.0f), {lines}, DType::F32), gss = f64();
    Tensor scratch = poisoned({2 * k * k + n}), copy = poisoned({n});
    std::vector<float> cw = w, cm = m0, cu(static_cast<size_t>(n)), cv(size_t(lines), 0.0f),
                       cscratch(static_cast<size_t>(2 * k * k + n));
    for (int step = 0; step < 2; ++step) {
      auto g = randn(static_cast<size_t>(n), 0.1f);
      gpu->muon_momentum(gu.view({n}), gm, upload(g, {n}, DType::F32), gss, p);
      gpu->newton_schulz(gu, gss, scratch, p);
      gpu->normuon_variance(gu, gv, 0.95f);
      gpu->normuon_update(gw, gu.view({n}), 0.02f * 0.1f, 0.02f, &copy);
      double cpu_ss = 0;
      const Tensor css{&cpu_ss, DType::F64, {1}, Device::CPU};
      cpu->muon_momentum(host(cu, {n}), host(cm, {n}), host(g, {n}), css, p);
      EXPECT_LE(rel(download(gm), cm), 1e-6) << rows << "x" << cols;
      cpu->newton_schulz(host(cu, {rows, cols}), css, host(cscratch, {2 * k * k + n}), p);
      cpu->normuon_variance(host(cu, {rows, cols}), host(cv, {lines}), 0.95f);
      EXPECT_LE(rel(download(gv), cv), 5e-2) << rows << "x" << cols << " step " << step;
      std::vector<float> u = download(gu);
      EXPECT_LE(rel(u, cu), 5e-2) << rows << "x" << cols << " step " << step;
      // the cautious step on the device's own update (its bf16 orthogonalisation's error is bounded just above; at
      // lr 0.02 it moves the masters ~1.5e-3 relative, more than this step's own rounding could)
      cpu->normuon_update(host(cw, {n}), host(u, {n}), 0.02f * 0.1f, 0.02f, nullptr);
      EXPECT_LE(rel(download(gw), cw), 1e-6) << rows << "x" << cols << " step " << step;
    }
    const auto c = download(copy), got = download(gw);
    for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], bf16_to_f32(f32_to_bf16(got[i]))) << i;
  }
}

// 8-bit blockwise AdamW (bitsandbytes' format) against the CPU twin over several steps, a tail block included:
// codes may differ only where a moment lands within rounding of a bucket boundary (fused multiply-adds on the
// GPU), parameters and absmax to fp32 rounding.
TEST_F(CudaOps, AdamW8bitMatchesTheCpu) {
  const int64_t n = 9000, blocks = (n + 255) / 256;
  auto w = random_vec(static_cast<size_t>(n), rng, 1.0f);
  const auto ms = dynamic_quant_map(true), us = dynamic_quant_map(false);
  std::vector<float> maps(ms.begin(), ms.end());
  maps.insert(maps.end(), us.begin(), us.end());
  Tensor gw = upload(w, {n}, DType::F32), gmaps = upload(maps, {512}, DType::F32);
  buffers.push_back(gpu->alloc(size_t(2 * n)));
  Tensor gcodes{buffers.back().data(), DType::U8, {2 * n}, Device::CUDA};
  Tensor gabs = upload(std::vector<float>(size_t(2 * blocks), 0.0f), {2 * blocks}, DType::F32);
  Tensor copy = poisoned({n});
  std::vector<uint8_t> ccodes(size_t(2 * n), 0);
  std::vector<float> cw = w, cabs(size_t(2 * blocks), 0.0f);
  auto part = [&](Tensor codes, Tensor abs, Tensor map, int k) {
    return Blockwise8{Tensor{codes.as<uint8_t>() + k * n, DType::U8, {n}, codes.device},
                      Tensor{abs.as<float>() + k * blocks, DType::F32, {blocks}, abs.device},
                      Tensor{map.as<float>() + k * 256, DType::F32, {256}, map.device}};
  };
  Tensor hcodes{ccodes.data(), DType::U8, {2 * n}}, habs = host(cabs, {2 * blocks}), hmaps = host(maps, {512});
  for (int step = 1; step <= 4; ++step) {
    auto g = random_vec(static_cast<size_t>(n), rng, 0.1f * float(step));
    const AdamWParams p{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step, step == 3 ? 0.5f : 1.0f, nullptr, 0};
    gpu->adamw_8bit(gw, upload(g, {n}, DType::F32), part(gcodes, gabs, gmaps, 0), part(gcodes, gabs, gmaps, 1), p,
                    &copy);
    cpu->adamw_8bit(host(cw, {n}), host(g, {n}), part(hcodes, habs, hmaps, 0), part(hcodes, habs, hmaps, 1), p,
                    nullptr);
  }
  EXPECT_LE(rel(download(gw), cw), 1e-5);
  EXPECT_LE(rel(download(gabs), cabs), 1e-5);
  std::vector<uint8_t> got(size_t(2 * n));
  gpu->copy(Tensor{got.data(), DType::U8, {2 * n}}, gcodes);
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(int(got[i]) - int(ccodes[i])), 1) << i;
    differ += got[i] != ccodes[i];
  }
  EXPECT_LE(differ, 2 * n / 200) << "codes differing by one step";
  const auto gcopy = download(copy), gwd = download(gw);
  for (size_t i = 0; i < gcopy.size(); ++i) ASSERT_EQ(gcopy[i], bf16_to_f32(f32_to_bf16(gwd[i]))) << i;
}

// Whole blocks on aligned storage take a 16-byte kernel (lanes hold other elements of the block); storage one
// float off alignment takes the element-wise one. Both must give the same bits: w, the bf16 copy, codes, absmax.
TEST_F(CudaOps, AdamW8bitVectorPathEqualsTheElementwisePath) {
  const int64_t n = 256 * 37 + 100, blocks = (n + 255) / 256;
  const auto w0 = random_vec(static_cast<size_t>(n), rng, 1.0f);
  const auto ms = dynamic_quant_map(true), us = dynamic_quant_map(false);
  std::vector<float> maps(ms.begin(), ms.end());
  maps.insert(maps.end(), us.begin(), us.end());
  Tensor gmaps = upload(maps, {512}, DType::F32);
  struct Run {
    std::vector<float> w, copy, abs;
    std::vector<uint8_t> codes;
  };
  std::vector<std::vector<float>> grads;
  for (int step = 0; step < 3; ++step) grads.push_back(random_vec(static_cast<size_t>(n), rng, 0.1f));
  auto run = [&](int64_t shift) {  // shift: elements of offset into every buffer (1 breaks 16-byte alignment)
    std::vector<float> wpad(size_t(n + shift), 0.0f);
    std::copy(w0.begin(), w0.end(), wpad.begin() + shift);
    Tensor wb = upload(wpad, {n + shift}, DType::F32), cb = poisoned({n + shift});
    Tensor w{wb.as<float>() + shift, DType::F32, {n}, Device::CUDA};
    Tensor copy{static_cast<uint16_t*>(cb.data) + shift, DType::BF16, {n}, Device::CUDA};
    buffers.push_back(gpu->alloc(size_t(2 * n + 2 * shift)));
    uint8_t* codes = static_cast<uint8_t*>(buffers.back().data()) + shift;
    gpu->copy(Tensor{codes, DType::U8, {2 * n}, Device::CUDA},
              Tensor{std::vector<uint8_t>(size_t(2 * n), 127).data(), DType::U8, {2 * n}});
    Tensor abs = upload(std::vector<float>(size_t(2 * blocks), 0.0f), {2 * blocks}, DType::F32);
    auto part = [&](int k) {
      return Blockwise8{Tensor{codes + k * n, DType::U8, {n}, Device::CUDA},
                        Tensor{abs.as<float>() + k * blocks, DType::F32, {blocks}, Device::CUDA},
                        Tensor{gmaps.as<float>() + k * 256, DType::F32, {256}, Device::CUDA}};
    };
    for (int step = 1; step <= 3; ++step) {
      const AdamWParams p{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step, 1.0f, nullptr, 0};
      gpu->adamw_8bit(w, upload(grads[size_t(step - 1)], {n}, DType::F32), part(0), part(1), p, &copy);
    }
    Run r{download(w), download(copy), download(abs), std::vector<uint8_t>(size_t(2 * n))};
    gpu->copy(Tensor{r.codes.data(), DType::U8, {2 * n}}, Tensor{codes, DType::U8, {2 * n}, Device::CUDA});
    return r;
  };
  const Run vec = run(0), elem = run(1);
  for (size_t i = 0; i < size_t(n); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(vec.w[i]), std::bit_cast<uint32_t>(elem.w[i])) << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(vec.copy[i]), std::bit_cast<uint32_t>(elem.copy[i])) << i;
  }
  for (size_t i = 0; i < vec.codes.size(); ++i) ASSERT_EQ(vec.codes[i], elem.codes[i]) << i;
  for (size_t i = 0; i < vec.abs.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(vec.abs[i]), std::bit_cast<uint32_t>(elem.abs[i])) << i;
}

TEST_F(CudaOps, SumsAreExactEnoughAndRepeatable) {
  const int64_t n = 3000017;
  auto x = randn(static_cast<size_t>(n));
  Tensor gx = upload(x, {n}, DType::F32);
  const double s = gpu->sum_squares(gx), t = gpu->sum(gx);
  EXPECT_NEAR(s, cpu->sum_squares(host(x, {n})), 1e-9 * s);
  EXPECT_NEAR(t, cpu->sum(host(x, {n})), 1e-6 * std::sqrt(s));
  EXPECT_EQ(s, gpu->sum_squares(gx));
}

}  // namespace
}  // namespace soltrain::test
