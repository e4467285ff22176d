// The `astrai` binary: dispatches to the subcommands that registered themselves.
#include <cstdio>
#include <exception>

#include "base/error.h"
#include "cli/command.h"

namespace astrai::cli {

namespace {
std::vector<CommandSetup>& registry() {
  static std::vector<CommandSetup> commands;
  return commands;
}
}  // namespace

bool register_command(CommandSetup setup) {
  registry().push_back(setup);
  return true;
}

const std::vector<CommandSetup>& registered_commands() { return registry(); }

}  // namespace astrai::cli

int main(int argc, char** argv) {
  CLI::App app{"astrai: train and serve decoder-only language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "astrai 0.1.0");
  for (auto setup : astrai::cli::registered_commands()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const astrai::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
