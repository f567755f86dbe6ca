// Talking to the hub the way huggingface_hub does: where (HF_ENDPOINT), as whom (HF_TOKEN), and what a
// refused request means for the user (one line: the repository, the status, what to do).
#pragma once
#include <optional>
#include <ostream>
#include <string>

#include "hub/http.h"
#include "hub/hub_cache.h"

namespace soltrain {

struct HubClient {
  std::string endpoint = "https://huggingface.co";  // constants.py ENDPOINT, from HF_ENDPOINT
  std::optional<std::string> token;                 // HF_TOKEN (or the token file huggingface-cli login wrote)
  std::ostream* log = nullptr;                      // progress and notes
  bool tty = false;                                 // progress redrawn in place rather than printed as lines
};

// From HF_ENDPOINT and HF_TOKEN, else the file at HF_TOKEN_PATH, else HF_HOME/token (constants.py
// HF_TOKEN_PATH; huggingface_hub.utils._auth.get_token reads the same places in the same order).
HubClient hub_client_from_env(std::ostream& log, bool tty);

// Headers of every hub request (utils/_headers.py build_hf_headers): Authorization: Bearer <token>.
std::vector<std::string> hub_headers(const HubClient& c);

// The URL of a file (file_download.py hf_hub_url): {endpoint}/[datasets/]{id}/resolve/{revision}/{file}.
std::string resolve_url(const HubClient& c, const RepoRef& r, const std::string& revision, const std::string& file);

// Throws a UserError naming the repository, the answer and what to do, for an answer that is not 2xx/3xx
// (utils/_http.py hf_raise_for_status reads X-Error-Code the same way) or a failed connection.
// `what` is the file or listing asked for.
[[noreturn]] void hub_request_failed(const HubClient& c, const RepoRef& r, const std::string& what,
                                     const HttpResponse& resp);

}  // namespace soltrain
