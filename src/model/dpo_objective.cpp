#include "model/dpo_objective.h"

#include <cstring>

#include "core/error.h"

namespace soltrain {

PreferenceLoss parse_preference_loss(const std::string& s, const std::string& where) {
  if (s == "sigmoid") return PreferenceLoss::Sigmoid;
  if (s == "ipo") return PreferenceLoss::Ipo;
  if (s == "hinge") return PreferenceLoss::Hinge;
  if (s == "simpo") return PreferenceLoss::Simpo;
  if (s == "orpo") return PreferenceLoss::Orpo;
  if (s == "kto") return PreferenceLoss::Kto;
  user_error(where, ": loss_type '", s, "' is not one of sigmoid, ipo, hinge, simpo, orpo, kto");
}

const char* preference_loss_name(PreferenceLoss l) {
  switch (l) {
    case PreferenceLoss::Sigmoid: return "sigmoid";
    case PreferenceLoss::Ipo: return "ipo";
    case PreferenceLoss::Hinge: return "hinge";
    case PreferenceLoss::Simpo: return "simpo";
    case PreferenceLoss::Orpo: return "orpo";
    case PreferenceLoss::Kto: return "kto";
  }
  return "?";
}

std::vector<int32_t> document_offsets(const HostBatch& b) {
  std::vector<int32_t> cu = b.cu_seqlens;
  if (cu.empty())
    for (int r = 0; r <= b.rows; ++r) cu.push_back(r * b.seq_len);
  return cu;
}

namespace {
std::vector<int32_t> counted_per_segment(const HostBatch& b, const std::vector<int32_t>& cu) {
  std::vector<int32_t> n(cu.size() - 1, 0);
  for (size_t d = 0; d + 1 < cu.size(); ++d)
    for (int32_t i = cu[d]; i < cu[d + 1]; ++i) n[d] += b.targets[size_t(i)] != -100;
  return n;
}
}  // namespace

std::vector<int32_t> counted_per_document(const HostBatch& b) {
  return counted_per_segment(b, document_offsets(b));
}

void StagedUpload::operator()(Ops& ops, Tensor dst, const void* src) {
  SOLTRAIN_CHECK(dst.bytes() <= bytes_, "staged upload of ", dst.bytes(), " bytes into a ", bytes_, "-byte slot");
  const int s = next_;
  next_ ^= 1;
  ops.host_wait(marks_[s]);
  char* slot = static_cast<char*>(buf_.data()) + size_t(s) * bytes_;
  std::memcpy(slot, src, dst.bytes());
  ops.upload_async(dst, Tensor{slot, dst.dtype, dst.shape, Device::CPU});
  marks_[s] = ops.mark();
}

DpoObjective::DpoObjective(Ops& ops, DpoConfig cfg, int64_t max_tokens)
    : ops_(ops),
      cfg_(cfg),
      max_docs_(max_tokens),
      // a pair takes two documents: at most max_tokens / 2 pairs; every segment holds a token
      pairs_(ops.alloc(size_t(max_tokens / 2 + 1) * kPairFields * sizeof(int32_t))),
      ref_(ops.alloc(size_t(max_tokens) * sizeof(float))),
      doc_weight_(ops.alloc(size_t(max_tokens) * sizeof(float))),
      stats_(ops.alloc(kPreferenceStats * sizeof(double))),
      upload_pairs_(ops, size_t(max_tokens / 2 + 1) * kPairFields * sizeof(int32_t)),
      upload_ref_(ops, size_t(max_tokens) * sizeof(float)),
      upload_segments_(ops, size_t(max_tokens + 1) * sizeof(int32_t)) {
  if (cfg.loss == PreferenceLoss::Orpo) {  // ORPO's own segment sums
    segments_ = ops.alloc(size_t(max_tokens + 1) * sizeof(int32_t));
    segment_nll_ = ops.alloc(size_t(max_tokens) * sizeof(float));
  }
  // SimPO and ORPO read no reference: its sums stay defined (0) for the whole run
  if (reference_free(cfg.loss)) ops.fill(Tensor{ref_.data(), DType::F32, {max_tokens}, ref_.device()}, 0.0f);
  if (!(cfg.beta > 0)) user_error("beta must be > 0 (got ", cfg.beta, ")");
  if (!(cfg.label_smoothing >= 0 && cfg.label_smoothing < 0.5f))
    user_error("label_smoothing must be in [0, 0.5) (got ", cfg.label_smoothing, ")");
  if (!(cfg.nll_alpha >= 0))
    user_error("the NLL term's weight (rpo_alpha, cpo_alpha) must be >= 0 (got ", cfg.nll_alpha, ")");
}

void DpoObjective::begin_update(int64_t pairs, int64_t chosen_tokens) {
  update_pairs_ = pairs;
  update_chosen_tokens_ = chosen_tokens;
  first_ = true;
}

void DpoObjective::set_reference(Ops& ops, const Tensor& ref_doc_nll) {
  SOLTRAIN_CHECK(ref_doc_nll.numel() <= max_docs_, "reference sums for more documents than planned");
  ops.copy(Tensor{ref_.data(), DType::F32, {ref_doc_nll.numel()}, ref_.device()}, ref_doc_nll);
}

void DpoObjective::set_reference(Ops& ops, const HostBatch& b) {
  const size_t docs = b.cu_seqlens.empty() ? size_t(b.rows) : b.cu_seqlens.size() - 1;
  SOLTRAIN_CHECK(b.ref_nll.size() == b.pairs.size() && int64_t(docs) <= max_docs_,
                 "a preference batch without reference sums for its pairs");
  host_ref_.assign(docs, 0.0f);
  for (size_t i = 0; i < b.pairs.size(); ++i) host_ref_[size_t(b.pairs[i])] = b.ref_nll[i];
  upload_ref_(ops, Tensor{ref_.data(), DType::F32, {int64_t(docs)}, ref_.device()}, host_ref_.data());
}

void DpoObjective::add_loss(Ops& ops, const ForwardOutputs& out) {
  const HostBatch& b = *out.host;
  SOLTRAIN_CHECK(b.pairs.size() % 2 == 0, "a preference batch's pairs list has an odd length");
  const size_t P = b.pairs.size() / 2;
  SOLTRAIN_CHECK((cfg_.loss == PreferenceLoss::Kto) == (b.desirable.size() == P && P > 0) || P == 0,
                 "a KTO batch needs a label per example, a paired one none");
  std::vector<int32_t> cu = document_offsets(b);
  const int64_t documents = int64_t(cu.size()) - 1;
  SOLTRAIN_CHECK(documents <= max_docs_, "more documents than planned");
  // Segment of each document's answer (and of ORPO's chosen prompts): the documents themselves, unless ORPO
  // cuts a chosen document after its prompt's targets.
  std::vector<int32_t> answer(static_cast<size_t>(documents)), prompt(static_cast<size_t>(documents), -1);
  Tensor nll = out.doc_nll;
  cu_ = out.seq.cu_seqlens;
  if (cfg_.loss == PreferenceLoss::Orpo) {
    SOLTRAIN_CHECK(b.prompt_targets.empty() || b.prompt_targets.size() == P, "prompt targets do not match the pairs");
    std::vector<int32_t> cut(size_t(documents), 0);
    for (size_t i = 0; i < b.prompt_targets.size(); ++i) {
      const int32_t c = b.pairs[2 * i];
      SOLTRAIN_CHECK(c >= 0 && c < documents && b.prompt_targets[i] >= 0 &&
                         b.prompt_targets[i] < cu[size_t(c) + 1] - cu[size_t(c)],
                     "a chosen prompt outside its document");
      cut[size_t(c)] = b.prompt_targets[i];
    }
    host_segments_.assign(1, 0);
    for (int64_t d = 0; d < documents; ++d) {
      if (cut[size_t(d)] > 0) {
        prompt[size_t(d)] = int32_t(host_segments_.size() - 1);
        host_segments_.push_back(cu[size_t(d)] + cut[size_t(d)]);
      }
      answer[size_t(d)] = int32_t(host_segments_.size() - 1);
      host_segments_.push_back(cu[size_t(d) + 1]);
    }
    cu = host_segments_;
    docs_ = int64_t(cu.size()) - 1;
    SOLTRAIN_CHECK(docs_ <= max_docs_, "more segments than planned");
    cu_ = Tensor{segments_.data(), DType::I32, {docs_ + 1}, segments_.device()};
    upload_segments_(ops, cu_, host_segments_.data());
    nll = Tensor{segment_nll_.data(), DType::F32, {docs_}, segment_nll_.device()};
    ops.segment_sum(nll, out.token_nll, cu_);
  } else {
    for (int64_t d = 0; d < documents; ++d) answer[size_t(d)] = int32_t(d);
    docs_ = documents;
    SOLTRAIN_CHECK(out.doc_nll.numel() == docs_, "document sums do not match the batch");
  }
  const std::vector<int32_t> counted = counted_per_segment(b, cu);
  host_pairs_.resize(kPairFields * P);
  for (size_t i = 0; i < P; ++i) {
    const int32_t c = b.pairs[2 * i], r = b.pairs[2 * i + 1];
    SOLTRAIN_CHECK(c >= 0 && c < documents && r >= 0 && r < documents, "a pair names a document outside the batch");
    int32_t* f = &host_pairs_[kPairFields * i];
    f[0] = answer[size_t(c)];
    f[1] = answer[size_t(r)];
    f[2] = counted[size_t(f[0])];
    f[3] = counted[size_t(f[1])];
    f[4] = prompt[size_t(c)];
    f[5] = i < b.desirable.size() ? b.desirable[i] : 0;
  }
  const Tensor pairs{pairs_.data(), DType::I32, {int64_t(P), kPairFields}, pairs_.device()};
  if (P > 0) upload_pairs_(ops, pairs, host_pairs_.data());
  const Tensor ref{ref_.data(), DType::F32, {docs_}, ref_.device()};
  PreferenceParams p;
  p.loss = cfg_.loss;
  p.beta = cfg_.beta;
  p.label_smoothing = cfg_.label_smoothing;
  p.nll_alpha = cfg_.nll_alpha;
  p.simpo_gamma = cfg_.simpo_gamma;
  p.desirable_weight = cfg_.desirable_weight;
  p.undesirable_weight = cfg_.undesirable_weight;
  p.kto_kl = cfg_.kto_kl;
  p.pair_scale = update_pairs_ > 0 ? 1.0f / float(update_pairs_) : 0.0f;
  p.nll_scale = update_chosen_tokens_ > 0 ? 1.0f / float(update_chosen_tokens_) : 0.0f;
  ops.preference_loss(Tensor{doc_weight_.data(), DType::F32, {docs_}, doc_weight_.device()},
                      Tensor{stats_.data(), DType::F64, {kPreferenceStats}, stats_.device()}, nll, ref, pairs, p,
                      !first_);
  first_ = false;
}

void DpoObjective::token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) {
  // add_loss (in forward) has left d loss / d Σ NLL per document (segment); every token of it shares it
  // (tokens that are not targets get no gradient whatever their weight).
  SOLTRAIN_CHECK(cu_.numel() == docs_ + 1 && out.targets.numel() == weight.numel(),
                 "token_weights before this micro-batch's forward");
  ops.fill(weight, 0.0f);
  ops.segment_broadcast(weight, Tensor{doc_weight_.data(), DType::F32, {docs_}, doc_weight_.device()}, cu_);
}

