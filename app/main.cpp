// tern: one binary, subcommands per ../shared/CLI.md. main() only parses, dispatches and maps
// exceptions to exit codes with one line on stderr; each command lives in app/cmd_*.cpp.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/standard_streams.h"
#include "app/version.h"
#include "formats/atomic_file.h"
#include "base/error.h"
#include "base/terminal_text.h"

namespace {

// The subcommand a failed parse was in, so the hint names its own help ("tern run --help"): the one
// CLI11 reached, else the first argument naming one (an error can come before CLI11 enters it).
const CLI::App* failed_subcommand(const CLI::App& app, int argc, char** argv) {
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) { return s->parsed(); })) return sub;
    for (int i = 1; i < argc; ++i)
        for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
            if (sub->check_name(argv[i])) return sub;
    return nullptr;
}

// CLI11 prints multi-line help on errors; users get one line with a hint instead. The message quotes
// what was typed, so it is made terminal-safe like every other error line.
int usage_error(const CLI::App& app, const CLI::Error& e, int argc, char** argv) {
    const CLI::App* sub = failed_subcommand(app, argc, argv);
    const std::string help = sub ? "tern " + sub->get_name() + " --help" : "tern --help";
    std::cerr << "tern: " << tern::terminal_safe(e.what()) << " (run '" << help << "' for usage)\n";
    return static_cast<int>(tern::ExitCode::usage);
}

} // namespace

int main(int argc, char** argv) {
    // A closed stdout (`tern run | head -c 20`) must end quietly, not with a SIGPIPE death
    // reported by the shell; writes then fail with EPIPE and the commands stop.
    std::signal(SIGPIPE, SIG_IGN);
    // Likewise a file-size limit (ulimit -f) must give the writer's clean EFBIG error and
    // removal of the temporary file, not a silent SIGXFSZ death.
    std::signal(SIGXFSZ, SIG_IGN);
    // SIGINT, SIGTERM, SIGHUP and SIGQUIT remove the temporary file of a write in progress
    // (quantize, synth, /save) before the process ends (formats/atomic_file.h).
    tern::install_temporary_file_cleanup_on_signals();
    // Before any file is opened, so none can land on a closed stdout's descriptor.
    tern::app::occupy_closed_standard_fds();

    CLI::App app{"tern: run GGUF language models locally, fast, on NVIDIA GPUs and CPUs", "tern"};
    app.require_subcommand(0, 1);
    bool show_version = false;
    app.add_flag("--version", show_version, "print version and build (CUDA, CPU features)");

    const std::vector<tern::app::Command> commands = {
        tern::app::add_info_command(app),
        tern::app::add_run_command(app),
        tern::app::add_chat_command(app),
        tern::app::add_tokenize_command(app),
        tern::app::add_quantize_command(app),
        tern::app::add_perplexity_command(app),
        tern::app::add_synth_command(app),
        tern::app::add_bench_command(app),
        tern::app::add_serve_command(app),
    };

    tern::app::rewrite_llama_aliases(argc, argv);   // `-ngl 99` (CLI11 has no multi-letter short options)
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::Error& e) {
        return usage_error(app, e, argc, argv);
    }

    const auto run_command = [&]() -> int {
        if (show_version) {
            std::cout << tern::app::version_string() << "\n";
            return 0;
        }
        try {
            for (const tern::app::Command& c : commands)
                if (c.sub->parsed()) return c.run();
            std::cerr << app.help();
            return static_cast<int>(tern::ExitCode::usage);
        } catch (const tern::TernError& e) {
            std::cerr << "tern: " << e.what() << "\n";
            return static_cast<int>(e.code());
        } catch (const std::bad_alloc&) {
            std::cerr << "tern: out of memory (a smaller model or -c/--ctx-size needs less, as does a smaller input)\n";
            return static_cast<int>(tern::ExitCode::runtime);
        } catch (const std::exception& e) {
            std::cerr << "tern: internal error: " << tern::terminal_safe(e.what()) << " (please report this)\n";
            return static_cast<int>(tern::ExitCode::runtime);
        }
    };
    return tern::app::finish_stdout(run_command());
}
