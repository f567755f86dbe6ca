#include "hub/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/error.h"

namespace soltrain {

namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  CURL* curl = nullptr;
  HttpResponse r;
  const std::function<bool(long status, const char*, size_t)>* sink = nullptr;
  size_t max_body = 0;
  bool too_large = false;
};

// A timeout in seconds from the environment (huggingface_hub's constants.py names), else `fallback`.
long env_seconds(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  return end && *end == '\0' && d >= 1 && d < 1e6 ? long(d) : fallback;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {
    t->r.headers.clear();  // a new response (after a followed redirect or a 100 Continue)
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon), value = line.substr(colon + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  value.erase(0, value.find_first_not_of(" \t"));
  t->r.headers[name] = value;
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (!t->sink || status < 200 || status >= 300) {
    if (t->sink && t->r.body.size() >= 4096) return bytes;
    if (t->r.body.size() + bytes > t->max_body) {
      t->too_large = true;
      return 0;  // CURLE_WRITE_ERROR
    }
    t->r.body.append(data, bytes);
    return bytes;
  }
  if (!(*t->sink)(status, data, bytes)) return 0;  // CURLE_WRITE_ERROR: the caller asked to stop
  t->r.received += bytes;
  return bytes;
}

HttpResponse perform(const HttpRequest& req, const std::function<bool(long status, const char*, size_t)>* sink) {
  global_init();
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  Transfer t;
  t.curl = curl.get();
  t.sink = sink;
  t.max_body = sink ? 4096 : req.max_body;
  if (!is_http_url(req.url)) {
    t.r.error = "not an http:// or https:// URL";
    return t.r;
  }
  if (!curl) {
    t.r.error = "libcurl could not start a transfer";
    return t.r;
  }
  curl_slist* list = nullptr;
  for (const std::string& h : req.headers) list = curl_slist_append(list, h.c_str());
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(list, curl_slist_free_all);
  char errbuf[CURL_ERROR_SIZE] = {};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(c, CURLOPT_NOBODY, req.head ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, req.follow_redirects ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "soltrain (huggingface_hub-compatible cache)");
  // huggingface_hub's DEFAULT_ETAG_TIMEOUT / DEFAULT_DOWNLOAD_TIMEOUT are 10 s to connect or between
  // bytes. Between bytes is not enough: a server trickling a byte every few seconds would never be cut, so a
  // transfer must move 1 KiB/s over the window (any real link does); the caller resumes a cut one.
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, env_seconds("HF_HUB_ETAG_TIMEOUT", 10));
  if (req.timeout_s > 0) {
    curl_easy_setopt(c, CURLOPT_TIMEOUT, req.timeout_s);
  } else {
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, env_seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10));
  }
  // The body of a POST or PUT: the request's bytes, or a range of a file read as libcurl sends it.
  struct Upload {
    const std::string* text = nullptr;
    std::FILE* file = nullptr;
    uint64_t left = 0, off = 0;
  } up;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(nullptr, std::fclose);
  if (!req.method.empty()) {
    if (!req.upload_file.empty()) {
      file.reset(std::fopen(req.upload_file.c_str(), "rb"));
      if (!file || ::fseeko(file.get(), off_t(req.upload_offset), SEEK_SET) != 0) {
        t.r.error = cat(req.upload_file.string(), ": cannot read for the upload");
        return t.r;
      }
      up.file = file.get(), up.left = req.upload_size;
    } else {
      up.text = &req.body, up.left = req.body.size();
    }
    auto read = +[](char* dst, size_t size, size_t n, void* user) -> size_t {
      auto* u = static_cast<Upload*>(user);
      const size_t want = size_t(std::min<uint64_t>(u->left, uint64_t(size * n)));
      const size_t got = u->file ? std::fread(dst, 1, want, u->file) : (u->text->copy(dst, want, u->off), want);
      if (got < want) return CURL_READFUNC_ABORT;  // the file shrank under the upload
      u->left -= got, u->off += got;
      return got;
    };
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);  // a body read through the callback, with its size known
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, curl_off_t(up.left));
    curl_easy_setopt(c, CURLOPT_READFUNCTION, read);
    curl_easy_setopt(c, CURLOPT_READDATA, &up);
    list = curl_slist_append(list, "Expect:");  // no 100-continue round trip
    headers.release();
    headers.reset(list);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &t.r.status);
  if (t.too_large)
    t.r.error = cat("the answer is larger than ", t.max_body >> 20, " MiB (an endless or hostile answer)");
  else if (rc != CURLE_OK)
    t.r.error = errbuf[0] ? errbuf : curl_easy_strerror(rc);
  return t.r;
}

}  // namespace

HttpResponse http_fetch(const HttpRequest& req) {
  return perform(req, nullptr);
}

HttpResponse http_stream(const HttpRequest& req, const std::function<bool(long status, const char*, size_t)>& sink) {
  return perform(req, &sink);
}

std::string url_quote(const std::string& s, const std::string& safe) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || safe.find(char(c)) != std::string::npos) {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

bool is_http_url(const std::string& url) {
  std::string scheme = url.substr(0, url.find("://"));
  std::transform(scheme.begin(), scheme.end(), scheme.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return url.find("://") != std::string::npos && (scheme == "http" || scheme == "https");
}

std::string url_for_messages(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t host_end = std::min(url.find('/', scheme + 3), url.size());
  const size_t at = url.rfind('@', host_end);
  if (at == std::string::npos || at < scheme + 3) return url;
  return url.substr(0, scheme + 3) + "***@" + url.substr(at + 1);
}

std::string url_origin(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return "";
  const size_t path = url.find('/', scheme + 3);
  return path == std::string::npos ? url : url.substr(0, path);
}

}  // namespace soltrain
