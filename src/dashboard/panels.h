// What the dashboard and `astrai plot` draw: one panel per metric family (loss with val_loss,
// learning rate, gradient norm, tokens/s, the DPO and GRPO metrics), each holding one series
// per (run, metrics.jsonl key), x = the record's "step". The catalog below is the one list of
// panels: the page gets it from /api/panels, `astrai plot` uses it directly.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"

namespace astrai::dashboard {

struct PanelSpec {
  std::string name;               // --metrics name (the main key of metrics.jsonl)
  std::string title;
  std::vector<std::string> keys;  // metrics.jsonl keys drawn in it, in legend order
  bool positive = false;          // values are > 0: a log y axis makes sense
};

// The known panels, in display order.
const std::vector<PanelSpec>& panel_catalog();
Json panel_catalog_json();

// One finished or running training run: its name in legends and its records.
struct RunRecords {
  std::string name;
  std::vector<Json> records;
};

struct Point {
  double x, y;
};

struct Series {
  size_t run = 0;   // index into the runs
  std::string key;  // metrics.jsonl key
  std::string label;
  std::vector<Point> points;  // in file order; x = step
};

struct Panel {
  PanelSpec spec;
  bool log_y = false;
  std::vector<Series> series;  // only those with at least one point
};

// Legend names for run directories: the directory's name, or the path as given where two
// runs share a name.
std::vector<std::string> run_names(const std::vector<std::string>& dirs);

// The panels to draw. `wanted` empty: every catalog panel that has data in some run. Else
// those names, in that order: a catalog name, or any numeric key of the records (a panel of
// its own). Throws astrai::Error for a name that is neither, a wanted panel with no data in
// any run, and a log_panels name that is not drawn or whose values are not all > 0.
std::vector<Panel> build_panels(const std::vector<RunRecords>& runs, const std::vector<std::string>& wanted,
                                const std::set<std::string>& log_panels);

// Splits "loss,lr , kl" into {"loss", "lr", "kl"} (empty parts are an error).
std::vector<std::string> split_names(const std::string& list, const char* flag);

}  // namespace astrai::dashboard
