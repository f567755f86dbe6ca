// A hostile (or broken) hub and a tampered shared cache: names from the network or a config never lead
// outside the cache, only http/https is ever opened, stalled or endless answers end in bounded time, and a
// poisoned cache heals against a healthy hub. Each case is a repro from issue 28.
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli_test_util.h"
#include "data_test_util.h"
#include "fake_hub.h"
#include "hub/hub_download.h"
#include "hub/hub_resolve.h"
#include "io/sha256.h"
#include "test_util.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
using test::FakeHub;
using test::FakeRepo;
using test::HubEnv;
using test::ScopedEnv;

const std::string kCommit = "89abcdef0123456789abcdef0123456789abcdef";

std::string read_file(const fs::path& p) {
  return test::read_bytes(p);
}

FakeRepo tiny_model() {
  return test::fixture_model_repo(kCommit);
}

// The message of the UserError `f` throws ("" when it throws none).
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// A socket that listens but never accepts: a connection made to it waits in its backlog, where poll sees it.
struct Trap {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  Trap() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0) std::abort();
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Trap() { ::close(fd); }
  bool connected() const {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 100) > 0;
  }
};

// Waits until the client closes its end (or `ms` pass), so the single-threaded fake hub is free for the
// next request as soon as the client has given up.
void wait_for_close(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  char c;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end)
    if (::poll(&p, 1, 50) > 0 && ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0) return;
}

TEST(HostileHub, RevisionsAreNamesThatStayInTheCache) {
  for (const char* bad :
       {"/tmp/victim.txt", "../../../../victim.txt", "refs/../../x", "a//b", ".", "main\n", "bad\x1b[31m", ""})
    EXPECT_FALSE(is_safe_revision(bad)) << bad;
  for (const char* good : {"main", "v1.0", "refs/pr/1", "refs/convert/parquet", kCommit.c_str()})
    EXPECT_TRUE(is_safe_revision(good)) << good;

  // A hub that answers for any revision: the one given by the config never names a file outside refs/.
  FakeHub hub;
  hub.add("models/org/m", tiny_model());
  HubEnv env(hub.endpoint());
  const fs::path victim = env.t.path / "victim.txt";
  test::write_text(victim, "the user's file\n");
  env.keep_existing();
  std::ostringstream log;
  for (const std::string& rev : {victim.string(), std::string("../../../../") + victim.filename().string()}) {
    const std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", rev); });
    EXPECT_NE(e.find("is not a branch, tag or commit name"), std::string::npos) << e;
  }
  EXPECT_EQ(read_file(victim), "the user's file\n");
  EXPECT_TRUE(hub.requests().empty());  // refused before any request

  // Offline, a revision naming a system file is refused rather than read as a ref.
  ScopedEnv offline("HF_HUB_OFFLINE", "1");
  const std::string e =
      user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "/etc/passwd"); });
  EXPECT_NE(e.find("is not a branch, tag or commit name"), std::string::npos) << e;
}

