// soltrain: entry point. Bad input → one line on stderr and exit code 2; our own bugs → exit code 1.
#include <csignal>
#include <filesystem>
#include <iostream>
#include <new>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/error_text.h"
#include "core/error.h"
#include "core/version.h"
#include "dist/communicator.h"
#include "dist/launch.h"

int main(int argc, char** argv) {
  // A write to a closed pipe (| head) or past `ulimit -f` fails with EPIPE / EFBIG and is reported as any
  // failed write is (one line, exit 2), rather than the signal ending the process without a word (as
  // Python does at startup).
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"soltrain: fast training and fine-tuning of language models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all");
  app.set_version_flag("--version", std::string("soltrain ") + soltrain::soltrain_version());
  // Each registrar adds its subcommand and returns what runs it; the pair is kept here so a subcommand's
  // name is written in one place only.
  using Registrar = std::function<int()> (*)(CLI::App&);
  // clang-format off
  const Registrar registrars[] = {
      soltrain::add_sft_command,           soltrain::add_pt_command,       soltrain::add_dpo_command,
      soltrain::add_grpo_command,          soltrain::add_tokenize_command, soltrain::add_generate_command,
      soltrain::add_merge_command,         soltrain::add_dump_command,     soltrain::add_train_command,
      soltrain::add_encode_command,        soltrain::add_chat_template_command, soltrain::add_bench_command,
      soltrain::add_bench_attention_command, soltrain::add_demo_setup_command, soltrain::add_quantize_command,
      soltrain::add_config_keys_command,   soltrain::add_merge_lora_command, soltrain::add_chat_command,
      soltrain::add_inference_command,     soltrain::add_serve_command,
      soltrain::add_bench_grouped_gemm_command, soltrain::add_bench_decode_command};
  // clang-format on
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands;
  for (Registrar add : registrars) {
    std::function<int()> run = add(app);
    commands.emplace_back(app.get_subcommands([](CLI::App*) { return true; }).back(), std::move(run));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << soltrain::printable_line(e.what()) << " (see soltrain --help)\n";
    return 2;
  }
  try {
    for (const auto& [cmd, run] : commands)
      if (cmd->parsed()) return run();
  } catch (const soltrain::UserError& e) {
    soltrain::print_error_line("error: " + soltrain::printable_line(e.what()));
    return 2;
  } catch (const soltrain::RankFailure& e) {  // another rank failed, went away or fell silent: this one stops
    soltrain::print_error_line("error: " + soltrain::printable_line(e.what()));
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // a path the user gave: not there, not writable
    soltrain::print_error_line("error: " + soltrain::printable_line(e.what()));
    return 2;
  } catch (const std::bad_alloc&) {  // sizes are checked before allocating; this is what slipped through
    std::cerr << "error: out of memory: the input asks for more memory than this machine has (std::bad_alloc)\n";
    return 2;
  } catch (const std::length_error& e) {  // a container asked for more elements than it can hold
    std::cerr << "error: out of memory: the input asks for an impossibly large buffer ("
              << soltrain::printable_line(e.what()) << ")\n";
    return 2;
  } catch (const std::exception& e) {
    soltrain::print_error_line("internal error (please report): " + soltrain::printable_line(e.what()));
    return 1;
  }
  return 1;
}
