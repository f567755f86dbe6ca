// `soltrain chat --model M [--adapter A]`: a conversation in the terminal through the model's chat template,
// every turn seeing the ones before (/reset forgets them, /exit or end of input ends). `soltrain inference
// config.yaml`: the same for a config's trained output, as Axolotl's inference command (the adapter of
// output_dir/adapter over the base, or output_dir/model).
#include <unistd.h>

#include <iostream>
#include <memory>

#include "cli/chat_model.h"
#include "cli/commands.h"
#include "cli/config.h"
#include "cli/device_option.h"
#include "cli/hub_inputs.h"
#include "core/error.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

struct ChatOpts {
  std::string model, adapter, system, device = "cpu";
  bool enable_thinking = true;
  int max_new_tokens = 512;
  SamplingParams sampling;
};

void add_chat_options(CLI::App* c, ChatOpts& o) {
  c->add_option("--system", o.system, "a system message opening the conversation");
  c->add_option("--enable-thinking", o.enable_thinking, "the template variable enable_thinking")->capture_default_str();
  c->add_option("--max-new-tokens", o.max_new_tokens, "the longest answer, in tokens")->capture_default_str();
  c->add_option("--temperature", o.sampling.temperature, "0 = greedy; otherwise sample from softmax(logits / T)")
      ->capture_default_str();
  c->add_option("--top-k", o.sampling.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  c->add_option("--top-p", o.sampling.top_p, "sample within the smallest set of mass >= p")->capture_default_str();
  c->add_option("--min-p", o.sampling.min_p, "drop tokens below min_p x the likeliest's probability (0 = off)")
      ->capture_default_str();
  c->add_option("--repetition-penalty", o.sampling.repetition_penalty,
                "divide the logits of tokens already in the text by this (multiply when negative; 1 = off)")
      ->capture_default_str();
  c->add_option("--seed", o.sampling.seed, "random seed of the sampler")->capture_default_str();
  add_device_option(c, o.device);
}

int run_chat(const ChatOpts& o, const fs::path& model, const std::string& adapter) {
  if (o.max_new_tokens < 1) user_error("--max-new-tokens ", o.max_new_tokens, ": expected >= 1");
  o.sampling.validate();
  ChatModel m(model, adapter, o.device);
  const bool tty = ::isatty(0) && ::isatty(1);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  const size_t opening = messages.size();
  if (tty)
    std::cerr << "chat with " << model.string() << (adapter.empty() ? "" : " + " + adapter)
              << " (/reset forgets the conversation, /exit or Ctrl-D ends it)\n";
  std::string line;
  for (;;) {
    if (tty) std::cout << "you> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      messages.erase(messages.begin() + std::ptrdiff_t(opening), messages.end());
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::vector<int32_t> prompt = m.chat_prompt(messages, o.enable_thinking);
    GenerationOptions g{std::min(o.max_new_tokens, m.room(prompt.size())), o.sampling, {}};
    if (g.max_new_tokens < 1) user_error("the conversation fills the model's context: /reset to start again");
    const std::string reply = m.text(m.complete(prompt, 1, g)[0]);
    std::cout << (tty ? "model> " : "") << reply << "\n" << std::flush;
    if (!std::cout) user_error("stdout: write failed");
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

}  // namespace

std::function<int()> add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatOpts>();
  CLI::App* c = app.add_subcommand("chat", "a multi-turn conversation with a model through its chat template");
  c->add_option("--model", o->model, "Hugging Face model folder or hub id (Org/Name)")->required();
  c->add_option("--adapter", o->adapter, "PEFT LoRA adapter folder applied on top of the model");
  add_chat_options(c, *o);
  return [o]() { return run_chat(*o, local_or_hub_model(o->model, std::cerr), o->adapter); };
}

std::function<int()> add_inference_command(CLI::App& app) {
  struct Opts {
    ChatOpts chat;
    std::string config, lora_model_dir;
    std::vector<std::string> set;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("inference",
                                   "chat with a config's trained model or adapter (Axolotl's inference; output_dir's)");
  c->add_option("config", o->config, "the training config (its model and output_dir)")->required();
  c->add_option("--lora-model-dir", o->lora_model_dir, "the adapter folder; default output_dir/adapter");
  c->add_option("--set", o->set, "override a config key: key=value (repeatable)");
  add_chat_options(c, o->chat);
  return [o]() {
    const TrainConfig cfg = load_train_config(o->config, o->set, TrainMode::kSft);
    const fs::path base = cfg.model_hub_id.empty() ? cfg.model : local_or_hub_model(cfg.model_hub_id, std::cerr);
    fs::path adapter = o->lora_model_dir;
    if (adapter.empty() && fs::exists(cfg.output_dir / "adapter" / "adapter_config.json"))
      adapter = cfg.output_dir / "adapter";
    if (!adapter.empty()) return run_chat(o->chat, base, adapter.string());
    if (!fs::exists(cfg.output_dir / "model" / "config.json"))
      user_error("inference: ", cfg.output_dir.string(), " holds no trained model or adapter yet: train the config ",
                 "first (soltrain train ", o->config, ")");
    return run_chat(o->chat, cfg.output_dir / "model", "");
  };
}

}  // namespace soltrain
