#include "dashboard/panels.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "base/error.h"

namespace astrai::dashboard {

namespace fs = std::filesystem;

const std::vector<PanelSpec>& panel_catalog() {
  static const std::vector<PanelSpec> catalog = {
      {"loss", "Loss", {"loss", "val_loss"}, true},
      {"lr", "Learning rate", {"lr"}, true},
      {"grad_norm", "Gradient norm (before clipping)", {"grad_norm"}, true},
      {"tokens_per_s", "Tokens/s", {"tokens_per_s", "train_tokens_per_s", "rollout_tokens_per_s"}, true},
      {"step_seconds", "Seconds per update", {"step_seconds", "rollout_seconds"}, true},
      {"rewards_margin", "DPO reward margin", {"rewards_margin", "val_rewards_margin"}, false},
      {"rewards_accuracy", "DPO reward accuracy", {"rewards_accuracy", "val_rewards_accuracy"}, false},
      {"rewards_chosen", "DPO rewards", {"rewards_chosen", "rewards_rejected"}, false},
      {"reward_mean", "GRPO reward", {"reward_mean", "val_reward_mean"}, false},
      {"kl", "KL to the reference policy", {"kl", "val_kl"}, false},
      {"clip_fraction", "GRPO clipped fraction", {"clip_fraction"}, false},
      {"completion_tokens_mean", "GRPO completion tokens", {"completion_tokens_mean", "val_completion_tokens_mean"}, true},
  };
  return catalog;
}

Json panel_catalog_json() {
  Json out = Json::array();
  for (const PanelSpec& p : panel_catalog())
    out.push_back({{"name", p.name}, {"title", p.title}, {"keys", p.keys}, {"positive", p.positive}});
  return out;
}

std::vector<std::string> run_names(const std::vector<std::string>& dirs) {
  std::vector<std::string> names;
  for (const std::string& d : dirs) {
    fs::path p = fs::path(d).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // "runs/a/"
    std::string name = p.filename().string();
    if (name.empty() || name == "." || name == "..") name = fs::absolute(p).lexically_normal().filename().string();
    names.push_back(name);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (std::count(names.begin(), names.end(), names[i]) > 1) {
      for (size_t j = 0; j < names.size(); ++j)
        if (j != i && names[j] == names[i]) names[j] = dirs[j];
      names[i] = dirs[i];
    }
  }
  return names;
}

std::vector<std::string> split_names(const std::string& list, const char* flag) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    std::string part = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    part = b == std::string::npos ? "" : part.substr(b, e - b + 1);
    ASTRAI_CHECK(!part.empty(), flag, ": empty name in \"", list, "\"");
    out.push_back(part);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

namespace {

std::vector<Point> points_of(const std::vector<Json>& records, const std::string& key) {
  std::vector<Point> points;
  for (const Json& r : records) {
    auto step = r.find("step");
    auto value = r.find(key);
    if (step == r.end() || value == r.end() || !step->is_number() || !value->is_number()) continue;
    points.push_back({step->get<double>(), value->get<double>()});
  }
  return points;
}

// The numeric keys any record has (besides "step"), sorted.
std::set<std::string> numeric_keys(const std::vector<RunRecords>& runs) {
  std::set<std::string> keys;
  for (const RunRecords& run : runs)
    for (const Json& r : run.records)
      for (auto it = r.begin(); it != r.end(); ++it)
        if (it.value().is_number() && it.key() != "step") keys.insert(it.key());
  return keys;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

Panel fill_panel(const PanelSpec& spec, const std::vector<RunRecords>& runs) {
  Panel panel{spec, false, {}};
  for (size_t r = 0; r < runs.size(); ++r) {
    for (const std::string& key : spec.keys) {
      std::vector<Point> pts = points_of(runs[r].records, key);
      if (!pts.empty()) panel.series.push_back({r, key, "", std::move(pts)});
    }
  }
  std::set<std::string> keys_drawn;
  for (const Series& s : panel.series) keys_drawn.insert(s.key);
  for (Series& s : panel.series) {
    if (runs.size() == 1) s.label = s.key;
    else if (keys_drawn.size() == 1) s.label = runs[s.run].name;
    else s.label = runs[s.run].name + " " + s.key;
  }
  return panel;
}

const PanelSpec* catalog_entry(const std::string& name) {
  for (const PanelSpec& p : panel_catalog())
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

std::vector<Panel> build_panels(const std::vector<RunRecords>& runs, const std::vector<std::string>& wanted,
                                const std::set<std::string>& log_panels) {
  const std::set<std::string> available = numeric_keys(runs);
  std::vector<Panel> panels;
  if (wanted.empty()) {
    for (const PanelSpec& spec : panel_catalog()) {
      Panel p = fill_panel(spec, runs);
      if (!p.series.empty()) panels.push_back(std::move(p));
    }
  } else {
    for (const std::string& name : wanted) {
      const PanelSpec* spec = catalog_entry(name);
      if (!spec && !available.count(name)) {
        std::vector<std::string> names;
        for (const PanelSpec& p : panel_catalog()) names.push_back(p.name);
        for (const std::string& k : available)
          if (!catalog_entry(k)) names.push_back(k);
        fail("unknown metric \"", name, "\"; known: ", joined(names));
      }
      Panel p = fill_panel(spec ? *spec : PanelSpec{name, name, {name}, false}, runs);
      ASTRAI_CHECK(!p.series.empty(), "metric \"", name, "\" is in none of the runs; they have: ",
                   joined({available.begin(), available.end()}));
      panels.push_back(std::move(p));
    }
  }
  for (const std::string& name : log_panels) {
    auto it = std::find_if(panels.begin(), panels.end(), [&](const Panel& p) { return p.spec.name == name; });
    ASTRAI_CHECK(it != panels.end(), "--log-y ", name, ": no such panel is drawn");
    for (const Series& s : it->series)
      for (const Point& pt : s.points)
        ASTRAI_CHECK(pt.y > 0, "--log-y ", name, ": ", s.label, " has the value ", pt.y, " at step ", pt.x,
                     " (a log axis needs values > 0)");
    it->log_y = true;
  }
  return panels;
}

}  // namespace astrai::dashboard
