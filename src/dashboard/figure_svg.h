// The plots of `astrai plot` as one SVG document: the panels in a grid, each with its title,
// axes with tick labels, a clipped line per series (colour = run, dash = key) and a legend.
// Text stays text (legend and labels can be searched and edited); PNG output is this same
// document rasterised (image_file.h).
#pragma once

#include <string>
#include <vector>

#include "dashboard/panels.h"

namespace astrai::dashboard {

struct FigureSize {
  int width = 1200;
  int height = 800;
};

std::string figure_svg(const std::vector<Panel>& panels, const FigureSize& size);

// The colour of run `index` (shared by every panel, cycling through 10).
const char* run_color(size_t index);

}  // namespace astrai::dashboard
