#include "hub/hub_download.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "hub/progress_bar.h"
#include "io/sha256.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {

constexpr int kTransferTries = 5;  // interrupted transfers resumed within one run
constexpr int kHashTries = 3;      // downloads of a blob whose bytes do not match its sha256

struct FileMeta {
  std::string commit, etag, location;
  int64_t size = -1;
};

int64_t to_int(const std::string& s) {
  try {
    return s.empty() ? -1 : std::stoll(s);
  } catch (const std::exception&) {
    return -1;
  }
}

bool is_sha256(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c); });
}

// file_download.py get_hf_file_metadata: HEAD without following redirects (but following relative ones, as
// _request_wrapper(follow_relative_redirects=True) does for renamed repositories), Accept-Encoding identity
// so Content-Length is the file's size; X-Linked-Etag / X-Linked-Size describe an LFS file behind a redirect.
FileMeta head_file(const HubClient& c, const RepoRef& r, const std::string& commit, const std::string& file) {
  std::string url = resolve_url(c, r, commit, file);
  std::vector<std::string> headers = hub_headers(c);
  headers.push_back("Accept-Encoding: identity");
  HttpResponse resp;
  for (int hop = 0; hop < 10; ++hop) {
    resp = http_fetch({url, headers, /*head=*/true, /*follow_redirects=*/false});
    const std::string loc = resp.header("location");
    if (resp.status < 300 || resp.status >= 400 || loc.empty() || !url_origin(loc).empty()) break;
    url = url_origin(url) + loc;
  }
  if (resp.status == 0 || resp.status >= 400) hub_request_failed(c, r, file, resp);
  FileMeta m;
  m.commit = resp.header("x-repo-commit");
  m.etag = normalize_etag(!resp.header("x-linked-etag").empty() ? resp.header("x-linked-etag") : resp.header("etag"));
  m.size = to_int(!resp.header("x-linked-size").empty() ? resp.header("x-linked-size") : resp.header("content-length"));
  m.location = resp.status >= 300 && !resp.header("location").empty() ? resp.header("location") : url;
  if (!is_safe_blob_name(m.etag))  // it names the blob file in the cache
    user_error(repo_kind(r.type), " ", r.id, ": the hub at ", url_for_messages(c.endpoint), " sent no usable ETag for ",
               file, " (is HF_ENDPOINT a Hugging Face hub?)");
  return m;
}

// huggingface_hub holds a FileLock (fcntl.flock on Unix) on this path while it writes the blob.
class BlobLock {
 public:
  BlobLock(const fs::path& path, const HubClient& c, const std::string& file) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd_ < 0) return;  // a read-only cache still works for one process
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    if (c.log) *c.log << "download " << file << ": waiting for another process downloading it\n";
    ::flock(fd_, LOCK_EX);
  }
  ~BlobLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

// The partial download, opened to append (or truncated): never through a symlink, and only as a regular
// file, so a link planted at blobs/<sha>.incomplete in a shared cache cannot make the download write into
// the file it points at.
std::FILE* open_partial(const fs::path& part, bool truncate) {
  const int fd =
      ::open(part.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (truncate ? O_TRUNC : O_APPEND), 0644);
  struct stat st{};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = fd < 0 ? errno : 0;
    if (fd >= 0) ::close(fd);
    user_error(part.string(), ": cannot write the download (",
               err == ELOOP ? "it is a symlink: remove it"
               : err        ? std::strerror(err)
                            : "not a regular file: remove it",
               ")");
  }
  std::FILE* f = ::fdopen(fd, "ab");
  if (!f) ::close(fd), user_error(part.string(), ": cannot write the download (", std::strerror(errno), ")");
  return f;
}

void hash_prefix(const fs::path& p, Sha256& h) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> buf(size_t(1) << 20);
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
    h.update(std::string_view(buf.data(), size_t(in.gcount())));
}

