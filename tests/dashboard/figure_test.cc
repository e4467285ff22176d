// `astrai plot`'s output: the SVG holds one panel per metric, each series' points where the
// axes put them and a legend with the runs; the PNG is that SVG rasterised at the asked size;
// unsupported extensions and unwritable paths are clear errors.
#include <gtest/gtest.h>

#include <regex>

#include "base/files.h"
#include "dashboard/figure_svg.h"
#include "dashboard/image_file.h"
#include "test_util.h"

namespace astrai::dashboard {
namespace {

using testing::error_of;
using testing::ScratchDir;

std::vector<Panel> two_runs(std::vector<std::string> wanted = {}) {
  RunRecords a{"baseline", {}}, b{"bigger-lr", {}};
  for (int s = 1; s <= 30; ++s) {
    a.records.push_back({{"step", s}, {"loss", 3.0 - 0.05 * s}, {"lr", 1e-4}});
    if (s <= 20) b.records.push_back({{"step", s}, {"loss", 3.2 - 0.1 * s}, {"lr", 3e-4}});
  }
  return build_panels({a, b}, wanted, {});
}

// The "x,y" pairs of the first polyline after `marker` in the document.
std::vector<std::pair<double, double>> polyline_after(const std::string& svg, const std::string& marker) {
  const size_t at = svg.find(marker);
  EXPECT_NE(at, std::string::npos) << marker;
  const size_t p = svg.find(" points=\"", svg.find("<polyline", at)) + 9;
  const std::string pts = svg.substr(p, svg.find('"', p) - p);
  std::vector<std::pair<double, double>> out;
  std::regex pair_re(R"((-?[0-9.]+),(-?[0-9.]+))");
  for (std::sregex_iterator it(pts.begin(), pts.end(), pair_re), end; it != end; ++it)
    out.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
  return out;
}

TEST(FigureSvg, PanelsSeriesPointsAndLegend) {
  const std::string svg = figure_svg(two_runs(), {900, 400});
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"400\""), std::string::npos);
  EXPECT_NE(svg.find("data-panel=\"loss\""), std::string::npos);
  EXPECT_NE(svg.find("data-panel=\"lr\""), std::string::npos);
  EXPECT_EQ(svg.find("data-panel=\"grad_norm\""), std::string::npos);
  // Legend entries name the runs (one key per panel: the run names alone).
  EXPECT_NE(svg.find(">baseline</text>"), std::string::npos);
  EXPECT_NE(svg.find(">bigger-lr</text>"), std::string::npos);
  // The loss of "baseline": 30 points, x increasing with the step, y decreasing on screen as the
  // loss falls; its first and last points at the data's x range on the panel's x axis.
  const auto a = polyline_after(svg, "data-label=\"baseline\" data-points=\"30\"");
  ASSERT_EQ(a.size(), 30u);
  for (size_t i = 1; i < a.size(); ++i) {
    EXPECT_GT(a[i].first, a[i - 1].first);
    EXPECT_GT(a[i].second, a[i - 1].second);  // the loss falls: SVG y grows downwards
  }
  const auto b = polyline_after(svg, "data-label=\"bigger-lr\" data-points=\"20\"");
  ASSERT_EQ(b.size(), 20u);
  // Same steps, same x: step 1 of both runs is at the same place; step 20 of b equals a's 20th.
  EXPECT_DOUBLE_EQ(a[0].first, b[0].first);
  EXPECT_DOUBLE_EQ(a[19].first, b[19].first);
  // Two panels side by side: the loss panel is in the left half.
  EXPECT_LT(a.back().first, 450);
  EXPECT_GT(a.front().first, 0);
}

TEST(FigureSvg, RejectsSillySizes) {
  EXPECT_NE(error_of([] { figure_svg(two_runs(), {50, 400}); }).find("--width and --height"), std::string::npos);
  std::vector<Panel> many;
  for (int i = 0; i < 9; ++i) many.push_back(two_runs({"loss"})[0]);
  EXPECT_NE(error_of([&] { figure_svg(many, {300, 150}); }).find("too small"), std::string::npos);
}

TEST(FigureSvg, EscapesNames) {
  RunRecords r{"a<b>&\"c\"", {{{"step", 1}, {"loss", 1.0}}}};
  const std::string svg = figure_svg(build_panels({r, RunRecords{"d", {{{"step", 1}, {"loss", 2.0}}}}}, {}, {}), {600, 300});
  EXPECT_NE(svg.find("a&lt;b&gt;&amp;&quot;c&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b>"), std::string::npos);
  EXPECT_FALSE(svg_to_png(svg, 600, 300).empty());  // librsvg's XML parser accepts it
}

uint32_t big_endian(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

TEST(ImageFile, PngHasTheSignatureAndTheAskedSize) {
  ScratchDir dir;
  const std::string path = dir.path("loss.png");
  write_figure(path, two_runs(), {640, 360});
  const std::string png = read_file(path);
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(big_endian(png, 16), 640u);
  EXPECT_EQ(big_endian(png, 20), 360u);
}

TEST(ImageFile, SvgIsWrittenAsIs) {
  ScratchDir dir;
  const std::string path = dir.path("loss.SVG");
  write_figure(path, two_runs(), {640, 360});
  EXPECT_EQ(read_file(path), figure_svg(two_runs(), {640, 360}));
}

TEST(ImageFile, ClearErrors) {
  ScratchDir dir;
  EXPECT_NE(error_of([&] { write_figure(dir.path("loss.jpg"), two_runs(), {}); }).find("unsupported image type \".jpg\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_figure(dir.path("loss"), two_runs(), {}); }).find("(no extension)"), std::string::npos);
  EXPECT_NE(error_of([&] { write_figure(dir.path("nowhere/loss.png"), two_runs(), {}); }).find("does not exist"),
            std::string::npos);
  std::filesystem::create_directory(dir.path("taken.png"));
  EXPECT_NE(error_of([&] { write_figure(dir.path("taken.png"), two_runs(), {}); }).find("is a directory"),
            std::string::npos);
  // A directory that exists but takes no files (even for root).
  EXPECT_NE(error_of([&] { write_figure("/proc/astrai-loss.png", two_runs(), {}); }).find("cannot write it"),
            std::string::npos);
}

}  // namespace
}  // namespace astrai::dashboard
