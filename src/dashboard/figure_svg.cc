#include "dashboard/figure_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "dashboard/axis.h"

namespace astrai::dashboard {

namespace {

constexpr const char* kFont = "DejaVu Sans, Arial, sans-serif";
constexpr double kFontSize = 11;
constexpr double kCharWidth = 0.62 * kFontSize;  // DejaVu Sans' average advance, rounded up

struct Box {
  double x, y, w, h;
};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string text(double x, double y, const std::string& s, const char* anchor, double size = kFontSize,
                 const char* extra = "") {
  return str_cat("<text x=\"", num(x), "\" y=\"", num(y), "\" font-size=\"", num(size), "\" text-anchor=\"", anchor,
                 "\"", extra, ">", escape(s), "</text>\n");
}

const char* dash_of(size_t key_index) {
  static const char* kDashes[] = {"", "6 4", "2 3", "8 3 2 3"};
  return kDashes[key_index % 4];
}

struct Extent {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
};

Extent extent_of(const Panel& p) {
  Extent e;
  for (const Series& s : p.series)
    for (const Point& pt : s.points) {
      e.xmin = std::min(e.xmin, pt.x);
      e.xmax = std::max(e.xmax, pt.x);
      e.ymin = std::min(e.ymin, pt.y);
      e.ymax = std::max(e.ymax, pt.y);
    }
  return e;
}

std::string axes_svg(const Box& plot, const Axis& xa, const Axis& ya) {
  std::string out = "<g class=\"axes\" stroke=\"#d0d4da\" stroke-width=\"1\">\n";
  std::string labels = "<g class=\"ticks\" fill=\"#374151\">\n";
  for (size_t i = 0; i < ya.ticks.size(); ++i) {
    const double y = plot.y + plot.h * (1 - ya.fraction(ya.ticks[i]));
    out += str_cat("<line x1=\"", num(plot.x), "\" y1=\"", num(y), "\" x2=\"", num(plot.x + plot.w), "\" y2=\"", num(y), "\"/>\n");
    labels += text(plot.x - 6, y + kFontSize * 0.35, ya.labels[i], "end");
  }
  for (size_t i = 0; i < xa.ticks.size(); ++i) {
    const double x = plot.x + plot.w * xa.fraction(xa.ticks[i]);
    out += str_cat("<line x1=\"", num(x), "\" y1=\"", num(plot.y), "\" x2=\"", num(x), "\" y2=\"", num(plot.y + plot.h), "\"/>\n");
    labels += text(x, plot.y + plot.h + kFontSize + 4, xa.labels[i], "middle");
  }
  out += str_cat("<rect x=\"", num(plot.x), "\" y=\"", num(plot.y), "\" width=\"", num(plot.w), "\" height=\"", num(plot.h),
                 "\" fill=\"none\" stroke=\"#6b7280\"/>\n</g>\n");
  return out + labels + "</g>\n";
}

std::string series_svg(const Series& s, size_t key_index, const Box& plot, const Axis& xa, const Axis& ya) {
  const char* color = run_color(s.run);
  std::string out = str_cat("<g class=\"series\" data-key=\"", escape(s.key), "\" data-label=\"", escape(s.label),
                            "\" data-points=\"", s.points.size(), "\" stroke=\"", color, "\" fill=\"", color, "\">\n");
  std::string pts;
  for (const Point& p : s.points) {
    if (!pts.empty()) pts += ' ';
    pts += num(plot.x + plot.w * xa.fraction(p.x)) + "," + num(plot.y + plot.h * (1 - ya.fraction(p.y)));
  }
  const char* dash = dash_of(key_index);
  out += str_cat("<polyline fill=\"none\" stroke-width=\"1.6\" stroke-linejoin=\"round\"",
                 *dash ? str_cat(" stroke-dasharray=\"", dash, "\"") : std::string(), " points=\"", pts, "\"/>\n");
  // Sparse series (validation every N updates, a single point): markers at the points too.
  if (s.points.size() <= 60) {
    for (const Point& p : s.points)
      out += str_cat("<circle cx=\"", num(plot.x + plot.w * xa.fraction(p.x)), "\" cy=\"",
                     num(plot.y + plot.h * (1 - ya.fraction(p.y))), "\" r=\"2.2\" stroke=\"none\"/>\n");
  }
  return out + "</g>\n";
}

std::string legend_svg(const Panel& p, const Box& plot) {
  size_t longest = 0;
  for (const Series& s : p.series) longest = std::max(longest, s.label.size());
  const double row = kFontSize + 5;
  const double w = 34 + kCharWidth * static_cast<double>(longest);
  const double h = 6 + row * static_cast<double>(p.series.size());
  const double x = plot.x + plot.w - w - 6, y = plot.y + 6;
  std::string out = str_cat("<g class=\"legend\">\n<rect x=\"", num(x), "\" y=\"", num(y), "\" width=\"", num(w),
                            "\" height=\"", num(h), "\" fill=\"#ffffff\" fill-opacity=\"0.85\" stroke=\"#d0d4da\"/>\n");
  for (size_t i = 0; i < p.series.size(); ++i) {
    const Series& s = p.series[i];
    const double cy = y + 3 + row * (static_cast<double>(i) + 0.5);
    const char* dash = dash_of(static_cast<size_t>(
        std::find(p.spec.keys.begin(), p.spec.keys.end(), s.key) - p.spec.keys.begin()));
    out += str_cat("<line x1=\"", num(x + 6), "\" y1=\"", num(cy), "\" x2=\"", num(x + 26), "\" y2=\"", num(cy),
                   "\" stroke=\"", run_color(s.run), "\" stroke-width=\"2\"",
                   *dash ? str_cat(" stroke-dasharray=\"", dash, "\"") : std::string(), "/>\n");
    out += text(x + 30, cy + kFontSize * 0.35, s.label, "start", kFontSize, " fill=\"#111827\"");
  }
  return out + "</g>\n";
}

std::string panel_svg(const Panel& p, const Box& cell, size_t index) {
  const Box plot{cell.x + 64, cell.y + 30, cell.w - 64 - 14, cell.h - 30 - 40};
  ASTRAI_CHECK(plot.w > 40 && plot.h > 30, "the image is too small for its panels (give a larger --width or --height)");
  const Extent e = extent_of(p);
  const Axis xa = make_axis(e.xmin, e.xmax, false, std::max(2, static_cast<int>(plot.w / 90)), 1);
  const Axis ya = make_axis(e.ymin, e.ymax, p.log_y, std::max(2, static_cast<int>(plot.h / 50)));
  const std::string clip = str_cat("clip", index);
  std::string out = str_cat("<g class=\"panel\" data-panel=\"", escape(p.spec.name), "\" font-family=\"", kFont, "\">\n");
  out += str_cat("<clipPath id=\"", clip, "\"><rect x=\"", num(plot.x), "\" y=\"", num(plot.y), "\" width=\"",
                 num(plot.w), "\" height=\"", num(plot.h), "\"/></clipPath>\n");
  out += text(cell.x + cell.w / 2, cell.y + 19, p.spec.title + (p.log_y ? " (log scale)" : ""), "middle", 13,
              " font-weight=\"bold\" fill=\"#111827\"");
  out += axes_svg(plot, xa, ya);
  out += text(plot.x + plot.w / 2, plot.y + plot.h + 2 * kFontSize + 8, "step", "middle", kFontSize, " fill=\"#374151\"");
  out += str_cat("<g clip-path=\"url(#", clip, ")\">\n");
  for (const Series& s : p.series) {
    const size_t key_index = static_cast<size_t>(std::find(p.spec.keys.begin(), p.spec.keys.end(), s.key) - p.spec.keys.begin());
    out += series_svg(s, key_index, plot, xa, ya);
  }
  out += "</g>\n" + legend_svg(p, plot);
  return out + "</g>\n";
}

}  // namespace

const char* run_color(size_t index) {
  static const char* kColors[] = {"#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c",
                                  "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d"};
  return kColors[index % 10];
}

std::string figure_svg(const std::vector<Panel>& panels, const FigureSize& size) {
  ASTRAI_CHECK(!panels.empty(), "nothing to plot");
  ASTRAI_CHECK(size.width >= 200 && size.height >= 150 && size.width <= 20000 && size.height <= 20000,
               "--width and --height must be in [200, 20000] x [150, 20000], got ", size.width, "x", size.height);
  const size_t n = panels.size();
  const size_t cols = n == 1 ? 1 : n <= 4 ? 2 : 3;
  const size_t rows = (n + cols - 1) / cols;
  const double cw = static_cast<double>(size.width) / static_cast<double>(cols);
  const double ch = static_cast<double>(size.height) / static_cast<double>(rows);
  std::string out = str_cat("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                            size.width, "\" height=\"", size.height, "\" viewBox=\"0 0 ", size.width, " ", size.height, "\">\n");
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  for (size_t i = 0; i < n; ++i) {
    const Box cell{cw * static_cast<double>(i % cols), ch * static_cast<double>(i / cols), cw, ch};
    out += panel_svg(panels[i], cell, i);
  }
  return out + "</svg>\n";
}

}  // namespace astrai::dashboard
