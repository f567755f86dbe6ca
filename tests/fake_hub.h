// A fake Hugging Face hub for the download tests: an HTTP/1.1 server on 127.0.0.1 (a thread, an ephemeral
// port) speaking the part of the hub's protocol huggingface_hub uses: the file list
// (/api/{models|datasets}/ID/revision/REV), resolve URLs answering HEAD and GET (X-Repo-Commit, ETag; LFS
// files as a 302 to a blob URL on a second port, the "CDN", with X-Linked-Etag = sha256 and X-Linked-Size;
// the CDN refuses a hub token, as a signed storage URL would not expect one), Range requests on blobs,
// 401 for a private repository without the token, 404 for a missing one. Switches make the next blob
// answers corrupt (one byte flipped) or cut (the connection closes halfway). The write side as huggingface_hub
// speaks it (hf_api.py create_repo / create_commit): POST /api/repos/create, .../preupload/REV (LFS for
// *.safetensors), the LFS batch API (uploads PUT to the CDN port, then a verify call), and .../commit/REV
// (NDJSON: header, file with base64 content, lfsFile by oid), each needing the token; a commit makes a new
// commit id and the files are then served as any others.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "inputs_guard.h"
#include "io/sha256.h"
#include "test_util.h"

namespace soltrain::test {

struct FakeRepo {
  std::string commit;                        // 40 hex
  std::map<std::string, std::string> files;  // name → bytes
  std::vector<std::string> lfs;              // names served as LFS files (redirect to a blob)
  bool private_repo = false;                 // 401 unless "Authorization: Bearer <token>"
};

class FakeHub {
 public:
  // A test's own answer to a request on the hub port (hostile hubs): called first, under the hub's lock;
  // true when it answered (with send_raw). The serving thread is busy while it runs.
  std::function<bool(int fd, const std::string& method, const std::string& target)> intercept;
  // The same with the request's body (a test's own endpoint, as a GRPO reward server).
  std::function<bool(int fd, const std::string& target, const std::string& body)> intercept_body;
  static bool send_raw(int c, const std::string& s) { return send_all(c, s); }
  std::atomic<int> corrupt_next{0};  // blob GETs to answer with one byte flipped
  std::atomic<int> cut_next{0};      // blob GETs to cut after half the bytes
  std::string token = "hf_test_token";

  FakeHub() {
    for (int i = 0; i < 2; ++i) {
      fd_[i] = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = 0;  // ephemeral
      if (::bind(fd_[i], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_[i], 16) != 0) std::abort();
      socklen_t len = sizeof a;
      ::getsockname(fd_[i], reinterpret_cast<sockaddr*>(&a), &len);
      port_[i] = ntohs(a.sin_port);
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeHub() {
    stop_ = true;
    thread_.join();
    ::close(fd_[0]);
    ::close(fd_[1]);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_[0]); }
  std::string cdn() const { return "http://127.0.0.1:" + std::to_string(port_[1]); }
  // key: "models/Org/Name" or "datasets/Org/Name"
  void add(const std::string& key, FakeRepo repo) {
    std::lock_guard<std::mutex> l(mu_);
    repos_[key] = std::move(repo);
  }
  // Every request as "METHOD target [Range: ...] [auth]", in order.
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> l(mu_);
    return requests_;
  }

 private:
  struct Req {
    std::string method, target;
    std::map<std::string, std::string> headers;
    std::string body;
  };

  void serve() {
    while (!stop_) {
      pollfd p[2] = {{fd_[0], POLLIN, 0}, {fd_[1], POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & POLLIN)) continue;
        const int c = ::accept(fd_[i], nullptr, nullptr);
        if (c < 0) continue;
        handle(c, i == 1);
        ::close(c);  // one request per connection (Connection: close)
      }
    }
  }

  static bool send_all(int c, const std::string& s) {
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = ::send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }

  static void reply(int c, const Req& q, int status, std::map<std::string, std::string> h, const std::string& body,
                    size_t send_bytes = SIZE_MAX) {
    static const std::map<int, std::string> reason = {
        {200, "OK"},           {206, "Partial Content"}, {302, "Found"},    {400, "Bad Request"},
        {401, "Unauthorized"}, {404, "Not Found"},       {409, "Conflict"}, {416, "Range Not Satisfiable"}};
    std::string s = "HTTP/1.1 " + std::to_string(status) + " " + reason.at(status) + "\r\n";
    h["Connection"] = "close";
    if (!h.count("Content-Length")) h["Content-Length"] = std::to_string(body.size());
    for (const auto& [k, v] : h) s += k + ": " + v + "\r\n";
    s += "\r\n";
    if (q.method != "HEAD") s += body.substr(0, std::min(send_bytes, body.size()));
    send_all(c, s);
  }

