#include "hub/hub_upload.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/base64.h"
#include "io/sha256.h"

namespace soltrain {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string kind_path(const RepoRef& r) {
  return r.type == RepoType::kDataset ? "datasets" : "models";
}

// The first 512 bytes of a file, what preupload's "sample" carries (the hub sniffs text from binary).
std::string head_bytes(const fs::path& p, size_t n) {
  std::ifstream in(p, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), std::streamsize(n));
  s.resize(size_t(in.gcount()));
  return s;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) user_error(p.string(), ": cannot read it for the upload");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

HttpResponse post_json(const HubClient& c, const std::string& url, const json& body,
                       const std::string& content_type = "application/json") {
  HttpRequest q;
  q.url = url;
  q.method = "POST";
  q.body = body.is_string() ? body.get<std::string>() : body.dump();
  q.headers = hub_headers(c);
  q.headers.push_back("Content-Type: " + content_type);
  return http_fetch(q);
}

// One line for a failed step of an upload: the repository, what was being done, the answer.
[[noreturn]] void upload_failed(const HubClient& c, const RepoRef& r, const std::string& what, const HttpResponse& a) {
  const std::string name = cat(repo_kind(r.type), " ", r.id);
  if (a.status == 0)
    user_error(name, ": cannot reach ", url_for_messages(c.endpoint), " to ", what, " (", a.error, ")");
  if (a.status == 401 || a.status == 403)
    user_error(name, ": the hub refused to ", what, " (HTTP ", a.status, "): ",
               c.token ? "the token has no write access to it" : "no token: set HF_TOKEN to a token with write access",
               " (huggingface.co/settings/tokens)");
  std::string detail = a.body.substr(0, 300);
  detail.erase(std::remove_if(detail.begin(), detail.end(), [](char ch) { return ch == '\n' || ch == '\r'; }),
               detail.end());
  user_error(name, ": the hub answered HTTP ", a.status, " to ", what, detail.empty() ? "" : ": " + detail);
}

json parse_answer(const HubClient& c, const RepoRef& r, const std::string& what, const HttpResponse& a) {
  const json j = json::parse(a.body, nullptr, false);
  if (j.is_discarded()) upload_failed(c, r, what + " (its answer is not JSON)", a);
  return j;
}

// One LFS object to the storage the batch API named: one PUT, or (a "chunk_size" header) the parts the
// answer lists, then the completion; then the verify call when there is one.
void upload_lfs_object(const HubClient& c, const RepoRef& r, const UploadFile& f, const std::string& oid, uint64_t size,
                       const json& actions) {
  const std::string what = cat("upload ", f.path_in_repo);
  if (!actions.contains("upload")) return;  // the storage has it already
  const json& up = actions["upload"];
  const json header = up.value("header", json::object());
  if (header.contains("chunk_size")) {
    const uint64_t chunk = std::stoull(header["chunk_size"].is_string() ? header["chunk_size"].get<std::string>()
                                                                        : header["chunk_size"].dump());
    json parts = json::array();
    for (uint64_t part = 1, off = 0; off < size; ++part, off += chunk) {
      const std::string key = std::to_string(part);
      if (!header.contains(key))
        user_error(repo_kind(r.type), " ", r.id, ": the hub's multipart upload of ", f.path_in_repo,
                   " names no URL for part ", part);
      HttpRequest q;
      q.url = header[key].get<std::string>();
      q.method = "PUT";
      q.upload_file = f.local, q.upload_offset = off, q.upload_size = std::min(chunk, size - off);
      const HttpResponse a = http_fetch(q);
      if (a.status < 200 || a.status >= 300) upload_failed(c, r, what + cat(" (part ", part, ")"), a);
      parts.push_back({{"partNumber", part}, {"etag", a.header("etag")}});
    }
    const HttpResponse done = post_json(c, up["href"].get<std::string>(), json{{"oid", oid}, {"parts", parts}});
    if (done.status < 200 || done.status >= 300) upload_failed(c, r, what + " (completing its parts)", done);
  } else {
    HttpRequest q;
    q.url = up["href"].get<std::string>();
    q.method = "PUT";
    for (const auto& [k, v] : header.items())
      if (v.is_string()) q.headers.push_back(k + ": " + v.get<std::string>());
    q.upload_file = f.local, q.upload_size = size;
    const HttpResponse a = http_fetch(q);
    if (a.status < 200 || a.status >= 300) upload_failed(c, r, what, a);
  }
  if (actions.contains("verify")) {
    const json& v = actions["verify"];
    HttpRequest q;
    q.url = v["href"].get<std::string>();
    q.method = "POST";
    q.body = json{{"oid", oid}, {"size", size}}.dump();
    q.headers = hub_headers(c);
    for (const auto& [k, val] : v.value("header", json::object()).items())
      if (val.is_string()) q.headers.push_back(k + ": " + val.get<std::string>());
    q.headers.push_back("Content-Type: application/vnd.git-lfs+json");
    const HttpResponse a = http_fetch(q);
    if (a.status < 200 || a.status >= 300) upload_failed(c, r, what + " (verifying it)", a);
  }
}

}  // namespace

std::vector<UploadFile> folder_files(const fs::path& dir, const std::string& prefix) {
  std::vector<UploadFile> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = e.path().lexically_relative(dir).generic_string();
    if (!e.is_regular_file() || rel.find("/.") != std::string::npos || rel[0] == '.') continue;
    out.push_back({prefix + rel, e.path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path_in_repo < b.path_in_repo; });
  return out;
}