TEST(HostileHub, ConfigRevisionKeysAreChecked) {
  test::TempDir t;
  test::write_text(t.path / "cfg.yaml",
                   "base_model: org/model\nrevision: ../../../../victim.txt\noutput_dir: out\n"
                   "datasets: [x.jsonl]\n");
  const auto r = test::run("sft " + (t.path / "cfg.yaml").string(), t);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;  // one line
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("revision"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a branch, tag or commit name"), std::string::npos) << r.err;
  test::write_text(t.path / "cfg2.yaml",
                   "model: m\noutput_dir: out\ndatasets:\n  - path: org/data\n    revision: /etc/passwd\n");
  const auto d = test::run("sft " + (t.path / "cfg2.yaml").string(), t);
  EXPECT_EQ(d.code, 2) << d.err;
  EXPECT_EQ(d.err.rfind("error: ", 0), 0u) << d.err;
  EXPECT_EQ(std::count(d.err.begin(), d.err.end(), '\n'), 1) << d.err;
  EXPECT_NE(d.err.find("a branch, tag or commit name"), std::string::npos) << d.err;
}

TEST(HostileHub, CorruptRefsAreRefusedInOneLine) {
  FakeHub hub;
  HubEnv env(hub.endpoint());
  ScopedEnv offline("HF_HUB_OFFLINE", "1");
  const fs::path refs = env.cache_dir() / "models--org--m" / "refs";
  fs::create_directories(refs);
  std::ostringstream log;
  for (const std::string& content : {std::string("../../../../etc"), std::string("/etc/passwd"),
                                     std::string("0123\0abc", 8), std::string(100000, 'a')}) {
    test::write_text(refs / "main", content);
    test::InputsGuard unchanged;  // the refused ref, and all else there, as it was
    unchanged.arm({env.t.path}, /*allow_new=*/true);
    const std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
    EXPECT_NE(e.find("holds no commit hash"), std::string::npos) << e;
  }
  // A FIFO there would block the read forever: refused as not a regular file.
  fs::remove(refs / "main");
  ASSERT_EQ(::mkfifo((refs / "main").c_str(), 0600), 0);
  const std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
  EXPECT_NE(e.find("not a regular file (a FIFO)"), std::string::npos) << e;
}

TEST(HostileHub, OnlyHttpIsOpenedRedirectsIncluded) {
  Trap trap;
  for (const char* scheme : {"gopher", "dict", "file", "ftp"}) {
    FakeHub hub;
    hub.add("models/org/m", tiny_model());
    HubEnv env(hub.endpoint());
    const std::string target = std::string(scheme) + "://127.0.0.1:" + std::to_string(trap.port) + "/x";
    hub.intercept = [&](int fd, const std::string&, const std::string& path) {
      if (path.find("/resolve/") == std::string::npos) return false;
      return FakeHub::send_raw(fd, "HTTP/1.1 302 Found\r\nLocation: " + target + "\r\nX-Repo-Commit: " + kCommit +
                                       "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    };
    std::ostringstream log;
    const std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
    EXPECT_FALSE(e.empty()) << scheme;
    EXPECT_FALSE(trap.connected()) << scheme << " was opened";
  }
  // HF_ENDPOINT itself.
  for (const char* endpoint : {"file:///etc", "gopher://127.0.0.1:1", "127.0.0.1:8080"}) {
    HubEnv env(endpoint);
    std::ostringstream log;
    const std::string e = user_error_of([&] { hub_client_from_env(log, false); });
    EXPECT_NE(e.find("not an http:// or https:// URL"), std::string::npos) << e;
  }
}

TEST(HostileHub, CredentialsInTheEndpointAreNeverEchoed) {
  Trap trap;  // accepts nothing: the listing's low-speed window cuts it
  const std::string endpoint = "http://user:s3cret@127.0.0.1:" + std::to_string(trap.port);
  HubEnv env(endpoint);
  ScopedEnv timeout("HF_HUB_DOWNLOAD_TIMEOUT", "1");
  std::ostringstream log;
  const std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
  EXPECT_FALSE(e.empty());
  EXPECT_EQ(e.find("s3cret"), std::string::npos) << e;
  EXPECT_EQ(url_for_messages(endpoint), "http://***@127.0.0.1:" + std::to_string(trap.port));
}

TEST(HostileHub, PlantedSymlinkAtTheIncompleteFileIsNotFollowed) {
  FakeHub hub;
  hub.add("models/org/m", tiny_model());
  HubEnv env(hub.endpoint());
  const std::string sha = sha256_hex(tiny_model().files.at("model.safetensors"));
  const fs::path blobs = env.cache_dir() / "models--org--m" / "blobs";
  fs::create_directories(blobs);
  const fs::path victim = env.t.path / "victim.bin";
  test::write_text(victim, "precious");
  fs::create_symlink(victim, blobs / (sha + ".incomplete"));
  std::ostringstream log;
  const std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
  EXPECT_NE(e.find("a symlink or special file is there: remove it"), std::string::npos) << e;
  EXPECT_EQ(read_file(victim), "precious");
}

TEST(HostileHub, EtagsThatAreNotNamesAreRefusedAndAPoisonedCacheHeals) {
  FakeHub hub;
  hub.add("models/org/m", tiny_model());
  HubEnv env(hub.endpoint());
  for (const char* etag : {".", "..", "../x", "a/b"}) {
    hub.intercept = [&](int fd, const std::string&, const std::string& path) {
      if (!path.ends_with("/config.json")) return false;
      return FakeHub::send_raw(fd, std::string("HTTP/1.1 200 OK\r\nETag: \"") + etag + "\"\r\nX-Repo-Commit: " +
                                       kCommit + "\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
    };
    std::ostringstream log;
    const std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
    EXPECT_NE(e.find("sent no usable ETag"), std::string::npos) << etag << ": " << e;
  }
  // What an earlier version left from an ETag of ".": snapshots/<c>/config.json -> ../../blobs/. (a folder).
  const fs::path snap = env.cache_dir() / "models--org--m" / "snapshots" / kCommit;
  fs::create_directories(snap);
  fs::create_symlink("../../blobs/.", snap / "config.json");
  hub.intercept = nullptr;
  std::ostringstream log;
  const fs::path dir = resolve_hub_model(hub_client_from_env(log, false), "org/m", "main");
  EXPECT_EQ(read_file(dir / "config.json"), tiny_model().files.at("config.json"));
}

TEST(HostileHub, OddFileNamesElsewhereInTheRepoDoNotRefuseIt) {
  FakeHub hub;
  FakeRepo r = tiny_model();
  r.files["docs/v1..v2-changes.md"] = "x";
  r.files["notes\nwith\x1b[31mescapes.md"] = "y";
  hub.add("models/org/m", r);
  HubEnv env(hub.endpoint());
  std::ostringstream log;
  const fs::path dir = resolve_hub_model(hub_client_from_env(log, false), "org/m", "main");
  EXPECT_TRUE(fs::is_regular_file(dir / "model.safetensors"));
  // A data file the run would read, with an escape sequence in its name: refused, never used as a path.
  FakeRepo d;
  d.commit = kCommit;
  d.files["train\x1b]0;owned\x07.jsonl"] = "{\"text\": \"a\"}\n";
  hub.add("datasets/org/d", d);
  const std::string e = user_error_of([&] { resolve_hub_dataset(hub_client_from_env(log, false), "org/d", "main"); });
  EXPECT_NE(e.find("unsafe name"), std::string::npos) << e;
}

TEST(HostileHub, StalledAndEndlessAnswersEndInBoundedTime) {
  FakeHub hub;
  hub.add("models/org/m", tiny_model());
  HubEnv env(hub.endpoint());
  ScopedEnv timeout("HF_HUB_DOWNLOAD_TIMEOUT", "1");
  std::ostringstream log;
  // An endless file list: cut at the body cap.
  hub.intercept = [&](int fd, const std::string&, const std::string& path) {
    if (path.rfind("/api/", 0) != 0) return false;
    FakeHub::send_raw(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n[");
    const std::string chunk(1 << 20, ' ');
    for (int i = 0; i < 200 && FakeHub::send_raw(fd, chunk); ++i) {
    }
    return true;
  };
  auto start = std::chrono::steady_clock::now();
  std::string e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
  EXPECT_NE(e.find("did not arrive whole"), std::string::npos) << e;
  EXPECT_NE(e.find("larger than 64 MiB"), std::string::npos) << e;
  // A file list that stops halfway with status 200: not read as "not a hub".
  hub.intercept = [&](int fd, const std::string&, const std::string& path) {
    if (path.rfind("/api/", 0) != 0) return false;
    FakeHub::send_raw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{\"sha\": ");
    wait_for_close(fd, 5000);  // the client gives up first
    return true;
  };
  e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
  EXPECT_NE(e.find("did not arrive whole"), std::string::npos) << e;
  // A download trickling a byte every 0.2 s: cut by the low-speed window, resumed, then given up on.
  hub.intercept = [&](int fd, const std::string& method, const std::string& path) {
    if (!path.ends_with("/config.json") || method != "GET") return false;
    FakeHub::send_raw(fd, std::string("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n"));
    for (int i = 0; i < 30 && FakeHub::send_raw(fd, " "); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return true;
  };
  e = user_error_of([&] { resolve_hub_model(hub_client_from_env(log, false), "org/m", "main"); });
  EXPECT_NE(e.find("failed 5 times"), std::string::npos) << "[" << e << "] " << log.str();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

}  // namespace
}  // namespace soltrain
