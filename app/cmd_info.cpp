#include "app/commands.h"

#include <iostream>

namespace tern::app {

Command add_info_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("info", "architecture, sizes, formats, tokenizer and chat template of a model");
    auto model = std::make_shared<std::string>();
    cmd->add_option("model", *model, "GGUF file")->required();
    return {cmd, [model] {
        std::cout << *model << "\n";
        return 0;
    }};
}

} // namespace tern::app