void download_blob(const HubClient& c, const RepoRef& r, const std::string& file, const FileMeta& m,
                   const fs::path& blob) {
  const fs::path part = blob.string() + ".incomplete";
  const bool check_hash = is_sha256(m.etag);
  // The token goes to the hub only: _get_metadata_or_catch_error in file_download.py drops Authorization
  // when the redirect of an LFS file leads to another netloc (its storage, with its own signed URL).
  std::vector<std::string> headers;
  if (url_origin(m.location) == url_origin(c.endpoint)) headers = hub_headers(c);
  int transfer_failures = 0, hash_failures = 0;
  for (;;) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(part, ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
      user_error(part.string(), ": cannot resume the download (a symlink or special file is there: remove it)");
    int64_t have = fs::exists(st) ? int64_t(fs::file_size(part, ec)) : 0;
    if (m.size >= 0 && have > m.size) fs::remove(part, ec), have = 0;  // not a prefix of this blob
    Sha256 hash;
    if (check_hash && have > 0) hash_prefix(part, hash);
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(open_partial(part, false), std::fclose);
    std::vector<std::string> h = headers;
    h.push_back("Accept-Encoding: identity");
    if (have > 0) h.push_back(cat("Range: bytes=", have, "-"));  // http_get's resume_size
    ProgressBar bar(c.log, c.tty, r.id + " " + file, m.size, have);
    bool first = true, write_failed = false;
    const HttpResponse resp = http_stream({m.location, h, false, true}, [&](long status, const char* d, size_t n) {
      if (first && status == 200 && have > 0) {  // the server sent the whole file, not the range
        f.reset(open_partial(part, true));
        hash = Sha256();
        have = 0;
        if (!f) {
          write_failed = true;
          return false;
        }
      }
      first = false;
      if (std::fwrite(d, 1, n, f.get()) != n) {
        write_failed = true;
        return false;
      }
      if (check_hash) hash.update(std::string_view(d, n));
      bar.add(int64_t(n));
      return true;
    });
    const bool closed = std::fflush(f.get()) == 0 && std::fclose(f.release()) == 0;
    if (write_failed || !closed)
      user_error(part.string(), ": cannot write the download (", std::strerror(errno), "; is the disk full?)");
    const int64_t now = int64_t(fs::file_size(part, ec));
    // 416: nothing left to send (the partial file was already whole).
    const bool whole_already = resp.status == 416 && m.size >= 0 && now == m.size;
    if (resp.status >= 400 && !whole_already) hub_request_failed(c, r, file, resp);
    if (!whole_already && (!resp.error.empty() || (m.size >= 0 && now != m.size))) {
      if (++transfer_failures >= kTransferTries)
        user_error(repo_kind(r.type), " ", r.id, ": downloading ", file, " failed ", kTransferTries, " times (",
                   resp.error.empty() ? cat(now, " of ", m.size, " bytes") : resp.error, "); run again to resume from ",
                   part.string());
      if (c.log)
        *c.log << "download " << file << ": interrupted at byte " << now << " ("
               << (resp.error.empty() ? "connection closed early" : resp.error) << "); resuming\n";
      continue;
    }
    if (check_hash) {
      const std::string got = hash.hex();
      if (got != m.etag) {
        fs::remove(part, ec);
        if (++hash_failures >= kHashTries)
          user_error(repo_kind(r.type), " ", r.id, ": ", file, " arrived corrupted ", kHashTries, " times (sha256 ",
                     got, ", expected ", m.etag, "); check the network or proxy and run again");
        if (c.log)
          *c.log << "download " << file << ": sha256 " << got << " does not match the hub's " << m.etag
                 << "; downloading it again\n";
        continue;
      }
    }
    bar.finish(check_hash ? "sha256 ok" : "size ok");
    fs::rename(part, blob, ec);
    if (ec) user_error(blob.string(), ": cannot move the download into place (", ec.message(), ")");
    return;
  }
}

// snapshots/<commit>/<file> → ../../blobs/<etag> as a relative link (file_download.py _create_symlink), so
// the cache can be moved; made under a temporary name and renamed, so it appears whole.
void link_snapshot(const fs::path& blob, const fs::path& pointer) {
  std::error_code ec;
  fs::create_directories(pointer.parent_path(), ec);
  const fs::path tmp = pointer.string() + cat(".tmp-", ::getpid());
  fs::remove(tmp, ec);
  fs::create_symlink(blob.lexically_relative(pointer.parent_path()), tmp, ec);
  if (!ec) fs::rename(tmp, pointer, ec);
  if (ec) user_error(pointer.string(), ": cannot link the downloaded file into the cache (", ec.message(), ")");
}

}  // namespace

fs::path hub_download_file(const HubClient& c, const RepoRef& r, const std::string& commit, const std::string& file) {
  if (!is_safe_repo_path(file))
    user_error(repo_kind(r.type), " ", r.id, ": the hub lists a file with an unsafe name: \"", file,
               "\" (it would leave the cache folder)");
  SOLTRAIN_CHECK(is_commit_hash(commit));
  const fs::path repo = repo_cache_dir(r);
  const fs::path pointer = repo / "snapshots" / commit / file;
  std::error_code ec;
  // Follows the link: a dangling one, or one to something that is not a file (a cache an earlier hostile
  // answer pointed at blobs/.), is downloaded and linked again.
  if (fs::is_regular_file(pointer, ec)) return pointer;
  const FileMeta m = head_file(c, r, commit, file);
  const fs::path blob = repo / "blobs" / m.etag;
  fs::create_directories(blob.parent_path(), ec);
  if (ec) user_error(blob.parent_path().string(), ": cannot create the cache folder (", ec.message(), ")");
  {
    BlobLock lock(hub_cache_dir() / ".locks" / repo_folder_name(r) / (m.etag + ".lock"), c, file);
    if (!fs::exists(blob, ec)) download_blob(c, r, file, m, blob);
  }
  link_snapshot(blob, pointer);
  return pointer;
}

}  // namespace soltrain
