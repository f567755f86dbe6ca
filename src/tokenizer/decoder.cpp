// ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace and Sequence decoders, as in HF tokenizers.
#include "tokenizer/decoder.h"

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace soltrain {

namespace {

// Maps each token's characters back to bytes and decodes them all as one lossy UTF-8 string. A token
// with a character outside the byte alphabet (an added token, say) contributes its own UTF-8 bytes.
class ByteLevel : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        const int b = byte_level_byte(utf8_next(t, i));
        if (b < 0)
          ok = false;
        else
          bytes += char(b);
      }
      if (!ok) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// Runs of <0xXX> tokens become the text of those bytes, or one U+FFFD per byte if they are not UTF-8.
class ByteFallback : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t nbytes = 0;
    const auto flush = [&] {
      if (nbytes == 0) return;
      if (utf8_valid(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t k = 0; k < nbytes; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      nbytes = 0;
    };
    for (std::string& t : tokens) {
      int value = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>') value = parse_hex(t[3], t[4]);
      if (value >= 0) {
        bytes += char(value);
        ++nbytes;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex(char a, char b) { return hex(a) < 0 || hex(b) < 0 ? -1 : hex(a) * 16 + hex(b); }
};

class Fuse : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from every token.
class Strip : public Decoder {
 public:
  Strip(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode(std::vector<std::string>& tokens) const override {
    const size_t n = content_.size();
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && n && e - b >= n && t.compare(b, n, content_) == 0; ++k) b += n;
      for (size_t k = 0; k < stop_ && n && e - b >= n && t.compare(e - n, n, content_) == 0; ++k) e -= n;
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class Replace : public Decoder {
 public:
  Replace(const std::string& pattern, std::string content, const std::string& where)
      : regex_(pattern, where), content_(std::move(content)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t prev = 0;
      for (auto [b, e] : regex_.find_all(t)) {
        out.append(t, prev, b - prev);
        out += content_;
        prev = e;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Regex regex_;
  std::string content_;
};

// The replacement character becomes a space, except in the first token when a prefix was prepended,
// where HF drops it (every occurrence in that token, not just the leading one).
class Metaspace : public Decoder {
 public:
  Metaspace(std::string replacement, bool prepended) : replacement_(std::move(replacement)), prepended_(prepended) {}
  void decode(std::vector<std::string>& tokens) const override {
    const size_t n = replacement_.size();
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      for (size_t k = 0; k < t.size();) {
        if (n && t.compare(k, n, replacement_) == 0) {
          if (!(i == 0 && prepended_)) out += ' ';
          k += n;
        } else {
          out += t[k++];
        }
      }
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepended_;
};

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_req<std::string>(j, "type", where + ": decoder");
  const std::string w = where + ": decoder " + type;
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    const int64_t start = json_or<int64_t>(j, "start", 0, w), stop = json_or<int64_t>(j, "stop", 0, w);
    if (start < 0 || stop < 0) user_error(w, ": start and stop must be >= 0");
    return std::make_unique<Strip>(json_req<std::string>(j, "content", w), size_t(start), size_t(stop));
  }
  if (type == "Replace")
    return std::make_unique<Replace>(json_pattern(json_req<nlohmann::json>(j, "pattern", w), w),
                                     json_req<std::string>(j, "content", w), w);
  if (type == "Metaspace") {
    std::string scheme = json_or<bool>(j, "add_prefix_space", true, w) ? "always" : "never";
    scheme = json_or<std::string>(j, "prepend_scheme", scheme, w);
    return std::make_unique<Metaspace>(json_or<std::string>(j, "replacement", "\xE2\x96\x81", w), scheme != "never");
  }
  if (type == "Sequence") {
    const auto list = json_req<nlohmann::json>(j, "decoders", w);
    if (!list.is_array()) user_error(w, ": 'decoders' must be a list");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& item : list)
      if (auto p = make_decoder(item, where)) parts.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(parts));
  }
  user_error(where, ": decoder type '", type, "' is not supported");
}

}  // namespace soltrain
