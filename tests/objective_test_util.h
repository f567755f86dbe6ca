// Test objectives shared by the CPU and CUDA tests of the model core's objective interface.
#pragma once
#include <vector>

#include "model/transformer.h"
#include "test_util.h"

namespace soltrain::test {

// loss = Σ_d c_d · m_d², m_d = mean NLL over document d's counted targets: a per-sequence, non-linear
// objective (as DPO is), so its token weights 2·c_d·m_d / n_d need forward's per-document sums first.
class SquaredDocumentMean final : public Objective {
 public:
  explicit SquaredDocumentMean(std::vector<float> coef) : coef_(std::move(coef)) {}
  bool weights_before_forward() const override { return false; }
  bool needs_document_sums() const override { return true; }
  void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) override {
    read(ops, out);
    std::vector<float> w(size_t(weight.numel()), 0.0f);
    for (size_t d = 0; d + 1 < cu_.size(); ++d)
      if (counted_[d] > 0)
        for (int32_t i = cu_[d]; i < cu_[d + 1]; ++i)
          w[size_t(i)] = float(2.0 * coef_[d] * (sums_[d] / counted_[d]) / counted_[d]);
    ops.copy(weight, Tensor{w.data(), DType::F32, weight.shape, Device::CPU});
  }
  void add_loss(Ops& ops, const ForwardOutputs& out) override {
    read(ops, out);
    loss = 0;
    for (size_t d = 0; d + 1 < cu_.size(); ++d)
      if (counted_[d] > 0) loss += coef_[d] * (sums_[d] / counted_[d]) * (sums_[d] / counted_[d]);
  }
  double loss = 0;
  std::vector<double> sums_;

 private:
  // Per-document sums from the device (a test may wait for it) and counted targets from the host batch.
  void read(Ops& ops, const ForwardOutputs& out) {
    std::vector<float> s(size_t(out.doc_nll.numel()));
    ops.copy(Tensor{s.data(), DType::F32, out.doc_nll.shape, Device::CPU}, out.doc_nll);
    sums_.assign(s.begin(), s.end());
    cu_ = out.host->cu_seqlens;
    counted_.assign(sums_.size(), 0);
    for (size_t d = 0; d + 1 < cu_.size(); ++d)
      for (int32_t i = cu_[d]; i < cu_[d + 1]; ++i) counted_[d] += out.host->targets[size_t(i)] != -100;
  }
  std::vector<float> coef_;
  std::vector<int32_t> cu_;
  std::vector<int64_t> counted_;
};

// SFT's weights asked for after forward (the LM head's chunks recomputed in backward) give bitwise the
// gradients of the fused path, where the head's backward runs inside forward.
class DeferredSft final : public Objective {
 public:
  explicit DeferredSft(Ops& ops) : sft(ops) {}
  bool weights_before_forward() const override { return false; }
  void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) override {
    sft.token_weights(ops, out, weight);
  }
  void add_loss(Ops& ops, const ForwardOutputs& out) override { sft.add_loss(ops, out); }
  SftObjective sft;
};

inline std::vector<float> all_grads(Ops& ops, const Transformer& m) {
  const Tensor g = m.params().all_grads();
  std::vector<float> out(size_t(g.numel()));
  ops.copy(Tensor{out.data(), DType::F32, g.shape, Device::CPU}, g);
  return out;
}

}  // namespace soltrain::test