DpoMetrics DpoObjective::read(Ops& ops) const {
  DpoMetrics m;
  if (first_) return m;
  std::array<double, kPreferenceStats> s{};
  ops.copy(Tensor{s.data(), DType::F64, {kPreferenceStats}, Device::CPU},
           Tensor{stats_.data(), DType::F64, {kPreferenceStats}, stats_.device()});
  m.pairs = int64_t(s[kPrefPairs]);
  if (m.pairs == 0) return m;
  const double n = s[kPrefPairs];
  // The loss as trained: Σℓ over the update's pairs (its divisor) plus the rpo term over its chosen tokens.
  m.loss =
      (update_pairs_ > 0 ? s[kPrefLoss] / double(update_pairs_) : 0.0) +
      (update_chosen_tokens_ > 0 ? double(cfg_.nll_alpha) * s[kPrefChosenNll] / double(update_chosen_tokens_) : 0.0);
  m.nll = update_chosen_tokens_ > 0 ? s[kPrefChosenNll] / double(update_chosen_tokens_) : 0.0;
  if (cfg_.loss == PreferenceLoss::Kto) {  // each kind's mean over its own examples, as TRL's KTO logs them
    const double good = s[kPrefDesirable], bad = n - good;
    m.reward_chosen = good > 0 ? s[kPrefRewardChosen] / good : 0.0;
    m.logp_chosen = good > 0 ? s[kPrefLogpChosen] / good : 0.0;
    m.reward_rejected = bad > 0 ? s[kPrefRewardRejected] / bad : 0.0;
    m.logp_rejected = bad > 0 ? s[kPrefLogpRejected] / bad : 0.0;
    m.margin = good > 0 && bad > 0 ? m.reward_chosen - m.reward_rejected : 0.0;
    m.kl = s[kPrefKlCalls] > 0 ? s[kPrefKl] / s[kPrefKlCalls] : 0.0;
    return m;
  }
  m.reward_chosen = s[kPrefRewardChosen] / n;
  m.reward_rejected = s[kPrefRewardRejected] / n;
  m.accuracy = s[kPrefAccuracy] / n;
  m.margin = m.reward_chosen - m.reward_rejected;
  m.logp_chosen = s[kPrefLogpChosen] / n;
  m.logp_rejected = s[kPrefLogpRejected] / n;
  return m;
}

