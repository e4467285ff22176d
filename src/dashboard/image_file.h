// Writes a figure to an image file chosen by its extension: .svg as it is, .png rasterised by
// librsvg (Debian librsvg2, drawing through cairo) from the same SVG, so both formats come from
// one drawing code path.
#pragma once

#include <string>

#include "dashboard/figure_svg.h"

namespace astrai::dashboard {

// The format of an output path: "svg" or "png"; throws astrai::Error for any other extension.
std::string image_format(const std::string& path);

// The SVG document rasterised to PNG bytes of width x height pixels.
std::string svg_to_png(const std::string& svg, int width, int height);

// Writes the figure (atomically) to `path` (.png or .svg). Throws astrai::Error naming the
// path when the extension is unsupported or the file cannot be written.
void write_figure(const std::string& path, const std::vector<Panel>& panels, const FigureSize& size);

}  // namespace astrai::dashboard
