// `astrai dashboard RUN_DIR...`: the training dashboard (live plots of metrics.jsonl) for runs
// whose output directories are here or mounted; serves until SIGINT or SIGTERM.
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "cli/command.h"
#include "dashboard/dashboard_server.h"
#include "dashboard/stop_signal.h"

namespace astrai::cli {
namespace {

struct DashboardCommand {
  std::vector<std::string> runs;
  dashboard::DashboardOptions options;
};

void run_dashboard(const DashboardCommand& c) {
  for (const std::string& dir : c.runs)
    ASTRAI_CHECK(std::filesystem::is_directory(dir), dir, ": no such directory (give training output directories)");
  dashboard::StopSignal stop;
  dashboard::DashboardServer server(c.runs, c.options);
  server.start();
  log_info("dashboard: listening on ", server.url(), " (", c.runs.size(), " run", c.runs.size() == 1 ? "" : "s",
           "); Ctrl-C to stop");
  const int sig = stop.wait();
  log_info("dashboard: ", sig == SIGINT ? "SIGINT" : "SIGTERM", ": stopped");
}

void setup_dashboard(CLI::App& app) {
  auto c = std::make_shared<DashboardCommand>();
  CLI::App* cmd = app.add_subcommand(
      "dashboard",
      "Serve live plots of training runs' metrics.jsonl (loss, lr, gradient norm, tokens/s, DPO/GRPO metrics) until Ctrl-C");
  cmd->add_option("runs", c->runs, "training output directories (astrai train --output), overlaid")->required();
  cmd->add_option("--host", c->options.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", c->options.port, "port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->callback([c] { run_dashboard(*c); });
}

const bool kRegistered = register_command(&setup_dashboard);

}  // namespace
}  // namespace astrai::cli
