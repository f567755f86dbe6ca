// The Mixture-of-Experts ops on CUDA against their CPU twins (kernels/cpu/moe.cpp) on fresh random inputs:
// routing, the permutation (exact), gathers and combines, the experts' grouped GEMMs at the shapes the model
// and its LoRA factors give them (experts with no rows, partial tiles, rank-wide outputs), the router's
// backward, the shared expert's gate and the load-balancing loss. Outputs start as NaN.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"

namespace soltrain::test {
namespace {

using CudaMoe = CudaTest;

std::vector<int32_t> download_i32(Ops& gpu, const Tensor& t) {
  std::vector<int32_t> h(static_cast<size_t>(t.numel()));
  gpu.copy(Tensor{h.data(), DType::I32, t.shape}, t);
  return h;
}

// Routing and permutation: the GPU's choices, weights and probabilities against the CPU's on the same bf16
// logits, then the permutation of those choices exactly (a stable counting sort has one answer).
TEST_F(CudaMoe, RouteAndPermuteMatchTheCpu) {
  for (auto [N, E, k, norm] : {std::tuple{300, 64, 6, true},
                               {1000, 128, 8, false},
                               {37, 60, 4, true},
                               {2048, 256, 8, true},
                               {5, 8, 2, false}}) {
    auto logits = randn(static_cast<size_t>(N * E), 2.0f);
    auto sum0 = randn(static_cast<size_t>(E));
    Tensor probs = poisoned({N, E}, DType::F32),
           expert = upload_i32(std::vector<int32_t>(static_cast<size_t>(N * k), -7));
    expert.shape = {N, k};
    Tensor weight = poisoned({N, k}, DType::F32), prob_sum = upload(sum0, {E}, DType::F32);
    gpu->moe_route(probs, expert, weight, prob_sum, upload(logits, {N, E}), norm);
    std::vector<float> p(static_cast<size_t>(N * E)), w(static_cast<size_t>(N * k)), s = sum0;
    std::vector<int32_t> ex(static_cast<size_t>(N * k));
    Tensor cex{ex.data(), DType::I32, {N, k}};
    cpu->moe_route(host(p, {N, E}), cex, host(w, {N, k}), host(s, {E}), host(logits, {N, E}), norm);
    EXPECT_LE(rel(download(probs), p), 1e-6) << N << " tokens, " << E << " experts";
    EXPECT_EQ(download_i32(*gpu, expert), ex);
    EXPECT_LE(rel(download(weight), w), 1e-6);
    EXPECT_LE(rel(download(prob_sum), s), 1e-6);

    const int64_t M = N * k;
    auto counts0 = randn(static_cast<size_t>(E));
    Tensor rows = poisoned({M}, DType::F32), slot = poisoned({M}, DType::F32), offsets = poisoned({E + 1}, DType::F32);
    rows.dtype = slot.dtype = offsets.dtype = DType::I32;  // (NaN's bits: never a valid index)
    Tensor counts = upload(counts0, {E}, DType::F32);
    gpu->moe_permute(rows, slot, offsets, counts, expert);
    std::vector<int32_t> crows(static_cast<size_t>(M)), cslot(static_cast<size_t>(M)), coff(static_cast<size_t>(E + 1));
    std::vector<float> ccounts = counts0;
    cpu->moe_permute(host_i32(crows), host_i32(cslot), host_i32(coff), host(ccounts, {E}), cex);
    EXPECT_EQ(download_i32(*gpu, rows), crows);
    EXPECT_EQ(download_i32(*gpu, slot), cslot);
    EXPECT_EQ(download_i32(*gpu, offsets), coff);
    EXPECT_EQ(download(counts), ccounts);
  }
}

// A routing with skew and experts that get nothing: pair i's expert, as moe_route would give (distinct per token).
std::vector<int32_t> skewed_choices(std::mt19937& rng, int64_t N, int64_t E, int64_t k) {
  std::vector<int32_t> ex(static_cast<size_t>(N * k)), order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(order.begin(), order.end(), 0);
    for (int64_t j = 0; j < k; ++j) {  // lower experts likelier; the top quarter never chosen
      const int64_t pool = std::max<int64_t>(k, (E * 3) / 4) - j;
      const int64_t pick = int64_t(std::min<double>(double(pool - 1), std::pow(double(rng() % 1000) / 1000, 2) * pool));
      ex[static_cast<size_t>(n * k + j)] = order[static_cast<size_t>(j + pick)];
      std::swap(order[static_cast<size_t>(j)], order[static_cast<size_t>(j + pick)]);
    }
  }
  return ex;
}

// The experts' row offsets [E + 1] of such a routing, permuted on the CPU.
std::vector<int32_t> skewed_offsets(Ops& cpu, std::mt19937& rng, int64_t N, int64_t E, int64_t k) {
  const int64_t M = N * k;
  std::vector<int32_t> ex = skewed_choices(rng, N, E, k), rows(static_cast<size_t>(M)), slot(static_cast<size_t>(M)),
                       off(static_cast<size_t>(E + 1));
  std::vector<float> counts(static_cast<size_t>(E));
  auto i32 = [](std::vector<int32_t>& v) { return Tensor{v.data(), DType::I32, {int64_t(v.size())}}; };
  cpu.moe_permute(i32(rows), i32(slot), i32(off), Tensor{counts.data(), DType::F32, {E}},
                  Tensor{ex.data(), DType::I32, {N, k}});
  return off;
}

TEST_F(CudaMoe, GatherCombineAndTheirBackwardsMatchTheCpu) {
  for (auto [N, E, k, D] : {std::tuple{300, 16, 4, 64}, {77, 8, 2, 2048}, {1, 4, 4, 8}}) {
    const int64_t M = N * k;
    std::vector<int32_t> ex = skewed_choices(rng, N, E, k), rows(static_cast<size_t>(M)), slot(static_cast<size_t>(M)),
                         off(static_cast<size_t>(E + 1));
    std::vector<float> counts(static_cast<size_t>(E));
    cpu->moe_permute(host_i32(rows), host_i32(slot), host_i32(off), host(counts, {E}),
                     Tensor{ex.data(), DType::I32, {N, k}});
    const Tensor grows = upload_i32(rows), gslot = upload_i32(slot);
    auto x = randn(static_cast<size_t>(N * D)), y = randn(static_cast<size_t>(M * D)),
         dout = randn(static_cast<size_t>(N * D)), w = randn(static_cast<size_t>(M));
    auto acc0 = randn(static_cast<size_t>(N * D));
    // gather
    Tensor gxs = poisoned({M, D});
    gpu->gather_rows(gxs, upload(x, {N, D}), grows);
    std::vector<float> xs(static_cast<size_t>(M * D));
    cpu->gather_rows(host(xs, {M, D}), host(x, {N, D}), host_i32(rows));
    EXPECT_EQ(download(gxs), xs) << N << "x" << D;
    // combine and its backward
    Tensor gout = poisoned({N, D}), gy = upload(y, {M, D}), gw = upload(w, {N, k}, DType::F32);
    gpu->moe_combine(gout, gy, gslot, gw);
    std::vector<float> out(static_cast<size_t>(N * D));
    cpu->moe_combine(host(out, {N, D}), host(y, {M, D}), host_i32(slot), host(w, {N, k}));
    EXPECT_LE(rel(download(gout), out), 1e-2);
    Tensor gdy = poisoned({M, D}), gdw = poisoned({N, k}, DType::F32);
    gpu->moe_combine_backward(gdy, gdw, upload(dout, {N, D}), gy, gslot, gw);
    std::vector<float> dy(static_cast<size_t>(M * D)), dw(static_cast<size_t>(N * k));
    cpu->moe_combine_backward(host(dy, {M, D}), host(dw, {N, k}), host(dout, {N, D}), host(y, {M, D}), host_i32(slot),
                              host(w, {N, k}));
    EXPECT_LE(rel(download(gdy), dy), 1e-2);
    EXPECT_LE(rel(download(gdw), dw), 1e-5);
    // the gather's backward, written and added
    for (bool accumulate : {false, true}) {
      Tensor gdx = accumulate ? upload(acc0, {N, D}) : poisoned({N, D});
      gpu->moe_unpermute_sum(gdx, accumulate, gy, gslot);
      std::vector<float> dx = acc0;
      cpu->moe_unpermute_sum(host(dx, {N, D}), accumulate, host(y, {M, D}), host_i32(slot));
      EXPECT_LE(rel(download(gdx), dx), 1e-2) << (accumulate ? "+=" : "=");
    }
  }
}

// The grouped GEMMs at the model's shapes (gate/up: in D out F; down: in F out D) and the LoRA factors' (rank-wide
// outputs and inputs), with skewed routing (empty experts, partial tiles), alpha and accumulation: the mma.sync
// kernels (SOLTRAIN_GROUPED_GEMM=mma), the cp.async wgmma form (=wgmma) and the default: on Hopper the
// warp-specialised TMA one where the widths are multiples of 64 (partial 256-wide column tiles included). The mma
// pass also takes the LoRA factors' 64-wide dw tiles (SOLTRAIN_NARROW_DW=64), the others the default 128.
TEST_F(CudaMoe, GroupedGemmsMatchTheCpu) {
  for (const char* form : {"mma", "wgmma", ""})
    for (auto [N, E, k, in, out] : {std::tuple{300, 16, 4, 256, 96},
                                    {200, 8, 2, 96, 256},
                                    {512, 32, 8, 128, 32},
                                    {512, 32, 8, 32, 128},
                                    {150, 8, 3, 64, 16},
                                    {64, 4, 1, 16, 2048},
                                    {384, 128, 8, 2048, 768},
                                    {1000, 8, 2, 128, 384},
                                    {700, 16, 4, 192, 640}}) {
      SCOPED_TRACE(*form ? cat("SOLTRAIN_GROUPED_GEMM=", form) : "default kernels (wgmma on sm_90)");
      if (*form)
        setenv("SOLTRAIN_GROUPED_GEMM", form, 1);
      else
        unsetenv("SOLTRAIN_GROUPED_GEMM");
      setenv("SOLTRAIN_NARROW_DW", std::string(form) == "mma" ? "64" : "128", 1);
      const int64_t M = N * k;
      std::vector<int32_t> off = skewed_offsets(*cpu, rng, N, E, k);
      ASSERT_EQ(off.back(), M);
      const Tensor goff = upload_i32(off);
      auto x = randn(static_cast<size_t>(M * in)), w = randn(static_cast<size_t>(E * out * in), 0.05f),
           dy = randn(static_cast<size_t>(M * out));
      auto y0 = randn(static_cast<size_t>(M * out)), dx0 = randn(static_cast<size_t>(M * in)),
           dw0 = randn(static_cast<size_t>(E * out * in));
      const float alpha = 0.75f;
      const Tensor gx = upload(x, {M, in}), gw = upload(w, {E, out, in}), gdy = upload(dy, {M, out});
      for (bool accumulate : {false, true}) {
        Tensor gy = accumulate ? upload(y0, {M, out}) : poisoned({M, out});
        gpu->grouped_linear_forward(gy, gx, gw, goff, alpha, accumulate);
        std::vector<float> y = y0;
        cpu->grouped_linear_forward(host(y, {M, out}), host(x, {M, in}), host(w, {E, out, in}), host_i32(off), alpha,
                                    accumulate);
        EXPECT_LE(rel(download(gy), y), 1e-2) << M << " rows, " << in << " -> " << out << (accumulate ? " +=" : "");

        Tensor gdx = accumulate ? upload(dx0, {M, in}) : poisoned({M, in}), gdw = upload(dw0, {E, out, in}, DType::F32);
        gpu->grouped_linear_backward(&gdx, accumulate, &gdw, gdy, gx, gw, goff, alpha);
        std::vector<float> dx = dx0, dw = dw0;
        Tensor cdx = host(dx, {M, in}), cdw = host(dw, {E, out, in});
        cpu->grouped_linear_backward(&cdx, accumulate, &cdw, host(dy, {M, out}), host(x, {M, in}),
                                     host(w, {E, out, in}), host_i32(off), alpha);
        EXPECT_LE(rel(download(gdx), dx), 1e-2);
        EXPECT_LE(rel(download(gdw), dw), 1e-5);  // fp32 accumulation into fp32
      }
    }
  unsetenv("SOLTRAIN_GROUPED_GEMM");
  unsetenv("SOLTRAIN_NARROW_DW");
}

// Sums of grouped products over their concatenated contraction (grouped_linear_sum: on sm_90 one TMA product,
// else term by term): a projection with its LoRA factor's term (forward: w [E, N, K], the factor's K = the rank,
// narrower than a 64-wide tile) and dx over three terms (gate's, up's and the adapter's: w [E, K, N], the next
// expert's rows past a term's K), = and +=, skewed routing; against the CPU's term-by-term composition.
TEST_F(CudaMoe, GroupedSumsMatchTheCpu) {
  using Orient = Ops::GroupedOrient;
  for (auto [N, E, k, width, ks] : {std::tuple{384, 128, 8, 768, std::vector<int64_t>{2048, 32}},
                                    {300, 16, 4, 256, std::vector<int64_t>{768, 16}},
                                    {200, 8, 2, 2048, std::vector<int64_t>{768, 768, 32}},
                                    {150, 8, 3, 384, std::vector<int64_t>{256, 256, 24}},
                                    {64, 4, 1, 128, std::vector<int64_t>{64}}})
    for (Orient orient : {Orient::Forward, Orient::Dx}) {
      SCOPED_TRACE(cat(orient == Orient::Forward ? "forward " : "dx ", N * k, " rows, out ", width, ", ", ks.size(),
                       " terms, first K ", ks[0]));
      const int64_t M = N * k;
      std::vector<int32_t> off = skewed_offsets(*cpu, rng, N, E, k);
      const Tensor goff = upload_i32(off);
      std::vector<std::vector<float>> as, ws;
      std::vector<Ops::GroupedTerm> gterms, cterms;
      for (int64_t K : ks) {
        as.push_back(randn(static_cast<size_t>(M * K)));
        ws.push_back(randn(static_cast<size_t>(E * width * K), 0.05f));
      }
      for (size_t i = 0; i < ks.size(); ++i) {
        const Shape wshape = orient == Orient::Forward ? Shape{E, width, ks[i]} : Shape{E, ks[i], width};
        gterms.push_back({upload(as[i], {M, ks[i]}), upload(ws[i], wshape)});
        cterms.push_back({host(as[i], {M, ks[i]}), host(ws[i], wshape)});
      }
      const auto y0 = randn(static_cast<size_t>(M * width));
      for (bool accumulate : {false, true}) {
        Tensor gy = accumulate ? upload(y0, {M, width}) : poisoned({M, width});
        gpu->grouped_linear_sum(gy, gterms, orient, goff, accumulate);
        std::vector<float> y = y0;
        cpu->grouped_linear_sum(host(y, {M, width}), cterms, orient, host_i32(off), accumulate);
        EXPECT_LE(rel(download(gy), y), 1e-2) << (accumulate ? "+=" : "=");
      }
    }
}

TEST_F(CudaMoe, RouterBackwardSharedGateAuxLossAndLoraLayoutMatchTheCpu) {
  for (auto [N, E, k] : {std::tuple{300, 64, 6}, {33, 128, 8}, {4, 8, 2}}) {
    auto logits = randn(static_cast<size_t>(N * E), 2.0f), dw = randn(static_cast<size_t>(N * k)),
         aux = randn(static_cast<size_t>(E), 0.1f);
    std::vector<float> p(static_cast<size_t>(N * E)), w(static_cast<size_t>(N * k)), s(static_cast<size_t>(E));
    std::vector<int32_t> ex(static_cast<size_t>(N * k));
    const Tensor cex{ex.data(), DType::I32, {N, k}};
    cpu->moe_route(host(p, {N, E}), cex, host(w, {N, k}), host(s, {E}), host(logits, {N, E}), true);
    const Tensor gex = [&] {
      Tensor t = upload_i32(ex);
      t.shape = {N, k};
      return t;
    }();
    for (bool norm : {true, false})
      for (bool with_aux : {true, false}) {
        Tensor gd = poisoned({N, E});
        const Tensor gaux = with_aux ? upload(aux, {E}, DType::F32) : Tensor{};
        gpu->moe_router_backward(gd, upload(dw, {N, k}, DType::F32), upload(p, {N, E}, DType::F32), gex,
                                 upload(w, {N, k}, DType::F32), norm, gaux);
        std::vector<float> d(static_cast<size_t>(N * E));
        std::vector<float> aux_c = aux;
        cpu->moe_router_backward(host(d, {N, E}), host(dw, {N, k}), host(p, {N, E}), cex, host(w, {N, k}), norm,
                                 with_aux ? host(aux_c, {E}) : Tensor{});
        EXPECT_LE(rel(download(gd), d), 1e-2) << N << "x" << E << (norm ? " norm" : "") << (with_aux ? " aux" : "");
      }
    // the load-balancing loss from the pass's statistics
    std::vector<float> counts(static_cast<size_t>(E));
    for (float& c : counts) c = float(rng() % 50);
    std::vector<double> loss0{0.25};
    Tensor gaux = poisoned({E}, DType::F32);
    Buffer lb = gpu->alloc(8);
    Tensor gloss{lb.data(), DType::F64, {1}, Device::CUDA};
    gpu->copy(gloss, Tensor{loss0.data(), DType::F64, {1}});
    gpu->moe_aux_loss(gaux, gloss, upload(counts, {E}, DType::F32), upload(s, {E}, DType::F32), 0.01f, 3.0 * N);
    std::vector<float> caux(static_cast<size_t>(E));
    std::vector<double> closs = loss0, gl(1);
    cpu->moe_aux_loss(host(caux, {E}), Tensor{closs.data(), DType::F64, {1}}, host(counts, {E}), host(s, {E}), 0.01f,
                      3.0 * N);
    gpu->copy(Tensor{gl.data(), DType::F64, {1}}, gloss);
    EXPECT_EQ(download(gaux), caux);
    EXPECT_NEAR(gl[0], closs[0], 1e-12 * std::abs(closs[0]));
  }
  // Qwen2-MoE's shared-expert gate, forward and backward
  for (auto [N, D] : {std::pair{100, 64}, {7, 2048}}) {
    auto x = randn(static_cast<size_t>(N * D)), g = randn(static_cast<size_t>(N), 2.0f),
         o0 = randn(static_cast<size_t>(N * D)), dout = randn(static_cast<size_t>(N * D));
    Tensor gout = upload(o0, {N, D}), gx = upload(x, {N, D}), gg = upload(g, {N, 1});
    gpu->sigmoid_gate_add(gout, gx, gg);
    std::vector<float> out = o0;
    cpu->sigmoid_gate_add(host(out, {N, D}), host(x, {N, D}), host(g, {N, 1}));
    EXPECT_LE(rel(download(gout), out), 1e-2) << N << "x" << D;
    Tensor gdx = poisoned({N, D}), gdg = poisoned({N, 1});
    gpu->sigmoid_gate_backward(gdx, gdg, upload(dout, {N, D}), gx, gg);
    std::vector<float> dx(static_cast<size_t>(N * D)), dg(static_cast<size_t>(N));
    cpu->sigmoid_gate_backward(host(dx, {N, D}), host(dg, {N, 1}), host(dout, {N, D}), host(x, {N, D}),
                               host(g, {N, 1}));
    EXPECT_LE(rel(download(gdx), dx), 1e-2);
    EXPECT_LE(rel(download(gdg), dg), 1e-2);
  }
}

}  // namespace
}  // namespace soltrain::test
