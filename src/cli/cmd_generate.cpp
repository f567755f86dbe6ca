// `soltrain generate`: text from a model (optionally with a PEFT LoRA adapter) through the KV-cache
// decoder, greedy or sampled, streamed to stdout as it is produced; --chat renders the model's template.
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/chat_model.h"
#include "cli/commands.h"
#include "cli/device_option.h"
#include "cli/hub_inputs.h"
#include "core/error.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "model/generation.h"
#include "model/peft_adapter.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace soltrain {

namespace {

// A full disk (> /dev/full) or a reader that went away (| head -c1; SIGPIPE is ignored in main) ends the
// run with one line, as encode and chat-template do, instead of generating on into nowhere.
void check_stdout() {
  if (!std::cout) user_error("stdout: write failed (", std::strerror(errno), ")");
}

}  // namespace

namespace {
// --input: every line's prompt (a text, or messages through the chat template) answered, `batch` lines generated
// together (line i of a batch sampling with seed + i), as JSON lines in the input's order.
int generate_file(const std::filesystem::path& input, const std::filesystem::path& model, const std::string& adapter,
                  const std::string& device, const GenerationOptions& g, bool enable_thinking, int batch) {
  if (g.max_new_tokens < 1) user_error("--max-new-tokens ", g.max_new_tokens, ": expected >= 1");
  if (batch < 1) user_error("--batch-size ", batch, ": expected >= 1");
  std::ifstream in(input);
  if (!in) user_error(input.string(), ": cannot read");
  ChatModel m(model, adapter, device);
  std::vector<std::vector<int32_t>> prompts;
  int64_t index = 0;
  auto flush = [&] {
    if (prompts.empty()) return;
    for (const std::vector<int32_t>& out : m.complete_each(prompts, g)) {
      const bool eos = !out.empty() && std::find(m.eos().begin(), m.eos().end(), out.back()) != m.eos().end();
      std::cout << nlohmann::ordered_json{{"index", index++},
                                          {"text", m.text(out)},
                                          {"finish_reason", eos ? "stop" : "length"}}
                       .dump()
                << "\n"
                << std::flush;
      check_stdout();
    }
    prompts.clear();
  };
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
    const std::string where = cat(input.string(), ":", n);
    if (!j.is_object() || (j.contains("prompt") == j.contains("messages")))
      user_error(where, ": expected {\"prompt\": TEXT} or {\"messages\": [{\"role\", \"content\"}, ...]}");
    try {
      prompts.push_back(j.contains("prompt") ? m.encode(j["prompt"].get<std::string>())
                                             : m.chat_prompt(j["messages"], enable_thinking));
    } catch (const nlohmann::json::exception&) {
      user_error(where, ": \"prompt\" must be a string");
    }
    if (prompts.back().empty()) user_error(where, ": the prompt is empty");
    if (int(prompts.size()) == batch) flush();
  }
  flush();
  return 0;
}
}  // namespace