namespace {
// Forward's Σ NLL per document, copied to the host.
class HostDocumentSums final : public Objective {
 public:
  bool weights_before_forward() const override { return false; }
  bool needs_document_sums() const override { return true; }
  void token_weights(Ops&, const ForwardOutputs&, Tensor) override {}
  void add_loss(Ops& ops, const ForwardOutputs& out) override {
    sums.resize(size_t(out.doc_nll.numel()));
    ops.copy(Tensor{sums.data(), DType::F32, out.doc_nll.shape, Device::CPU}, out.doc_nll);
  }
  std::vector<float> sums;
};
}  // namespace

std::vector<float> reference_nll(Transformer& model, const HostBatch& batch) {
  HostDocumentSums s;
  model.forward(batch, &s, false);
  std::vector<float> out;
  out.reserve(batch.pairs.size());
  for (int32_t d : batch.pairs) out.push_back(s.sums.at(size_t(d)));
  return out;
}

void dpo_micro_batch(Transformer& model, DpoObjective& dpo, const HostBatch& batch, bool backward) {
  if (reference_free(dpo.config().loss)) {
    // no reference pass
  } else if (model.lora() && batch.ref_nll.empty()) {
    ReferenceSums ref(dpo);
    model.enable_adapters(false);
    model.forward(batch, &ref, false);
    model.enable_adapters(true);
  } else {
    dpo.set_reference(model.ops(), batch);
  }
  model.forward(batch, &dpo, backward);
  if (backward) model.backward(dpo);
}

}  // namespace soltrain
