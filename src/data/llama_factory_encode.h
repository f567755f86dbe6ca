// LLaMA-Factory's rows as tokens (data/llama_factory.h renders them): each element tokenized alone, the pairs cut by
// infer_seqlen. What LLaMA-Factory trains is each response, with what its template puts after the content (Qwen's
// "<|im_end|>\n"): the same tokens and labels as its SupervisedDatasetProcessor, PairwiseDatasetProcessor and
// FeedbackDatasetProcessor make.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "data/llama_factory.h"
#include "data/sample_encoder.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

// The tokenizer's bos / eos ids: the markers' (eos after the template's replace_eos).
struct LfSpecialIds {
  std::optional<int32_t> bos, eos;
};
// SupervisedDatasetProcessor: the turns' (prompt, response) pairs, each cut by infer_seqlen to what remains of the
// cutoff; the responses trained (the prompts too with train_on_prompt). BadRecord when LLaMA-Factory drops it (a prompt
// of even length, not one response).
Document lf_supervised(Tokenizer& tok, const LfSpecialIds& e, const LfExample& x);
// PairwiseDatasetProcessor: prompt + chosen and prompt + rejected, the answers trained, cut together by infer_seqlen
// (the prompt against the longer answer). BadRecord when it is not a pair.
std::pair<Document, Document> lf_pairwise(Tokenizer& tok, const LfSpecialIds& e, const LfExample& x);
// FeedbackDatasetProcessor's example (KTO): prompt + the answer, the answer trained, cut by infer_seqlen; whether it is
// desirable is x.kto_tag. The uncut prompt and answer come with it: a KL document is example i's prompt and example
// i-1's answer cut together anew (lf_kl_document), as LLaMA-Factory makes them.
struct LfUnpaired {
  Document example;
  std::vector<int32_t> prompt, answer;
};
LfUnpaired lf_unpaired(Tokenizer& tok, const LfSpecialIds& e, const LfExample& x);
Document lf_kl_document(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer, int64_t cutoff_len);

}  // namespace soltrain