void create_repo(const HubClient& c, const RepoRef& r, bool private_repo) {
  const size_t slash = r.id.find('/');
  // (no "private" unless asked: the hub's default, an organization's own, as create_repo(private=None) leaves it)
  json body = {{"name", slash == std::string::npos ? r.id : r.id.substr(slash + 1)}};
  if (private_repo) body["private"] = true;
  if (slash != std::string::npos) body["organization"] = r.id.substr(0, slash);
  if (r.type == RepoType::kDataset) body["type"] = "dataset";
  const HttpResponse a = post_json(c, c.endpoint + "/api/repos/create", body);
  if (a.status == 409) return;  // it exists (ours, from an earlier run)
  if (a.status < 200 || a.status >= 300) upload_failed(c, r, "create the repository", a);
}

std::string upload_files(const HubClient& c, const RepoRef& r, const std::vector<UploadFile>& files,
                         const std::string& message) {
  const std::string api = cat(c.endpoint, "/api/", kind_path(r), "/", r.id);
  const std::string rev = url_quote(r.revision, "");
  // A model card's metadata checked by the hub first, as upload_folder does (before anything is hashed or sent).
  for (const UploadFile& f : files)
    if (f.path_in_repo == "README.md") {
      const HttpResponse v = post_json(c, c.endpoint + "/api/validate-yaml",
                                       json{{"content", read_all(f.local)},
                                            {"repoType", kind_path(r).substr(0, 5) == "model" ? "model" : "dataset"}});
      if (v.status == 400) {
        std::string why;
        for (const json& e : json::parse(v.body, nullptr, false).value("errors", json::array()))
          why += (why.empty() ? "" : "; ") + e.value("message", "");
        user_error(f.local.string(), ": the hub refused the model card's metadata", why.empty() ? "" : ": " + why);
      }
      if (v.status < 200 || v.status >= 300) upload_failed(c, r, "check README.md's metadata", v);
    }
  // Each file's mode as the hub decides it (.gitattributes' LFS patterns, size, binary content).
  std::vector<uint64_t> sizes;
  json listing = json::array();
  for (const UploadFile& f : files) {
    sizes.push_back(fs::file_size(f.local));
    listing.push_back({{"path", f.path_in_repo}, {"size", sizes.back()}, {"sample", base64(head_bytes(f.local, 512))}});
  }
  const HttpResponse pre = post_json(c, api + "/preupload/" + rev, json{{"files", listing}});
  if (pre.status < 200 || pre.status >= 300) upload_failed(c, r, "prepare the upload", pre);
  std::map<std::string, std::string> mode;
  for (const json& f : parse_answer(c, r, "prepare the upload", pre).value("files", json::array()))
    mode[f.value("path", "")] = f.value("shouldIgnore", false) ? "ignore" : f.value("uploadMode", "regular");
  // LFS files: their sha256 to the batch API, then each to the storage it names.
  std::vector<size_t> lfs;
  std::vector<std::string> oids(files.size());
  json objects = json::array();
  for (size_t i = 0; i < files.size(); ++i)
    if (mode[files[i].path_in_repo] == "lfs") {
      lfs.push_back(i);
      oids[i] = sha256_file(files[i].local);
      objects.push_back({{"oid", oids[i]}, {"size", sizes[i]}});
    }
  if (!lfs.empty()) {
    const std::string batch_url =
        cat(c.endpoint, r.type == RepoType::kDataset ? "/datasets/" : "/", r.id, ".git/info/lfs/objects/batch");
    HttpRequest q;
    q.url = batch_url;
    q.method = "POST";
    q.headers = hub_headers(c);
    q.headers.push_back("Accept: application/vnd.git-lfs+json");
    q.headers.push_back("Content-Type: application/vnd.git-lfs+json");
    q.body = json{{"operation", "upload"},
                  {"transfers", {"basic", "multipart"}},
                  {"objects", objects},
                  {"hash_algo", "sha256"},
                  {"ref", {{"name", r.revision}}}}
                 .dump();
    const HttpResponse a = http_fetch(q);
    if (a.status < 200 || a.status >= 300) upload_failed(c, r, "start the LFS upload", a);
    std::map<std::string, json> actions;
    for (const json& o : parse_answer(c, r, "start the LFS upload", a).value("objects", json::array())) {
      if (o.contains("error"))
        upload_failed(c, r, cat("upload the object ", o.value("oid", "?"), ": ", o["error"].dump()), a);
      actions[o.value("oid", "")] = o.value("actions", json::object());
    }
    for (size_t i : lfs) upload_lfs_object(c, r, files[i], oids[i], sizes[i], actions[oids[i]]);
  }
  // The commit: a header line, then one line per file (regular: its bytes; LFS: the object it points to).
  std::string ndjson = json{{"key", "header"}, {"value", {{"summary", message}, {"description", ""}}}}.dump() + "\n";
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& m = mode[files[i].path_in_repo];
    if (m == "ignore") continue;
    if (m == "lfs")
      ndjson +=
          json{{"key", "lfsFile"},
               {"value", {{"path", files[i].path_in_repo}, {"algo", "sha256"}, {"oid", oids[i]}, {"size", sizes[i]}}}}
              .dump() +
          "\n";
    else
      ndjson += json{{"key", "file"},
                     {"value",
                      {{"content", base64(read_all(files[i].local))},
                       {"path", files[i].path_in_repo},
                       {"encoding", "base64"}}}}
                    .dump() +
                "\n";
  }
  const HttpResponse done = post_json(c, api + "/commit/" + rev, json(ndjson), "application/x-ndjson");
  if (done.status < 200 || done.status >= 300) upload_failed(c, r, "commit the upload", done);
  return parse_answer(c, r, "commit the upload", done).value("commitOid", "");
}

}  // namespace soltrain
