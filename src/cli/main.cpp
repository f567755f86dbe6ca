// soltrain: entry point. Bad input → one line on stderr and exit code 2; our own bugs → exit code 1.
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"soltrain: fast training and fine-tuning of language models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all");
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands;
  auto dump = soltrain::add_dump_command(app);
  auto train = soltrain::add_train_command(app);
  auto merge = soltrain::add_merge_command(app);
  auto encode = soltrain::add_encode_command(app);
  auto tokenize = soltrain::add_tokenize_command(app);
  auto chat_template = soltrain::add_chat_template_command(app);
  auto bench = soltrain::add_bench_command(app);
  auto bench_attention = soltrain::add_bench_attention_command(app);
  auto sft = soltrain::add_sft_command(app);
  auto pt = soltrain::add_pt_command(app);
  auto demo_setup = soltrain::add_demo_setup_command(app);
  auto generate = soltrain::add_generate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << e.what() << " (see soltrain --help)\n";
    return 2;
  }
  try {
    if (app.got_subcommand("dump")) return dump();
    if (app.got_subcommand("train")) return train();
    if (app.got_subcommand("merge")) return merge();
    if (app.got_subcommand("encode")) return encode();
    if (app.got_subcommand("tokenize")) return tokenize();
    if (app.got_subcommand("chat-template")) return chat_template();
    if (app.got_subcommand("bench")) return bench();
    if (app.got_subcommand("bench-attention")) return bench_attention();
    if (app.got_subcommand("sft")) return sft();
    if (app.got_subcommand("pt")) return pt();
    if (app.got_subcommand("demo-setup")) return demo_setup();
    if (app.got_subcommand("generate")) return generate();
  } catch (const soltrain::UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error (please report): " << e.what() << "\n";
    return 1;
  }
  return 1;
}
