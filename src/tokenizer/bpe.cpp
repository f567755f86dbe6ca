// BPE encoding the way HF tokenizers does it: a min-heap of (merge rank, position) over a linked list of
// symbols, so equal-rank merges resolve leftmost first, exactly as in its word.rs.
#include "tokenizer/bpe.h"

#include <atomic>
#include <queue>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace soltrain {

namespace {

// Words longer than this are not cached (HF uses the same kind of bound); keeps memory in check.
constexpr size_t kMaxCachedWord = 256;
constexpr size_t kMaxCacheEntries = 1 << 20;

}  // namespace

namespace {
using WordCache = std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>;
std::atomic<uint64_t> next_bpe_id{1};
// This thread's cache for the Bpe with the given id (the last one used is remembered: the common case).
WordCache& thread_cache(uint64_t id) {
  thread_local std::unordered_map<uint64_t, WordCache> caches;
  thread_local uint64_t last_id = 0;
  thread_local WordCache* last = nullptr;
  if (id != last_id) {
    last = &caches[id];
    last_id = id;
  }
  return *last;
}
}  // namespace

Bpe::Bpe(const nlohmann::json& model, const std::string& where) : id_(next_bpe_id++) {
  const std::string w = where + ": model";
  const auto vocab = json_req<nlohmann::json>(model, "vocab", w);
  if (!vocab.is_object()) user_error(w, ": 'vocab' must be an object of token -> id");
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      user_error(w, ": vocab id of '", token, "' is not a non-negative integer");
    vocab_.emplace(token, id.get<int32_t>());
  }
  const auto dropout = json_or<double>(model, "dropout", 0.0, w);
  if (dropout != 0.0) user_error(w, ": BPE dropout ", dropout, " is not supported (training-time randomness)");
  byte_fallback_ = json_or<bool>(model, "byte_fallback", false, w);
  fuse_unk_ = json_or<bool>(model, "fuse_unk", false, w);
  ignore_merges_ = json_or<bool>(model, "ignore_merges", false, w);
  prefix_ = json_or<std::string>(model, "continuing_subword_prefix", "", w);
  suffix_ = json_or<std::string>(model, "end_of_word_suffix", "", w);
  if (const auto unk = json_or<std::string>(model, "unk_token", "", w); !unk.empty()) {
    const auto it = vocab_.find(unk);
    if (it == vocab_.end()) user_error(w, ": unk_token '", unk, "' is not in the vocab");
    unk_id_ = it->second;
  }

  const auto merges = json_or<nlohmann::json>(model, "merges", nlohmann::json::array(), w);
  if (!merges.is_array()) user_error(w, ": 'merges' must be a list");
  merges_.reserve(merges.size());
  const auto id_of = [&](const std::string& t, size_t rank) {
    const auto it = vocab_.find(t);
    if (it == vocab_.end()) user_error(w, ": merge ", rank, " uses '", t, "', which is not in the vocab");
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {  // "a b" (the older format)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) user_error(w, ": merge ", rank, " '", s, "' is not two tokens separated by a space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      user_error(w, ": merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]: ", m.dump());
    }
    // With a continuing-subword prefix the merged token drops b's copy of the prefix.
    const std::string merged = a + (!prefix_.empty() && b.starts_with(prefix_) ? b.substr(prefix_.size()) : b);
    // Later duplicates win, as when HF collects the merges into a map.
    const int32_t ia = id_of(a, rank), ib = id_of(b, rank);
    merges_[pair_key(ia, ib)] = Merge{int32_t(rank), id_of(merged, rank)};
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  WordCache& cache_ = thread_cache(id_);
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (const auto it = cache_.find(word); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() <= kMaxCachedWord) {
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

std::vector<int32_t> Bpe::merge_word(std::string_view word) const {
  // 1. One symbol per character; unknown characters become byte tokens or unk (HF's merge_word).
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  std::optional<int32_t> pending_unk;  // an unk not yet emitted, so fuse_unk can extend it
  std::string s;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    utf8_next(word, i);
    s.assign(word.substr(start, i - start));
    if (start > 0) s.insert(0, prefix_);
    if (i == word.size()) s += suffix_;
    if (const auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk) ids.push_back(*pending_unk);
      pending_unk.reset();
      ids.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (unsigned char c : s) {
        static const char* hex = "0123456789ABCDEF";
        const std::string name = std::string("<0x") + hex[c >> 4] + hex[c & 15] + ">";
        const auto it = vocab_.find(name);
        if (it == vocab_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == s.size()) {
        // HF emits these before any pending unk (it does not flush the unk here); we do the same.
        ids.insert(ids.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) ids.push_back(*pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unk token HF silently drops the character; so do we.
  }
  if (pending_unk) ids.push_back(*pending_unk);

  // 2. Merge the lowest-ranked adjacent pair (leftmost on ties) until none is left.
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  const int32_t n = int32_t(ids.size());
  if (n < 2) return ids;
  std::vector<Sym> sym(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) sym[size_t(k)] = {ids[size_t(k)], k - 1, k + 1 < n ? k + 1 : -1, true};
  struct Cand {
    int32_t rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  const auto push = [&](int32_t pos) {
    const int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    const auto it = merges_.find(pair_key(sym[size_t(pos)].id, sym[size_t(nx)].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& left = sym[size_t(c.pos)];
    if (!left.alive || left.next < 0) continue;
    // Skip stale entries: the pair at pos must still be the one this entry would produce.
    const auto it = merges_.find(pair_key(left.id, sym[size_t(left.next)].id));
    if (it == merges_.end() || it->second.id != c.id) continue;
    Sym& right = sym[size_t(left.next)];
    left.id = c.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[size_t(right.next)].prev = c.pos;
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  std::vector<int32_t> result;
  for (int32_t k = 0; k >= 0; k = sym[size_t(k)].next) result.push_back(sym[size_t(k)].id);
  return result;
}

}  // namespace soltrain