  std::optional<Req> read_request(int c) {
    std::string buf;
    char tmp[4096];
    while (buf.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) return std::nullopt;
      buf.append(tmp, size_t(n));
    }
    Req q;
    const size_t eol = buf.find("\r\n");
    const std::string line = buf.substr(0, eol);
    const size_t s1 = line.find(' '), s2 = line.find(' ', s1 + 1);
    q.method = line.substr(0, s1);
    q.target = line.substr(s1 + 1, s2 - s1 - 1);
    for (size_t pos = eol + 2; pos < buf.size();) {
      const size_t e = buf.find("\r\n", pos);
      if (e == pos || e == std::string::npos) break;
      const std::string h = buf.substr(pos, e - pos);
      const size_t colon = h.find(':');
      std::string name = h.substr(0, colon);
      for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      q.headers[name] = h.substr(h.find_first_not_of(' ', colon + 1));
      pos = e + 2;
    }
    q.body = buf.substr(buf.find("\r\n\r\n") + 4);
    const size_t length = q.headers.count("content-length") ? std::stoull(q.headers.at("content-length")) : 0;
    while (q.body.size() < length) {
      const ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) return std::nullopt;
      q.body.append(tmp, size_t(n));
    }
    return q;
  }

  static std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 1;  // after the leading '/'
    for (size_t i = 1; i <= s.size(); ++i)
      if (i == s.size() || s[i] == '/') out.push_back(s.substr(start, i - start)), start = i + 1;
    return out;
  }

  void handle(int c, bool on_cdn) {
    const auto q = read_request(c);
    if (!q) return;
    std::lock_guard<std::mutex> l(mu_);
    std::string note = q->method + " " + q->target;
    if (q->headers.count("range")) note += " Range: " + q->headers.at("range");
    if (q->headers.count("authorization")) note += " [auth]";
    requests_.push_back(note);
    if (!on_cdn && intercept && intercept(c, q->method, q->target)) return;
    if (!on_cdn && intercept_body && intercept_body(c, q->target, q->body)) return;
    const std::vector<std::string> p = split(q->target);
    if (on_cdn && p.size() == 2 && p[0] == "upload" && q->method == "PUT") {  // an LFS object's bytes
      if (sha256_hex(q->body) != p[1]) return reply(c, *q, 400, {}, "the bytes do not hash to the oid");
      uploaded_[p[1]] = q->body;
      return reply(c, *q, 200, {}, "");
    }
    if (on_cdn) return p.size() == 2 && p[0] == "cdn" ? blob(c, *q, p[1]) : reply(c, *q, 404, {}, "no such blob");
    if (q->method == "POST") return write(c, *q, p);
    // /api/{kind}s/Org/Name/revision/REV
    if (p.size() == 6 && p[0] == "api" && p[4] == "revision") {
      FakeRepo* r = repo(c, *q, p[1] + "/" + p[2] + "/" + p[3]);
      if (!r) return;
      nlohmann::json j = {{"id", p[2] + "/" + p[3]}, {"sha", r->commit}, {"siblings", nlohmann::json::array()}};
      for (const auto& [name, bytes] : r->files) j["siblings"].push_back({{"rfilename", name}});
      return reply(c, *q, 200, {{"Content-Type", "application/json"}}, j.dump());
    }
    // /[datasets/]Org/Name/resolve/REV/FILE...
    const bool dataset = !p.empty() && p[0] == "datasets";
    const size_t o = dataset ? 1 : 0;
    if (p.size() >= o + 5 && p[o + 2] == "resolve") {
      FakeRepo* r = repo(c, *q, std::string(dataset ? "datasets/" : "models/") + p[o] + "/" + p[o + 1]);
      if (!r) return;
      std::string file;
      for (size_t i = o + 4; i < p.size(); ++i) file += (file.empty() ? "" : "/") + p[i];
      if (p[o + 3] != "main" && p[o + 3] != r->commit)
        return reply(c, *q, 404, {{"X-Error-Code", "RevisionNotFound"}}, "Revision Not Found");
      if (!r->files.count(file)) return reply(c, *q, 404, {{"X-Error-Code", "EntryNotFound"}}, "Entry not found");
      const std::string& bytes = r->files.at(file);
      const std::string sha = sha256_hex(bytes);
      if (std::find(r->lfs.begin(), r->lfs.end(), file) != r->lfs.end())
        return reply(c, *q, 302,
                     {{"Location", cdn() + "/cdn/" + sha},
                      {"X-Repo-Commit", r->commit},
                      {"X-Linked-Etag", "\"" + sha + "\""},
                      {"X-Linked-Size", std::to_string(bytes.size())},
                      {"ETag", "W/\"" + sha.substr(0, 40) + "\""}},
                     "");
      // A regular (git) file: its etag is a git sha1 on the real hub; 40 hex here too.
      return reply(c, *q, 200, {{"X-Repo-Commit", r->commit}, {"ETag", "\"" + sha.substr(0, 40) + "\""}}, bytes);
    }
    reply(c, *q, 404, {}, "no such route");
  }

  bool authorized(const Req& q) const {
    return q.headers.count("authorization") && q.headers.at("authorization") == "Bearer " + token;
  }

  void write(int c, const Req& q, const std::vector<std::string>& p) {
    if (!authorized(q)) return reply(c, q, 401, {}, "Invalid credentials in Authorization header");
    const nlohmann::json j = nlohmann::json::parse(q.body, nullptr, false);
    if (p == std::vector<std::string>{"api", "validate-yaml"})
      return reply(c, q, j.value("content", "").rfind("---\n", 0) == 0 ? 200 : 400,
                   {{"Content-Type", "application/json"}}, R"({"errors": [], "warnings": []})");
    if (p == std::vector<std::string>{"api", "repos", "create"}) {
      const std::string id = j.value("organization", "user") + "/" + j.value("name", "");
      const std::string key = (j.value("type", "model") == "dataset" ? "datasets/" : "models/") + id;
      if (repos_.count(key)) return reply(c, q, 409, {}, "You already created this model repo");
      FakeRepo r;
      r.commit = sha256_hex(key).substr(0, 40);
      r.private_repo = j.value("private", false);
      repos_[key] = r;
      return reply(c, q, 200, {{"Content-Type", "application/json"}}, nlohmann::json{{"url", id}}.dump());
    }
    // /api/{kind}s/Org/Name/preupload|commit/REV
    if (p.size() == 6 && p[0] == "api" && (p[4] == "preupload" || p[4] == "commit")) {
      FakeRepo* r = repo(c, q, p[1] + "/" + p[2] + "/" + p[3]);
      if (!r) return;
      if (p[4] == "preupload") {
        nlohmann::json files = nlohmann::json::array();
        for (const auto& f : j.at("files")) {
          const std::string path = f.at("path");
          const bool lfs = path.ends_with(".safetensors") || f.at("size").get<size_t>() > (size_t(1) << 20);
          files.push_back({{"path", path}, {"uploadMode", lfs ? "lfs" : "regular"}, {"shouldIgnore", false}});
        }
        return reply(c, q, 200, {{"Content-Type", "application/json"}}, nlohmann::json{{"files", files}}.dump());
      }
      std::istringstream lines(q.body);
      FakeRepo next = *r;
      std::string summary;
      for (std::string line; std::getline(lines, line);) {
        const nlohmann::json l = nlohmann::json::parse(line, nullptr, false);
        if (l.is_discarded()) return reply(c, q, 400, {}, "a line is not JSON");
        const nlohmann::json& v = l.at("value");
        if (l.at("key") == "header") {
          summary = v.value("summary", "");
        } else if (l.at("key") == "file") {
          next.files[v.at("path")] = base64_decode(v.at("content"));
          std::erase(next.lfs, v.at("path").get<std::string>());
        } else if (l.at("key") == "lfsFile") {
          const auto it = uploaded_.find(v.at("oid").get<std::string>());
          if (it == uploaded_.end() || it->second.size() != v.at("size").get<size_t>())
            return reply(c, q, 400, {}, "lfsFile names an object never uploaded");
          next.files[v.at("path")] = it->second;
          if (std::find(next.lfs.begin(), next.lfs.end(), v.at("path")) == next.lfs.end())
            next.lfs.push_back(v.at("path"));
        } else {
          return reply(c, q, 400, {}, "unknown commit line");
        }
      }
      next.commit = sha256_hex(r->commit + summary + q.body).substr(0, 40);
      commits_.push_back(summary);
      *r = next;
      return reply(c, q, 200, {{"Content-Type", "application/json"}},
                   nlohmann::json{{"commitOid", r->commit}, {"commitUrl", endpoint() + "/commit/" + r->commit}}.dump());
    }
    // /Org/Name.git/info/lfs/objects/batch
    if (p.size() == 6 && p[1].ends_with(".git") && p[5] == "batch") {
      nlohmann::json objects = nlohmann::json::array();
      for (const auto& o : j.at("objects")) {
        const std::string oid = o.at("oid");
        nlohmann::json one = {{"oid", oid}, {"size", o.at("size")}};
        if (!uploaded_.count(oid))
          one["actions"] = {{"upload", {{"href", cdn() + "/upload/" + oid}}},
                            {"verify", {{"href", endpoint() + "/verify/" + oid}}}};
        objects.push_back(one);
      }
      return reply(c, q, 200, {{"Content-Type", "application/vnd.git-lfs+json"}},
                   nlohmann::json{{"objects", objects}}.dump());
    }
    if (p.size() == 2 && p[0] == "verify") return reply(c, q, uploaded_.count(p[1]) ? 200 : 404, {}, "");
    reply(c, q, 404, {}, "no such route");
  }

  static std::string base64_decode(const std::string& s) {
    static const std::string abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (char ch : s) {
      if (ch == '=') break;
      acc = (acc << 6) | uint32_t(abc.find(ch));
      if ((bits += 6) >= 8) out += char((acc >> (bits -= 8)) & 0xff);
    }
    return out;
  }

  FakeRepo* repo(int c, const Req& q, const std::string& key) {
    const auto it = repos_.find(key);
    if (it == repos_.end()) {
      reply(c, q, 404, {{"X-Error-Code", "RepoNotFound"}}, "Repository not found");
      return nullptr;
    }
    if (it->second.private_repo &&
        (!q.headers.count("authorization") || q.headers.at("authorization") != "Bearer " + token)) {
      reply(c, q, 401, {}, "Invalid credentials in Authorization header");
      return nullptr;
    }
    return &it->second;
  }

  void blob(int c, const Req& q, const std::string& sha) {
    for (const auto& [key, r] : repos_)
      for (const auto& [name, bytes] : r.files) {
        if (sha256_hex(bytes) != sha) continue;
        if (q.headers.count("authorization")) return reply(c, q, 401, {}, "the storage takes no hub token");
        size_t from = 0;
        if (q.headers.count("range")) from = std::stoull(q.headers.at("range").substr(6));  // "bytes=N-"
        if (from >= bytes.size())
          return reply(c, q, 416, {{"Content-Range", "bytes */" + std::to_string(bytes.size())}}, "");
        std::string body = bytes.substr(from);
        if (q.method == "GET" && corrupt_next > 0) --corrupt_next, body[body.size() / 2] ^= 0x5A;
        size_t send = SIZE_MAX;
        if (q.method == "GET" && cut_next > 0) --cut_next, send = body.size() / 2;
        std::map<std::string, std::string> h = {{"Accept-Ranges", "bytes"}};
        if (from > 0)
          h["Content-Range"] = "bytes " + std::to_string(from) + "-" + std::to_string(bytes.size() - 1) + "/" +
                               std::to_string(bytes.size());
        return reply(c, q, from > 0 ? 206 : 200, h, body, send);
      }
    reply(c, q, 404, {}, "no such blob");
  }

  int fd_[2] = {-1, -1}, port_[2] = {0, 0};  // the hub, the CDN
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, FakeRepo> repos_;
  std::vector<std::string> requests_;
  std::map<std::string, std::string> uploaded_;  // LFS objects by sha256
  std::vector<std::string> commits_;             // their summaries, in order

 public:
  std::vector<std::string> commits() {
    std::lock_guard<std::mutex> l(mu_);
    return commits_;
  }
  // A repository's files as they are now (after commits).
  std::map<std::string, std::string> files_of(const std::string& key) {
    std::lock_guard<std::mutex> l(mu_);
    return repos_.at(key).files;
  }
};

