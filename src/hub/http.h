// A thin libcurl client for the hub: one request at a time, headers as a map, bodies either kept (API
// answers, error pages) or streamed to a sink (files). Transport failures are reported, not thrown, so the
// caller decides between resuming, falling back to the cache and a message. Timeouts as huggingface_hub's:
// HF_HUB_ETAG_TIMEOUT (default 10 s) to connect, HF_HUB_DOWNLOAD_TIMEOUT (default 10 s) as the window in which
// a transfer must move at least 1 KiB/s, or it is cut (and resumed by the caller).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace soltrain {

struct HttpResponse {
  long status = 0;                             // 0: no HTTP answer (see error)
  std::map<std::string, std::string> headers;  // of the last response, names lower-cased
  std::string body;                            // kept bodies; for streamed ones, the first 4 KB of a non-2xx answer
  std::string error;                           // libcurl's message when the transfer failed, else empty
  size_t received = 0;                         // bytes handed to the sink
  std::string header(const std::string& lower_name) const {
    const auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

struct HttpRequest {
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  bool head = false;
  bool follow_redirects = false;
  // A kept body larger than this ends the transfer with an error (an endless or hostile answer must not
  // fill memory); streamed bodies are bounded by their sink.
  size_t max_body = size_t(64) << 20;
  // A request with a body (the hub's commit API, LFS uploads): "POST" or "PUT" sends `body`, or with
  // `upload_file` set, `upload_size` bytes of that file from `upload_offset` (a multipart upload's part),
  // streamed rather than held in memory.
  std::string method;  // empty: GET (or HEAD)
  std::string body;
  std::filesystem::path upload_file;
  uint64_t upload_offset = 0, upload_size = 0;
  // > 0: the whole request must end within this many seconds, however slowly the answer starts (a reward
  // endpoint computing its scores); instead of the hub's 1 KiB/s-over-a-window rule.
  long timeout_s = 0;
};

// Only http:// and https:// URLs are ever opened, redirects included (libcurl also speaks file://, gopher://,
// dict://, ...): true for those.
bool is_http_url(const std::string& url);

// `url` without "user:password@" (for messages: an HF_ENDPOINT with credentials is never echoed).
std::string url_for_messages(const std::string& url);

// The whole body in memory (API listings, HEAD).
HttpResponse http_fetch(const HttpRequest& req);

// A 2xx body goes to `sink` as it arrives, with the answer's status (200, or 206 for a Range); `sink`
// returns false to stop the transfer.
HttpResponse http_stream(const HttpRequest& req, const std::function<bool(long status, const char*, size_t)>& sink);

// urllib.parse.quote: percent-encodes all but letters, digits, "_.-~" and the characters in `safe`.
std::string url_quote(const std::string& s, const std::string& safe = "/");

// "scheme://host:port" of an absolute URL (empty for a relative one).
std::string url_origin(const std::string& url);

}  // namespace soltrain
