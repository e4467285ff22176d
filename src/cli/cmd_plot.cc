// `astrai plot RUN_DIR... --output FILE.png|.svg`: the dashboard's panels as an image file.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/command.h"
#include "dashboard/image_file.h"
#include "dashboard/metrics_tail.h"
#include "dashboard/panels.h"

namespace astrai::cli {
namespace {

struct PlotCommand {
  std::vector<std::string> runs;
  std::string output;
  std::string metrics;
  std::string log_y;
  dashboard::FigureSize size;
};

void run_plot(const PlotCommand& c) {
  dashboard::image_format(c.output);  // an unsupported extension fails before any reading
  const std::vector<std::string> names = dashboard::run_names(c.runs);
  std::vector<dashboard::RunRecords> runs;
  for (size_t i = 0; i < c.runs.size(); ++i) {
    ASTRAI_CHECK(std::filesystem::is_directory(c.runs[i]), c.runs[i], ": no such directory");
    const std::string file = (std::filesystem::path(c.runs[i]) / "metrics.jsonl").string();
    ASTRAI_CHECK(std::filesystem::exists(file), c.runs[i], ": no metrics.jsonl (not an astrai train --output directory?)");
    runs.push_back({names[i], dashboard::read_metrics_file(file)});
  }
  const std::vector<std::string> wanted = c.metrics.empty() ? std::vector<std::string>() : dashboard::split_names(c.metrics, "--metrics");
  std::set<std::string> log_panels;
  if (!c.log_y.empty())
    for (const std::string& name : dashboard::split_names(c.log_y, "--log-y")) log_panels.insert(name);
  const std::vector<dashboard::Panel> panels = dashboard::build_panels(runs, wanted, log_panels);
  dashboard::write_figure(c.output, panels, c.size);
  std::string drawn;
  for (const auto& p : panels) drawn += (drawn.empty() ? "" : ", ") + p.spec.name;
  std::printf("wrote %s (%dx%d): %s\n", c.output.c_str(), c.size.width, c.size.height, drawn.c_str());
}

void setup_plot(CLI::App& app) {
  auto c = std::make_shared<PlotCommand>();
  CLI::App* cmd = app.add_subcommand("plot", "Plot training runs' metrics.jsonl as a PNG or SVG image (the dashboard's panels)");
  cmd->add_option("runs", c->runs, "training output directories (astrai train --output), overlaid")->required();
  cmd->add_option("--output,-o", c->output, "image file: .png or .svg")->required();
  cmd->add_option("--metrics", c->metrics,
                  "panels, comma-separated, in this order (default: every one with data): loss (with val_loss), lr, "
                  "grad_norm, tokens_per_s, step_seconds, rewards_margin, rewards_accuracy, rewards_chosen, "
                  "reward_mean, kl, clip_fraction, completion_tokens_mean, or any numeric key of metrics.jsonl");
  cmd->add_option("--log-y", c->log_y, "panels with a logarithmic y axis, comma-separated (e.g. loss,grad_norm)");
  cmd->add_option("--width", c->size.width, "image width in pixels")->capture_default_str();
  cmd->add_option("--height", c->size.height, "image height in pixels")->capture_default_str();
  cmd->callback([c] { run_plot(*c); });
}

const bool kRegistered = register_command(&setup_plot);

}  // namespace
}  // namespace astrai::cli
