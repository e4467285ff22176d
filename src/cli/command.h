// Each subcommand lives in its own src/cli/cmd_<name>.cc and registers itself here:
//
//   namespace { const bool kRegistered = astrai::cli::register_command(&setup_score); }
//
// setup adds a CLI11 subcommand with its options and a callback that does the work.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace astrai::cli {

using CommandSetup = void (*)(CLI::App& app);

bool register_command(CommandSetup setup);
const std::vector<CommandSetup>& registered_commands();

}  // namespace astrai::cli
