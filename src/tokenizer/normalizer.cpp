// The normalizers of HF tokenizers that Llama/Qwen/Mistral-family tokenizer.json files use.
#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace soltrain {

std::string json_pattern(const nlohmann::json& j, const std::string& where) {
  if (j.is_object() && j.contains("String") && j["String"].is_string())
    return regex_escape(j["String"].get<std::string>());
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) return j["Regex"].get<std::string>();
  user_error(where, ": pattern must be {\"String\": ...} or {\"Regex\": ...}, got ", j.dump());
}

namespace {

// Unicode normal forms through utf8proc. ASCII is already in every form, which skips most text.
class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  void normalize(std::string& s) const override {
    bool ascii = true;
    for (unsigned char c : s) ascii &= c < 0x80;
    if (ascii) return;
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                                utf8proc_option_t(options_));
    if (n < 0) throw std::runtime_error(cat("utf8proc: ", utf8proc_errmsg(n)));
    s.assign(reinterpret_cast<const char*>(out), size_t(n));
    std::free(out);  // utf8proc allocates with malloc
  }

 private:
  int options_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// HF only prepends to non-empty text.
class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Replace : public Normalizer {
 public:
  Replace(const std::string& pattern, std::string content, const std::string& where)
      : regex_(pattern, where), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    const auto matches = regex_.find_all(s);
    if (matches.empty()) return;
    std::string out;
    size_t prev = 0;
    for (auto [b, e] : matches) {
      out.append(s, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }

 private:
  Regex regex_;
  std::string content_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_req<std::string>(j, "type", where + ": normalizer");
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Sequence") {
    const auto list = json_req<nlohmann::json>(j, "normalizers", where + ": normalizer Sequence");
    if (!list.is_array()) user_error(where, ": normalizer Sequence: 'normalizers' must be a list");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& item : list)
      if (auto p = make_normalizer(item, where)) parts.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(json_req<std::string>(j, "prepend", where + ": Prepend"));
  if (type == "Replace") {
    const std::string w = where + ": normalizer Replace";
    return std::make_unique<Replace>(json_pattern(json_req<nlohmann::json>(j, "pattern", w), w),
                                     json_req<std::string>(j, "content", w), w);
  }
  user_error(where, ": normalizer type '", type, "' is not supported");
}

}  // namespace soltrain
