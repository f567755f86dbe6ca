// `soltrain serve --model M [--adapter A]`: an OpenAI-compatible HTTP endpoint on localhost for quick evaluation
// (what vLLM's `serve` answers, for the clients and eval tools that speak it): /v1/models, /v1/chat/completions
// (messages through the model's chat template) and /v1/completions, with or without `stream`. A request's n
// choices are decoded as one batch; requests are answered one at a time (the model is one).
#include <httplib.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>

#include "cli/chat_model.h"
#include "cli/commands.h"
#include "cli/device_option.h"
#include "cli/hub_inputs.h"
#include "core/error.h"
#include "tokenizer/stop_strings.h"

namespace soltrain {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

httplib::Server* g_server = nullptr;

// What one request asks for, read as the OpenAI API defines it (temperature 1 unless given, as OpenAI and vLLM).
struct Ask {
  GenerationOptions gen;
  int n = 1;
  bool stream = false;
  std::vector<std::string> stop;
};

Ask read_ask(const json& body, ChatModel& m, size_t prompt_tokens) {
  Ask a;
  a.gen.sampling.temperature = float(body.value("temperature", 1.0));
  a.gen.sampling.top_p = float(body.value("top_p", 1.0));
  // vLLM's extra sampling parameters, which OpenAI clients pass through `extra_body`.
  a.gen.sampling.top_k = std::max(0, body.value("top_k", 0));  // vLLM's "all" is -1
  a.gen.sampling.min_p = float(body.value("min_p", 0.0));
  a.gen.sampling.repetition_penalty = float(body.value("repetition_penalty", 1.0));
  a.gen.sampling.seed =
      body.contains("seed") && body["seed"].is_number_integer() ? body["seed"].get<uint64_t>() : std::random_device{}();
  const json& max =
      body.contains("max_completion_tokens") ? body["max_completion_tokens"] : body.value("max_tokens", json());
  a.gen.max_new_tokens = max.is_number_integer() ? max.get<int>() : m.room(prompt_tokens);
  a.n = body.value("n", 1);
  if (a.n < 1 || a.n > 64) user_error("n ", a.n, ": expected 1 to 64");
  a.stream = body.value("stream", false);
  if (body.contains("stop") && body["stop"].is_string()) a.stop.push_back(body["stop"]);
  if (body.contains("stop") && body["stop"].is_array())
    for (const auto& s : body["stop"])
      if (s.is_string() && !s.get<std::string>().empty()) a.stop.push_back(s);
  return a;
}

// A choice's text and why it ended: an end-of-sequence token or a stop string ("stop"), or the budget ("length").
std::pair<std::string, std::string> finish(ChatModel& m, const std::vector<int32_t>& ids, const Ask& a) {
  std::string text = m.text(ids);
  bool stopped = !ids.empty() && std::find(m.eos().begin(), m.eos().end(), ids.back()) != m.eos().end();
  for (const std::string& s : a.stop)
    if (const size_t at = text.find(s); at != std::string::npos) text.resize(at), stopped = true;
  return {text, stopped ? "stop" : "length"};
}

std::string request_id(const char* prefix) {
  static std::mt19937_64 rng(std::random_device{}());
  char b[40];
  std::snprintf(b, sizeof b, "%s-%016llx", prefix, static_cast<unsigned long long>(rng()));
  return b;
}

// The content of a chat message: a string, or OpenAI's list of parts (their text joined).
json plain_messages(const json& messages) {
  if (!messages.is_array()) user_error("messages: expected a list of {role, content}");
  json out = json::array();
  for (const json& msg : messages) {
    json one = msg;
    if (msg.contains("content") && msg["content"].is_array()) {
      std::string text;
      for (const json& part : msg["content"])
        if (part.value("type", "") == "text") text += part.value("text", "");
      one["content"] = text;
    }
    out.push_back(one);
  }
  return out;
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(
      json{{"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}}}}
          .dump(),
      "application/json");
}

}  // namespace

std::function<int()> add_serve_command(CLI::App& app) {
  struct Opts {
    std::string model, adapter, host = "127.0.0.1", name, device = "cpu";
    int port = 8000;
    bool enable_thinking = true;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(
      "serve", "an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions) for quick evaluation");
  c->add_option("--model", o->model, "Hugging Face model folder or hub id (Org/Name)")->required();
  c->add_option("--adapter", o->adapter, "PEFT LoRA adapter folder applied on top of the model");
  c->add_option("--host", o->host, "address to listen on (localhost by default: nothing else reaches it)")
      ->capture_default_str();
  c->add_option("--port", o->port, "port to listen on; 0 picks a free one (printed)")->capture_default_str();
  c->add_option("--served-model-name", o->name, "the model's name in the API (default: --model as given)");
  c->add_option("--enable-thinking", o->enable_thinking, "the chat template variable enable_thinking")
      ->capture_default_str();
  add_device_option(c, o->device);
  return [o]() {
    if (o->port < 0 || o->port > 65535) user_error("--port ", o->port, ": expected 0 to 65535");
    const std::string name = o->name.empty() ? o->model : o->name;
    ChatModel m(local_or_hub_model(o->model, std::cerr), o->adapter, o->device);
    std::mutex one_at_a_time;
    httplib::Server svr;
    const auto created = [] {
      return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
    svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(
          json{{"object", "list"},
               {"data", {{{"id", name}, {"object", "model"}, {"created", created()}, {"owned_by", "soltrain"}}}}}
              .dump(),
          "application/json");
    });
    // One handler for both APIs: `chat` renders messages through the template, else `prompt` is the text.
    auto answer = [&](bool chat, const httplib::Request& req, httplib::Response& res) {
      try {
        const json body = json::parse(req.body, nullptr, false);
        if (!body.is_object()) return send_error(res, 400, "the request body is not a JSON object");
        std::lock_guard<std::mutex> l(one_at_a_time);
        std::vector<int32_t> prompt;
        if (chat) {
          prompt = m.chat_prompt(plain_messages(body.value("messages", json())), o->enable_thinking);
        } else {
          if (!body.contains("prompt") || !body["prompt"].is_string()) user_error("prompt: expected a string");
          prompt = m.encode(body["prompt"].get<std::string>());
        }
        Ask a = read_ask(body, m, prompt.size());
        // A row ends at the token completing a stop string (the text is cut before it below, as OpenAI's is)
        const StopStrings stop(m.tokenizer(), a.stop, "stop");
        a.gen.stop_after = stop.stop_after();
        const std::vector<std::vector<int32_t>> outs = m.complete(prompt, a.n, a.gen);
        const std::string id = request_id(chat ? "chatcmpl" : "cmpl");
        json choices = json::array();
        size_t completion_tokens = 0;
        for (size_t i = 0; i < outs.size(); ++i) {
          const auto [text, why] = finish(m, outs[i], a);
          completion_tokens += outs[i].size();
          json ch = {{"index", i}};
          if (a.stream)
            ch[chat ? "delta" : "text"] = chat ? json{{"role", "assistant"}, {"content", text}} : json(text);
          else if (chat)
            ch["message"] = {{"role", "assistant"}, {"content", text}};
          else
            ch["text"] = text;
          ch["logprobs"] = nullptr;
          ch["finish_reason"] = why;
          choices.push_back(ch);
        }
        const json usage = {{"prompt_tokens", prompt.size()},
                            {"completion_tokens", completion_tokens},
                            {"total_tokens", prompt.size() + completion_tokens}};
        const char* object = chat ? (a.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
        json reply = {{"id", id}, {"object", object}, {"created", created()}, {"model", name}, {"choices", choices}};
        if (!a.stream) {
          reply["usage"] = usage;
          return res.set_content(reply.dump(), "application/json");
        }
        // Server-sent events: the answer (generated whole) in one chunk, then the end marker.
        reply["usage"] = usage;
        res.set_content("data: " + reply.dump() + "\n\ndata: [DONE]\n\n", "text/event-stream");
      } catch (const UserError& e) {
        send_error(res, 400, e.what());
      } catch (const std::exception& e) {
        send_error(res, 500, std::string("internal error: ") + e.what());
      }
    };
    svr.Post("/v1/chat/completions", [&](const httplib::Request& q, httplib::Response& r) { answer(true, q, r); });
    svr.Post("/v1/completions", [&](const httplib::Request& q, httplib::Response& r) { answer(false, q, r); });
    const int port = o->port == 0 ? svr.bind_to_any_port(o->host) : (svr.bind_to_port(o->host, o->port) ? o->port : -1);
    if (port < 0) user_error("serve: cannot listen on ", o->host, ":", o->port, " (in use, or not an address here)");
    g_server = &svr;
    std::signal(SIGINT, [](int) { g_server->stop(); });
    std::signal(SIGTERM, [](int) { g_server->stop(); });
    std::cerr << "serve: " << name << " on http://" << o->host << ":" << port
              << "/v1 (OpenAI API: chat/completions, completions, models); Ctrl-C stops\n"
              << std::flush;
    svr.listen_after_bind();
    g_server = nullptr;
    return 0;
  };
}

}  // namespace soltrain
