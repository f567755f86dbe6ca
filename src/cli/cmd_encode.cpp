// `soltrain encode`: JSON lines {"text": ...} on stdin → {"ids": [...]} lines on stdout, with a tokenizer.json.
// Lines are encoded in parallel by one shared tokenizer (its caches are per thread) and written in input
// order, a batch of lines at a time so memory stays bounded on big inputs.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

namespace {
// Encodes one input line into its output line; errors name the line number.
std::string encode_line(Tokenizer& tok, const std::string& line, size_t n) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    user_error("stdin line ", n, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
    user_error("stdin line ", n, ": expected an object with a string field \"text\"");
  const std::vector<int32_t> ids = tok.encode(j["text"].get_ref<const std::string&>());
  // Written by hand: much faster than building a json array for every line.
  std::string out = "{\"ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  return out + "]}\n";
}
}  // namespace

std::function<int()> add_encode_command(CLI::App& app) {
  struct Opts {
    std::string tokenizer;
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("encode", "tokenize JSON lines {\"text\": ...} from stdin into {\"ids\": [...]}");
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json or a model folder holding one")->required();
  c->add_option("--threads", o->threads, "encoding threads (default: all cores)")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  return [o]() {
    Tokenizer tok = Tokenizer::load(o->tokenizer);
    std::vector<std::exception_ptr> errors(o->threads);

    std::ios::sync_with_stdio(false);
    constexpr size_t kBatch = 16384;
    std::vector<std::string> lines, outs;
    std::vector<size_t> numbers;
    size_t n = 0;
    for (bool more = true; more;) {
      lines.clear();
      numbers.clear();
      std::string line;
      while (lines.size() < kBatch && (more = bool(std::getline(std::cin, line)))) {
        ++n;
        if (line.empty()) continue;
        lines.push_back(std::move(line));
        numbers.push_back(n);
      }
      outs.assign(lines.size(), {});
      std::vector<size_t> failed_at(o->threads, SIZE_MAX);
      {
        std::vector<std::jthread> workers;
        for (unsigned t = 0; t < o->threads; ++t)
          workers.emplace_back([&, t] {
            size_t i = t;
            try {
              for (; i < lines.size(); i += o->threads) outs[i] = encode_line(tok, lines[i], numbers[i]);
            } catch (...) {
              errors[t] = std::current_exception();
              failed_at[t] = i;
            }
          });
      }
      // Report the error of the earliest line, whichever thread found it.
      const auto first = std::min_element(failed_at.begin(), failed_at.end());
      if (*first != SIZE_MAX) std::rethrow_exception(errors[size_t(first - failed_at.begin())]);
      for (const std::string& s : outs) std::cout << s;
    }
    std::cout.flush();
    if (!std::cout) user_error("stdout: write failed");
    return 0;
  };
}

}  // namespace soltrain
