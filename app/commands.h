#pragma once
// Each subcommand lives in its own app/cmd_<name>.cpp and registers itself here: it adds its
// CLI11 subcommand and flags, and returns the function main() runs when it was chosen.
#include <CLI/CLI.hpp>

#include <functional>

namespace tern::app {

using CommandRun = std::function<int()>;   // returns the process exit code

struct Command {
    CLI::App* sub;    // the CLI11 subcommand, to ask whether it was chosen
    CommandRun run;
};

Command add_info_command(CLI::App& root);
Command add_run_command(CLI::App& root);
Command add_chat_command(CLI::App& root);
Command add_tokenize_command(CLI::App& root);
Command add_quantize_command(CLI::App& root);
Command add_perplexity_command(CLI::App& root);
Command add_synth_command(CLI::App& root);
Command add_bench_command(CLI::App& root);
Command add_serve_command(CLI::App& root);

} // namespace tern::app
