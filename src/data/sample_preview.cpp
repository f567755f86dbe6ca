#include "data/sample_preview.h"

#include <algorithm>
#include <ostream>

#include "core/error.h"

namespace soltrain {

namespace {

// A token's text on one line: control characters escaped (a newline token would break the document's line).
std::string visible(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch == '\n')
      out += "\\n";
    else if (ch == '\t')
      out += "\\t";
    else if (ch == '\r')
      out += "\\r";
    else if (ch < 0x20 || ch == 0x7f)
      out += cat("\\x", "0123456789abcdef"[ch >> 4], "0123456789abcdef"[ch & 15]);
    else
      out += char(ch);
  }
  return out;
}

}  // namespace

void print_sample_preview(const ShardSet& docs, const Tokenizer& tok, const PreviewOptions& o, std::ostream& out) {
  const int64_t shown = std::min<int64_t>(o.count * (o.pairs ? 2 : 1), docs.documents());
  for (int64_t d = 0; d < shown; ++d) {
    const int64_t begin = docs.doc_offsets[size_t(d)], end = docs.doc_offsets[size_t(d) + 1];
    int64_t trained = 0;
    for (int64_t i = begin; i < end; ++i) trained += docs.mask[size_t(i)] != 0;
    const std::string what = o.pairs ? cat("pair ", d / 2, d % 2 == 0 ? " chosen" : " rejected") : cat("document ", d);
    out << "--- " << what << ": " << end - begin << " tokens, " << trained << " trained\n";
    for (int64_t i = begin; i < end; ++i) {
      const int32_t id = docs.tokens[size_t(i)];
      const bool on = docs.mask[size_t(i)] != 0;
      const std::string text = visible(tok.decode(std::span<const int32_t>(&id, 1)));
      if (o.colour) out << (on ? "\x1b[32m" : "\x1b[31m");
      out << text;
      if (!o.text_only) out << "(" << (on ? id : -100) << ", " << id << ")";
      if (o.colour) out << "\x1b[0m";
      if (!o.text_only && i + 1 < end) out << " ";
    }
    out << "\n";
  }
}

}  // namespace soltrain