std::function<int()> add_generate_command(CLI::App& app) {
  struct Opts {
    std::string model, adapter, prompt, chat, input, device = "cpu";
    bool enable_thinking = true, print_ids = false;
    int max_new_tokens = 256, batch_size = 32;
    SamplingParams sampling;
    std::vector<std::string> stop;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("generate", "generate text with a KV cache (greedy or sampled), streamed to stdout");
  c->add_option("--model", o->model, "Hugging Face model folder (with tokenizer.json) or hub id (Org/Name)")
      ->required();
  c->add_option("--adapter", o->adapter, "PEFT LoRA adapter folder applied on top of the model");
  c->add_option("--prompt", o->prompt, "text to continue (encoded without special tokens)");
  c->add_option("--chat", o->chat, "a user message, rendered through the model's chat template");
  c->add_option("--input", o->input,
                "a JSONL file of {\"prompt\": TEXT} or {\"messages\": [...]} lines: one JSON line "
                "{\"index\", \"text\", \"finish_reason\"} each on stdout");
  c->add_option("--batch-size", o->batch_size, "with --input: how many prompts are generated together")
      ->capture_default_str();
  c->add_option("--enable-thinking", o->enable_thinking, "the template variable enable_thinking with --chat")
      ->capture_default_str();
  c->add_option("--max-new-tokens", o->max_new_tokens, "stop after this many new tokens")->capture_default_str();
  c->add_option("--temperature", o->sampling.temperature, "0 = greedy; otherwise sample from softmax(logits / T)")
      ->capture_default_str();
  c->add_option("--top-k", o->sampling.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  c->add_option("--top-p", o->sampling.top_p, "sample within the smallest set of mass >= p")->capture_default_str();
  c->add_option("--min-p", o->sampling.min_p, "drop tokens below min_p x the likeliest's probability (0 = off)")
      ->capture_default_str();
  c->add_option("--repetition-penalty", o->sampling.repetition_penalty,
                "divide the logits of tokens already in the text by this (multiply when negative; 1 = off)")
      ->capture_default_str();
  c->add_option("--seed", o->sampling.seed, "random seed of the sampler")->capture_default_str();
  c->add_option("--stop", o->stop,
                "end at the token that completes this text (kept, as transformers' stop_strings; repeatable)");
  c->add_flag("--print-ids", o->print_ids, "print the new token ids (one line) instead of text (reference checks)");
  add_device_option(c, o->device);
  return [o, c]() {
    const bool has_prompt = c->count("--prompt") > 0, has_chat = c->count("--chat") > 0;
    if (!o->input.empty()) {
      if (has_prompt || has_chat || o->print_ids) user_error("generate: --input takes the prompts from its file alone");
      if (!o->stop.empty()) user_error("generate: --stop is for --prompt or --chat (not --input yet)");
      return generate_file(o->input, local_or_hub_model(o->model, std::cerr), o->adapter, o->device,
                           GenerationOptions{o->max_new_tokens, o->sampling, {}}, o->enable_thinking, o->batch_size);
    }
    if (has_prompt == has_chat) user_error("generate: give exactly one of --prompt TEXT or --chat TEXT");
    if (has_prompt && o->prompt.empty())
      user_error("generate: --prompt is empty: give text for the model to continue (or --chat for a message)");
    if (has_chat && o->chat.empty()) user_error("generate: --chat is empty: give a message for the model to answer");
    if (o->max_new_tokens < 1) user_error("--max-new-tokens ", o->max_new_tokens, ": expected >= 1");
    o->sampling.validate();
    const std::filesystem::path dir = local_or_hub_model(o->model, std::cerr);
    if (!std::filesystem::is_directory(dir)) user_error("--model ", dir.string(), ": no such folder");
    if (!std::filesystem::exists(dir / "tokenizer.json"))
      user_error(dir.string(), ": no tokenizer.json (generate needs the model's tokenizer)");
    Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
    std::string text = o->prompt;
    if (!o->chat.empty()) {
      const ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json");
      nlohmann::ordered_json vars;
      vars["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", o->chat}}});
      vars["add_generation_prompt"] = true;
      vars["enable_thinking"] = o->enable_thinking;
      text = tmpl.render(vars);
    }
    if (!utf8_valid(text)) user_error(o->chat.empty() ? "--prompt" : "--chat", ": not valid UTF-8");
    const std::vector<int32_t> prompt = tok.encode(text);
    // The KV cache is sized for prompt + new tokens: checked against the model before it is allocated.
    const int max_pos = load_model_config(dir).max_position_embeddings;
    if (int64_t(prompt.size()) + o->max_new_tokens > max_pos)
      user_error("--max-new-tokens ", o->max_new_tokens, ": the prompt's ", prompt.size(),
                 " tokens plus the new ones exceed the model's max_position_embeddings (", max_pos, ", ",
                 (dir / "config.json").string(), ")");
    GenerationOptions g{o->max_new_tokens, o->sampling, model_eos_ids(dir, tok)};
    const StopStrings stop(tok, o->stop, "--stop");
    g.stop_after = stop.stop_after();

    auto ops = make_ops(o->device);
    auto model = o->adapter.empty() ? load_pretrained(dir, *ops) : load_pretrained_with_adapter(dir, o->adapter, *ops);
    KvDecoder decoder(*model, 1, int(prompt.size()) + o->max_new_tokens, 512, o->sampling.repetition_penalty != 1);

    // Decode everything generated so far and print what became complete: a token's text can depend on its
    // neighbours (multi-byte characters), so tokens are not decoded one by one.
    std::vector<int32_t> shown_ids;
    std::string printed;
    auto show = [&](bool final) {
      const std::string s = tok.decode(shown_ids, /*skip_special_tokens=*/true);
      const size_t end = final ? s.size() : printable_prefix(s);
      if (end > printed.size() && s.compare(0, printed.size(), printed) == 0) {
        std::cout << s.substr(printed.size(), end - printed.size()) << std::flush;
        check_stdout();
        printed = s.substr(0, end);
      }
    };
    int id_count = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> out = generate(decoder, prompt, g, [&](int32_t id) {
      if (o->print_ids) {
        std::cout << (id_count++ ? " " : "") << id << std::flush;
        check_stdout();
        return;
      }
      if (size_t(id) < tok.vocab_size()) shown_ids.push_back(id);  // padded vocab rows have no text
      show(false);
    });
    if (!o->print_ids) show(true);
    std::cout << "\n" << std::flush;
    check_stdout();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << "generate: " << prompt.size() << " prompt tokens, " << out.size() << " new in " << s << " s ("
              << double(out.size()) / s << " tokens/s)\n";
    return 0;
  };
}

}  // namespace soltrain
