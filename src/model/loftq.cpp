#include "model/loftq.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/format.h"
#include "kernels/cpu/quantize.h"
#include "model/lora.h"

// LAPACK's divide-and-conquer SVD, as torch.linalg.svd calls it on the CPU (OpenBLAS carries LAPACK).
extern "C" void sgesdd_(const char* jobz, const int* m, const int* n, float* a, const int* lda, float* s, float* u,
                        const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork, int* iwork,
                        int* info);

namespace soltrain {

namespace {

// The rank-r factors of `res` [out, in] (row-major): B [out, r] = U·sqrt(S), A [r, in] = sqrt(S)·Vᵀ.
void low_rank(std::vector<float> res, int64_t out, int64_t in, int rank, std::vector<float>& a, std::vector<float>& b) {
  // Row-major res is column-major resᵀ [in, out]: its SVD U'·S·V'ᵀ gives res = V'·S·U'ᵀ, so res's left vectors are
  // the rows of V'ᵀ and its right vectors the columns of U'.
  const int m = int(in), n = int(out), k = int(std::min(in, out));
  std::vector<float> s(static_cast<size_t>(k)), u(size_t(m) * size_t(k)), vt(size_t(k) * size_t(n));
  std::vector<int> iwork(size_t(8) * size_t(k));
  int lwork = -1, info = 0;
  float query = 0;
  sgesdd_("S", &m, &n, res.data(), &m, s.data(), u.data(), &m, vt.data(), &k, &query, &lwork, iwork.data(), &info);
  lwork = int(query);
  std::vector<float> work(size_t(std::max(lwork, 1)));
  sgesdd_("S", &m, &n, res.data(), &m, s.data(), u.data(), &m, vt.data(), &k, work.data(), &lwork, iwork.data(), &info);
  if (info != 0)
    user_error("LoftQ: the SVD of a ", out, " x ", in, " residual did not converge (LAPACK info ", info, ")");
  const int r = std::min(rank, k);
  a.assign(size_t(rank) * size_t(in), 0.0f);
  b.assign(size_t(out) * size_t(rank), 0.0f);
  for (int j = 0; j < r; ++j) {
    const float root = std::sqrt(s[size_t(j)]);
    for (int64_t i = 0; i < out; ++i)
      b[size_t(i) * size_t(rank) + size_t(j)] = vt[size_t(j) + size_t(i) * size_t(k)] * root;
    for (int64_t c = 0; c < in; ++c)
      a[size_t(j) * size_t(in) + size_t(c)] = root * u[size_t(c) + size_t(j) * size_t(m)];
  }
}

}  // namespace

LoftqWeights loftq_decompose(const std::vector<float>& w, int64_t out, int64_t in, int rank, int iterations) {
  LoftqWeights r;
  r.q.resize(w.size());
  std::vector<float> res = w;
  for (int it = 0; it < iterations; ++it) {
    nf4_round_trip(res.data(), int64_t(res.size()), r.q.data());
    for (size_t i = 0; i < w.size(); ++i) res[i] = w[i] - r.q[i];
    low_rank(res, out, in, rank, r.a, r.b);
    if (it + 1 == iterations) break;
    // the next round quantises what the adapter leaves: W - B·A
    for (int64_t i = 0; i < out; ++i)
      for (int64_t c = 0; c < in; ++c) {
        float dot = 0;
        for (int j = 0; j < rank; ++j) dot += r.b[size_t(i * rank + j)] * r.a[size_t(j * in + c)];
        res[size_t(i * in + c)] = w[size_t(i * in + c)] - dot;
      }
  }
  return r;
}

void loftq_initialise(Transformer& model, int iterations) {
  SOLTRAIN_CHECK(model.lora().has_value(), "LoftQ without LoRA");
  const LoraConfig& lora = *model.lora();
  ParameterStore& ps = model.params();
  for (int l = 0; l < model.config().num_layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      const auto target = LoraTarget(t);
      if (!lora.targets(target)) continue;
      Parameter* base = ps.find(lora_module_path(l, target) + ".weight");
      Parameter* a = ps.find(lora_a_name(l, target));
      Parameter* b = ps.find(lora_b_name(l, target));
      if (!base || !a || !b) continue;  // (a layer without this projection: an MoE layer's experts)
      if (base->format != WeightFormat::Dense)
        user_error("LoftQ quantises a full-precision base itself: use adapter: lora, not a quantised base (",
                   base->name, " is held ", weight_format_name(base->format), ")");
      const int64_t out = base->shape[0], in = base->shape[1];
      std::vector<float> w(size_t(out * in));
      ps.download(model.ops(), *base, w.data());
      const LoftqWeights d = loftq_decompose(w, out, in, lora.r, iterations);
      ps.upload(model.ops(), *base, d.q.data());
      ps.upload(model.ops(), *a, d.a.data());
      ps.upload(model.ops(), *b, d.b.data());
    }
}

}  // namespace soltrain