// The fixture model qwen3-tiny as a hub repository at `commit`: config.json, and model.safetensors as an LFS
// file (a redirect to the CDN port).
inline FakeRepo fixture_model_repo(const std::string& commit) {
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  FakeRepo r;
  r.commit = commit;
  const std::filesystem::path src = fixtures() / "models" / "qwen3-tiny";
  r.files["config.json"] = read(src / "config.json");
  r.files["model.safetensors"] = read(src / "model.safetensors");
  r.lfs = {"model.safetensors"};
  return r;
}

// Sets (or, with nullptr, unsets) an environment variable for the test's scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_.c_str(), old_->c_str(), 1) : ::unsetenv(name_.c_str()); }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A temporary cache and home (so no real token or cache is read), pointed at `endpoint`.
struct HubEnv {
  test::TempDir t;
  ScopedEnv cache{"HF_HUB_CACHE", (t.path / "cache").c_str()}, home{"HF_HOME", (t.path / "home").c_str()},
      token{"HF_TOKEN", nullptr}, offline{"HF_HUB_OFFLINE", nullptr}, offline2{"TRANSFORMERS_OFFLINE", nullptr};
  std::optional<ScopedEnv> endpoint;
  explicit HubEnv(const std::string& url) { endpoint.emplace("HF_ENDPOINT", url.c_str()); }
  std::filesystem::path cache_dir() const { return t.path / "cache"; }
  // From here on, every file under this environment (the cache, HF_HOME, a test's victim files) must stay as it
  // is until the environment goes; downloads may add files.
  void keep_existing() { guard.arm({t.path}, /*allow_new=*/true); }
  InputsGuard guard;  // (after t: compared before the folder goes)
};

}  // namespace soltrain::test
