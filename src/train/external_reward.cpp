#include "train/external_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hub/http.h"

namespace soltrain {

namespace {

constexpr const char* kCommand = "command:";
constexpr size_t kMaxAnswer = size_t(64) << 20;  // an endless answer must not fill memory

bool starts_with(const std::string& s, const char* p) {
  return s.rfind(p, 0) == 0;
}

std::string shown(const std::string& spec) {
  return starts_with(spec, kCommand) ? spec : url_for_messages(spec);
}

// The command's stdout for `input` on its stdin, written and read together (a command may answer before it has
// read everything: neither side waits on a full pipe), within `timeout_s`. Its stdin is a socket, so a command
// that exits without reading it is an error on send (MSG_NOSIGNAL), not a SIGPIPE for this process (the Python
// module's host may not ignore it). It runs in a process group of its own, killed whole at the timeout.
std::string run_command(const std::string& spec, const std::string& input, int timeout_s) {
  const std::string cmd = spec.substr(std::strlen(kCommand));
  int in[2], out[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
    user_error("reward_funcs: ", spec, ": cannot start it (", std::strerror(errno), ")");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(in[0], 0), ::dup2(out[1], 1);
    ::signal(SIGPIPE, SIG_DFL);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::setpgid(pid, pid);  // (both sides: whichever runs first)
  ::close(in[0]), ::close(out[1]);
  std::string answer;
  size_t sent = 0;
  bool too_long = false, timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int to = in[1], from = out[0];
  if (input.empty()) ::close(to), to = -1;
  while (from >= 0) {
    pollfd p[2] = {{from, POLLIN, 0}, {to, POLLOUT, 0}};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    if (::poll(p, to >= 0 ? 2 : 1, int(std::min<int64_t>(left.count(), 1000))) < 0 && errno != EINTR) break;
    if (to >= 0 && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = ::send(to, input.data() + sent, input.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) sent += size_t(w);
      if (sent == input.size() || (w < 0 && errno != EAGAIN && errno != EINTR)) ::close(to), to = -1;  // done, or
      // the command stopped reading (its answer decides)
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      const ssize_t r = ::read(from, buf, sizeof buf);
      if (r > 0) {
        answer.append(buf, size_t(r));
        if (answer.size() > kMaxAnswer) {
          too_long = true;
          break;
        }
      } else if (r == 0 || errno != EINTR) {
        ::close(from), from = -1;
      }
    }
  }
  if (to >= 0) ::close(to);
  if (from >= 0) ::close(from);
  if (timed_out || too_long) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) user_error("reward_funcs: ", spec, " did not answer within ", timeout_s, " s (reward_timeout)");
  if (too_long) user_error("reward_funcs: ", spec, " answered more than 64 MiB");
  if (WIFSIGNALED(status))
    user_error("reward_funcs: ", spec, " was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
               ")");
  if (WEXITSTATUS(status) != 0)
    user_error("reward_funcs: ", spec, " exited with code ", WEXITSTATUS(status),
               WEXITSTATUS(status) == 127 ? " (command not found?)" : "", "; its messages are above");
  return answer;
}

std::string post(const std::string& spec, const std::string& body, int timeout_s) {
  HttpRequest req;
  req.url = spec;
  req.method = "POST";
  req.body = body;
  req.headers = {"Content-Type: application/json", "Accept: application/json"};
  req.timeout_s = timeout_s;
  req.max_body = kMaxAnswer;
  const HttpResponse r = http_fetch(req);
  if (r.status == 0)
    user_error("reward_funcs: ", shown(spec), ": ", r.error.empty() ? std::string("no answer") : r.error,
               " (reward_timeout ", timeout_s, " s)");
  if (r.status < 200 || r.status >= 300)
    user_error("reward_funcs: ", shown(spec), " answered HTTP ", r.status, ": ", r.body.substr(0, 200));
  if (!r.error.empty()) user_error("reward_funcs: ", shown(spec), ": ", r.error);
  return r.body;
}

}  // namespace

bool is_external_reward(const std::string& spec) {
  return starts_with(spec, "http://") || starts_with(spec, "https://") || starts_with(spec, kCommand);
}

void check_external_reward(const std::string& spec) {
  if (starts_with(spec, kCommand)) {
    if (spec.find_first_not_of(" \t", std::strlen(kCommand)) == std::string::npos)
      user_error("reward_funcs: \"", spec, "\" names no command");
  } else if (!is_http_url(spec)) {
    user_error("reward_funcs: \"", url_for_messages(spec), "\" is not an http(s) URL");
  }
}

std::string external_reward_name(const std::string& spec) {
  if (starts_with(spec, kCommand)) {
    std::string cmd = spec.substr(std::strlen(kCommand));
    while (!cmd.empty() && std::isspace(static_cast<unsigned char>(cmd.back()))) cmd.pop_back();
    const size_t space = cmd.find_last_of(" \t");
    const std::string stem = std::filesystem::path(cmd.substr(space == std::string::npos ? 0 : space + 1)).stem();
    return stem.empty() ? "command" : stem;
  }
  std::string rest = spec.substr(spec.find("://") + 3);
  rest = rest.substr(0, rest.find_first_of("?#"));
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t slash = rest.rfind('/');
  if (slash != std::string::npos) return rest.substr(slash + 1);
  const size_t at = rest.rfind('@');  // (credentials are no name)
  return rest.substr(at == std::string::npos ? 0 : at + 1);
}

std::vector<double> parse_reward_answer(const std::string& spec, const std::string& answer, size_t n) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(answer);
  } catch (const std::exception&) {
    user_error("reward_funcs: ", shown(spec), " answered something that is not JSON: ", answer.substr(0, 200));
  }
  if (j.is_object() && j.contains("rewards")) j = j["rewards"];
  if (!j.is_array())
    user_error("reward_funcs: ", shown(spec), " answered ", j.dump().substr(0, 200),
               ": expected a list of numbers (or {\"rewards\": [...]})");
  if (j.size() != n)
    user_error("reward_funcs: ", shown(spec), " answered ", j.size(), " values for ", n, " completions");
  std::vector<double> out;
  for (const auto& x : j) {
    if (!x.is_null() && !x.is_number())
      user_error("reward_funcs: ", shown(spec), " answered ", x.dump().substr(0, 100),
                 " among its scores: expected numbers or null");
    out.push_back(x.is_null() ? std::numeric_limits<double>::quiet_NaN() : x.get<double>());
  }
  return out;
}

std::vector<double> external_reward(const std::string& spec, const std::string& request_json, size_t n, int timeout_s) {
  const std::string answer =
      starts_with(spec, kCommand) ? run_command(spec, request_json, timeout_s) : post(spec, request_json, timeout_s);
  return parse_reward_answer(spec, answer, n);
}

}  // namespace soltrain
