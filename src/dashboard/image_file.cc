#include "dashboard/image_file.h"

#include <cairo.h>
#include <librsvg/rsvg.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "base/error.h"
#include "base/files.h"

namespace astrai::dashboard {

namespace fs = std::filesystem;

std::string image_format(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".svg" || ext == ".png") return ext.substr(1);
  fail("--output ", path, ": unsupported image type \"", ext.empty() ? std::string("(no extension)") : ext,
       "\" (use .png or .svg)");
}

namespace {

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

}  // namespace

std::string svg_to_png(const std::string& svg, int width, int height) {
  GError* error = nullptr;
  RsvgHandle* handle = rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), svg.size(), &error);
  if (!handle) {
    const std::string why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
    fail("cannot read the plot's SVG: ", why);
  }
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, width, height);
  cairo_t* cr = cairo_create(surface);
  const RsvgRectangle viewport{0, 0, static_cast<double>(width), static_cast<double>(height)};
  const gboolean drawn = rsvg_handle_render_document(handle, cr, &viewport, &error);
  std::string png;
  cairo_status_t status = cairo_status(cr);
  if (drawn && status == CAIRO_STATUS_SUCCESS) {
    cairo_surface_flush(surface);
    status = cairo_surface_write_to_png_stream(surface, append_bytes, &png);
  }
  cairo_destroy(cr);
  cairo_surface_destroy(surface);
  g_object_unref(handle);
  if (!drawn) {
    const std::string why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
    fail("cannot draw the plot: ", why);
  }
  ASTRAI_CHECK(status == CAIRO_STATUS_SUCCESS, "cannot encode the plot as PNG: ", cairo_status_to_string(status));
  return png;
}

void write_figure(const std::string& path, const std::vector<Panel>& panels, const FigureSize& size) {
  const std::string format = image_format(path);
  const fs::path parent = fs::absolute(path).parent_path();
  std::error_code ec;
  ASTRAI_CHECK(fs::is_directory(parent, ec), "--output ", path, ": directory ", parent.string(), " does not exist");
  ASTRAI_CHECK(!fs::is_directory(path, ec), "--output ", path, " is a directory");
  const std::string svg = figure_svg(panels, size);
  const std::string bytes = format == "svg" ? svg : svg_to_png(svg, size.width, size.height);
  try {
    write_file_atomic(path, bytes);
  } catch (const Error& e) {
    fail("--output ", path, ": cannot write it (", e.what(), ")");
  }
}

}  // namespace astrai::dashboard
