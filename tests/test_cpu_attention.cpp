// The CPU attention op (the reference for the CUDA kernels): packed documents never attend across
// boundaries, and the backward agrees with central finite differences of the forward.
#include "kernels/ops.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

struct Problem {
  int64_t N, H, Hkv, hd;
  std::vector<int32_t> cu, pos;
  std::vector<float> q, k, v;
  SeqLayout seq() {
    int mx = 0;
    for (size_t i = 0; i + 1 < cu.size(); ++i) mx = std::max(mx, cu[i + 1] - cu[i]);
    return {Tensor{cu.data(), DType::I32, {int64_t(cu.size())}}, Tensor{pos.data(), DType::I32, {N}}, mx};
  }
  Tensor Q() { return {q.data(), DType::F32, {N, H, hd}}; }
  Tensor K() { return {k.data(), DType::F32, {N, Hkv, hd}}; }
  Tensor V() { return {v.data(), DType::F32, {N, Hkv, hd}}; }
};

Problem make(std::vector<int32_t> cu, int64_t H, int64_t Hkv, int64_t hd, std::mt19937& rng) {
  Problem p{cu.back(), H, Hkv, hd, cu, {}, {}, {}, {}};
  for (size_t d = 0; d + 1 < cu.size(); ++d)
    for (int32_t i = cu[d]; i < cu[d + 1]; ++i) p.pos.push_back(i - cu[d]);
  p.q = random_vec(size_t(p.N * H * hd), rng);
  p.k = random_vec(size_t(p.N * Hkv * hd), rng);
  p.v = random_vec(size_t(p.N * Hkv * hd), rng);
  return p;
}

std::vector<float> forward(Ops& ops, Problem& p, std::vector<float>* lse = nullptr) {
  std::vector<float> out(size_t(p.N * p.H * p.hd)), l(size_t(p.H * p.N));
  ops.attention_forward(Tensor{out.data(), DType::F32, {p.N, p.H, p.hd}}, Tensor{l.data(), DType::F32, {p.H, p.N}},
                        p.Q(), p.K(), p.V(), p.seq(), 0.3f);
  if (lse) *lse = l;
  return out;
}

TEST(CpuAttention, PackedDocumentsEqualSeparateRuns) {
  SOLTRAIN_SEEDED_RNG(rng, 301u);
  auto ops = make_cpu_ops();
  Problem packed = make({0, 5, 14, 17}, 4, 2, 8, rng);
  const auto out = forward(*ops, packed);
  for (size_t d = 0; d + 1 < packed.cu.size(); ++d) {
    const int32_t b = packed.cu[d], e = packed.cu[d + 1], n = e - b;
    Problem one{n, 4, 2, 8, {0, n}, {}, {}, {}, {}};
    for (int i = 0; i < n; ++i) one.pos.push_back(i);
    one.q.assign(packed.q.begin() + b * 32, packed.q.begin() + e * 32);
    one.k.assign(packed.k.begin() + b * 16, packed.k.begin() + e * 16);
    one.v.assign(packed.v.begin() + b * 16, packed.v.begin() + e * 16);
    const auto sep = forward(*ops, one);
    EXPECT_LE(rel_err(out.data() + b * 32, sep.data(), sep.size()), 1e-7) << "document " << d;
  }
}

TEST(CpuAttention, BackwardMatchesFiniteDifferences) {
  SOLTRAIN_SEEDED_RNG(rng, 302u);
  auto ops = make_cpu_ops();
  Problem p = make({0, 4, 11}, 4, 2, 6, rng);                // GQA 4:2, two documents
  const auto R = random_vec(size_t(p.N * p.H * p.hd), rng);  // loss = Σ out ⊙ R
  auto loss = [&]() {
    const auto o = forward(*ops, p);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += double(o[i]) * R[i];
    return s;
  };
  std::vector<float> lse;
  auto out = forward(*ops, p, &lse);
  std::vector<float> dq(p.q.size()), dk(p.k.size()), dv(p.v.size());
  ops->attention_backward(
      Tensor{dq.data(), DType::F32, {p.N, p.H, p.hd}}, Tensor{dk.data(), DType::F32, {p.N, p.Hkv, p.hd}},
      Tensor{dv.data(), DType::F32, {p.N, p.Hkv, p.hd}},
      Tensor{const_cast<float*>(R.data()), DType::F32, {p.N, p.H, p.hd}}, p.Q(), p.K(), p.V(),
      Tensor{out.data(), DType::F32, {p.N, p.H, p.hd}}, Tensor{lse.data(), DType::F32, {p.H, p.N}}, p.seq(), 0.3f);
  for (auto [x, g, name] : {std::tuple{&p.q, &dq, "dq"}, {&p.k, &dk, "dk"}, {&p.v, &dv, "dv"}}) {
    std::vector<float> fd(x->size());
    for (size_t i = 0; i < x->size(); ++i) {
      const float keep = (*x)[i], h = 1e-2f;
      (*x)[i] = keep + h;
      const double up = loss();
      (*x)[i] = keep - h;
      const double down = loss();
      (*x)[i] = keep;
      fd[i] = float((up - down) / (2 * h));
    }
    EXPECT_LE(rel_err(g->data(), fd.data(), fd.size()), 2e-3) << name;
  }
}

}  // namespace
}  // namespace soltrain::test
