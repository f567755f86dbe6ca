// Split, ByteLevel, Metaspace and Sequence pre-tokenizers, following HF tokenizers' semantics.
#include "tokenizer/pre_tokenizer.h"

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace soltrain {

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  user_error(where, ": split behavior '", s, "' is not supported");
}

// Splits every piece at the matches of `regex`, keeping the matched spans as `behavior` says
// (HF's NormalizedString::split). invert swaps which spans count as the delimiters.
void split_pieces(std::vector<Piece>& pieces, const Regex& regex, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (Piece& p : pieces) {
    // (begin, end, is_delimiter) covering the whole piece.
    struct Span {
      size_t b, e;
      bool delim;
    };
    std::vector<Span> spans;
    size_t prev = 0;
    for (auto [b, e] : regex.find_all(p.text)) {
      if (b > prev) spans.push_back({prev, b, invert});
      spans.push_back({b, e, !invert});
      prev = e;
    }
    if (prev < p.text.size()) spans.push_back({prev, p.text.size(), invert});

    std::vector<std::pair<size_t, size_t>> parts;
    switch (behavior) {
      case Behavior::Removed:
        for (const Span& s : spans)
          if (!s.delim) parts.emplace_back(s.b, s.e);
        break;
      case Behavior::Isolated:
        for (const Span& s : spans) parts.emplace_back(s.b, s.e);
        break;
      case Behavior::MergedWithPrevious: {
        bool prev_kept = false;  // a delimiter joins the part before it, if any
        for (const Span& s : spans) {
          if (s.delim && prev_kept)
            parts.back().second = s.e;
          else
            parts.emplace_back(s.b, s.e);
          prev_kept = !s.delim;
        }
        break;
      }
      case Behavior::MergedWithNext: {
        bool prev_delim = false;  // a delimiter starts the part after it
        for (const Span& s : spans) {
          if (prev_delim && !s.delim)
            parts.back().second = s.e;
          else
            parts.emplace_back(s.b, s.e);
          prev_delim = s.delim;
        }
        break;
      }
      case Behavior::Contiguous: {
        bool prev_delim = false;  // runs of adjacent delimiters become one part
        for (const Span& s : spans) {
          if (prev_delim && s.delim)
            parts.back().second = s.e;
          else
            parts.emplace_back(s.b, s.e);
          prev_delim = s.delim;
        }
        break;
      }
    }
    for (auto [b, e] : parts)
      if (e > b) out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
  }
  pieces = std::move(out);
}

class Split : public PreTokenizer {
 public:
  Split(const std::string& pattern, Behavior behavior, bool invert, const std::string& where)
      : regex_(pattern, where), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override { split_pieces(pieces, regex_, behavior_, invert_); }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's word pattern, which ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& where) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, where);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(p.text.begin(), ' ');
    if (regex_) split_pieces(pieces, *regex_, Behavior::Isolated, false);
    for (Piece& p : pieces) p.text = byte_level_encode(p.text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

enum class Prepend { Always, First, Never };

class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string replacement, Prepend prepend, bool split, const std::string& where)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split),
        regex_(regex_escape(replacement_), where) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& p : pieces) {
      std::string t;
      t.reserve(p.text.size() + replacement_.size());
      const bool starts =
          p.text.compare(0, replacement_.size(), replacement_) == 0 || (!p.text.empty() && p.text[0] == ' ');
      if (!starts && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && p.at_start))) t += replacement_;
      for (char c : p.text) {
        if (c == ' ')
          t += replacement_;
        else
          t += c;
      }
      p.text = std::move(t);
    }
    if (split_) split_pieces(pieces, regex_, Behavior::MergedWithNext, false);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  Regex regex_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_req<std::string>(j, "type", where + ": pre_tokenizer");
  const std::string w = where + ": pre_tokenizer " + type;
  if (type == "Sequence") {
    const auto list = json_req<nlohmann::json>(j, "pretokenizers", w);
    if (!list.is_array()) user_error(w, ": 'pretokenizers' must be a list");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& item : list)
      if (auto p = make_pre_tokenizer(item, where)) parts.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "Split") {
    return std::make_unique<Split>(json_pattern(json_req<nlohmann::json>(j, "pattern", w), w),
                                   parse_behavior(json_req<std::string>(j, "behavior", w), w),
                                   json_or<bool>(j, "invert", false, w), w);
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(json_or<bool>(j, "add_prefix_space", true, w),
                                       json_or<bool>(j, "use_regex", true, w), w);
  if (type == "Metaspace") {
    // Older files say add_prefix_space instead of prepend_scheme.
    std::string scheme = json_or<bool>(j, "add_prefix_space", true, w) ? "always" : "never";
    scheme = json_or<std::string>(j, "prepend_scheme", scheme, w);
    Prepend prepend;
    if (scheme == "always")
      prepend = Prepend::Always;
    else if (scheme == "first")
      prepend = Prepend::First;
    else if (scheme == "never")
      prepend = Prepend::Never;
    else
      user_error(w, ": prepend_scheme '", scheme, "' is not one of always, first, never");
    return std::make_unique<Metaspace>(json_or<std::string>(j, "replacement", "\xE2\x96\x81", w), prepend,
                                       json_or<bool>(j, "split", true, w), w);
  }
  user_error(where, ": pre_tokenizer type '", type, "' is not supported");
}

}  // namespace soltrain
