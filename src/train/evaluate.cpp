#include "train/evaluate.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace soltrain {

EvalResult evaluate(Transformer& model, const ShardSet& docs, int rows, int seq_len) {
  double loss_sum = 0;
  int64_t counted = 0, correct = 0;
  // A token classifier's few logits per token come back to the host for its accuracy.
  const int64_t labels = model.config().token_classifier ? model.config().num_labels : 0;
  std::vector<float> logits(size_t(labels > 0 ? int64_t(rows) * seq_len * labels : 0));
  const int64_t n = docs.documents();
  for (int64_t d0 = 0; d0 < n; d0 += rows) {
    HostBatch b;
    b.rows = rows;
    b.seq_len = seq_len;
    const size_t total = size_t(rows) * size_t(seq_len);
    b.input_ids.assign(total, 0);
    b.targets.assign(total, -100);
    b.positions.assign(total, 0);
    b.cu_seqlens = {0};
    for (int r = 0; r < rows; ++r) {
      const size_t row = size_t(r) * size_t(seq_len);
      int len = 0;
      if (d0 + r < n) {
        const int64_t begin = docs.doc_offsets[size_t(d0 + r)], end = docs.doc_offsets[size_t(d0 + r) + 1];
        len = int(std::min<int64_t>(end - begin, seq_len));
        for (int k = 0; k < len; ++k) {
          b.input_ids[row + size_t(k)] = docs.tokens[size_t(begin + k)];
          b.positions[row + size_t(k)] = k;
          b.targets[row + size_t(k)] = target_of(docs, begin, k, len);
        }
        if (len > 0) b.cu_seqlens.push_back(int32_t(row) + len);
      }
      if (len < seq_len) {
        for (int k = len; k < seq_len; ++k) b.positions[row + size_t(k)] = k - len;
        b.cu_seqlens.push_back(int32_t(row) + seq_len);
      }
    }
    const int64_t n = b.counted();
    if (n == 0) continue;
    model.forward(b, nullptr, /*backward_follows=*/false, labels > 0 ? logits.data() : nullptr);
    loss_sum += model.ops().sum(model.outputs().token_nll);  // a sync per batch: evaluation only
    counted += n;
    for (size_t t = 0; labels > 0 && t < b.targets.size(); ++t) {
      if (b.targets[t] == -100) continue;
      const float* row = logits.data() + t * size_t(labels);
      correct += std::max_element(row, row + labels) - row == b.targets[t];
    }
  }
  EvalResult r{counted ? loss_sum / double(counted) : std::numeric_limits<double>::quiet_NaN(), counted, {}};
  if (labels > 0 && counted > 0) r.accuracy = double(correct) / double(counted);
  return r;
}

}  // namespace soltrain
