// A readable view of tokenized training documents, as Axolotl's `preprocess --debug` prints them: every token
// as text(label, id), the label -100 where the token is not trained on; in a terminal trained tokens green and
// the others red (Axolotl's colours), plain text when piped.
#pragma once
#include <cstdint>
#include <iosfwd>

#include "data/shards.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

struct PreviewOptions {
  int64_t count = 5;       // documents shown (Axolotl's debug_num_examples)
  bool colour = false;     // ANSI colours (a terminal)
  bool text_only = false;  // Axolotl's debug_text_only: the coloured text without (label, id)
  bool pairs = false;      // preference shards: documents 2i, 2i+1 are pair i's chosen and rejected answers
};

void print_sample_preview(const ShardSet& docs, const Tokenizer& tok, const PreviewOptions& o, std::ostream& out);

}  // namespace soltrain
