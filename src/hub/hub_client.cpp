#include "hub/hub_client.h"

#include <cstdlib>
#include <fstream>

#include "core/error.h"
#include "io/input_file.h"

namespace soltrain {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string read_token_file(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return "";
  refuse_special_file(p, "the Hugging Face token file");  // a FIFO there would block every run
  std::ifstream in(p);
  std::string t;
  in.width(4096);  // a token is ~40 characters; a huge file is not read whole
  in >> t;
  return t;
}

}  // namespace

HubClient hub_client_from_env(std::ostream& log, bool tty) {
  HubClient c;
  if (!env("HF_ENDPOINT").empty()) c.endpoint = env("HF_ENDPOINT");
  while (c.endpoint.ends_with("/")) c.endpoint.pop_back();  // constants.py: .rstrip("/")
  if (!is_http_url(c.endpoint))
    user_error("HF_ENDPOINT=", url_for_messages(c.endpoint),
               ": not an http:// or https:// URL (only the hub's HTTP API is spoken)");
  std::string token = env("HF_TOKEN");
  if (token.empty()) {
    const std::filesystem::path file =
        env("HF_TOKEN_PATH").empty() ? hf_home() / "token" : std::filesystem::path(env("HF_TOKEN_PATH"));
    token = read_token_file(file);
  }
  if (!token.empty()) c.token = token;
  c.log = &log;
  c.tty = tty;
  return c;
}

std::vector<std::string> hub_headers(const HubClient& c) {
  std::vector<std::string> h;
  if (c.token) h.push_back("Authorization: Bearer " + *c.token);
  return h;
}

std::string resolve_url(const HubClient& c, const RepoRef& r, const std::string& revision, const std::string& file) {
  // hf_hub_url quotes the revision with safe="" (refs/pr/1 → refs%2Fpr%2F1) and the file name with the
  // default safe="/".
  return c.endpoint + "/" + (r.type == RepoType::kDataset ? "datasets/" : "") + r.id + "/resolve/" +
         url_quote(revision, "") + "/" + url_quote(file);
}

void hub_request_failed(const HubClient& c, const RepoRef& r, const std::string& what, const HttpResponse& resp) {
  const std::string name = cat(repo_kind(r.type), " ", r.id);
  if (resp.status == 0)
    user_error(name, ": cannot reach ", url_for_messages(c.endpoint), " (", resp.error,
               "); check the network (or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 to use only the local cache");
  const std::string code = resp.header("x-error-code");
  const std::string on = cat(" (", what, ", HTTP ", resp.status, code.empty() ? "" : ", " + code, ")");
  if (code == "GatedRepo")
    user_error(name, ": the repository is gated", on, ": accept its conditions on ", url_for_messages(c.endpoint), "/",
               r.type == RepoType::kDataset ? "datasets/" : "", r.id, " and set HF_TOKEN to a token of that account");
  if (code == "RevisionNotFound")
    user_error(name, ": revision \"", r.revision, "\" not found", on, ": check the `revision:` key");
  if (code == "EntryNotFound") user_error(name, ": ", what, " is not in the repository", on);
  if (resp.status == 401 || resp.status == 403)
    user_error(name, ": access refused", on, ": ",
               c.token ? "HF_TOKEN was sent: check that it has access to this repository and the id's spelling"
                       : "the repository is private, gated or misspelled: set HF_TOKEN to a token with access "
                         "(huggingface.co/settings/tokens) and check the id's spelling");
  if (resp.status == 404)
    user_error(name, ": not found on ", url_for_messages(c.endpoint), on, ": check the spelling of the id",
               r.revision == "main" ? "" : " and the revision", " (a local folder of that name does not exist either)");
  user_error(name, ": the hub answered HTTP ", resp.status, on, "; try again later");
}

}  // namespace soltrain
