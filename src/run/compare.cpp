#include "run/compare.h"

#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/write_rules.h"
#include "run/config.h"
#include "run/run.h"
#include "data/data.h"

namespace nibble::train {

namespace fs = std::filesystem;

RunSummary summarize_run(const fs::path& run_dir) {
  RunSummary s;
  s.dir = run_dir;
  s.name = run_dir.filename().empty() ? run_dir.parent_path().filename().string() : run_dir.filename().string();
  s.history = read_metrics(run_dir / kRunMetricsFile);
  if (s.history.steps.empty())
    throw UsageError(fmt::format("{}: metrics.jsonl has no training record yet (was the run started?)", run_dir.string()));
  const fs::path config = run_dir / kRunConfigFile;
  s.quantization = "?";
  if (fs::exists(config)) {
    RunConfig c;
    try {
      apply_config_yaml(c, read_text_file(config.string()), config.string());
      s.quantization = std::string(to_string(c.train.recipe.quantization));
    } catch (const UsageError&) {
      // A config this nibble no longer reads still leaves a comparable loss curve.
    }
  }
  const StepRecord& last = s.history.steps.back();
  s.steps = last.step;
  s.tokens = last.tokens;
  s.final_train_loss = last.loss;
  s.wall_s = last.elapsed_s;
  for (const auto& e : s.history.evals) s.wall_s = std::max(s.wall_s, e.elapsed_s);
  std::vector<double> speeds;
  for (const auto& r : s.history.steps)
    if (std::isfinite(r.tokens_per_s) && r.tokens_per_s > 0) speeds.push_back(r.tokens_per_s);
  if (!speeds.empty()) {
    std::nth_element(speeds.begin(), speeds.begin() + speeds.size() / 2, speeds.end());
    s.tokens_per_s = speeds[speeds.size() / 2];
  }
  s.best_val_loss = INFINITY;
  for (const auto& e : s.history.evals)
    if (std::isfinite(e.val_loss)) {
      s.has_val = true;
      s.final_val_loss = e.val_loss;
      s.best_val_loss = std::min(s.best_val_loss, e.val_loss);
    }
  return s;
}

std::string comparison_table(const std::vector<RunSummary>& runs) {
  size_t name_width = 3;
  for (const auto& r : runs) name_width = std::max(name_width, r.name.size());
  std::string out = fmt::format("{:<{}}  {:<12} {:>7} {:>9} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9}\n", "run", name_width,
                                "quantization", "steps", "tokens", "train loss", "val loss", "best val", "gap", "tokens/s",
                                "time");
  const double reference = !runs.empty() && runs[0].has_val ? runs[0].final_val_loss : NAN;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    std::string gap = "-";
    if (i == 0) gap = "(ref)";
    else if (r.has_val && std::isfinite(reference)) gap = fmt::format("{:+.2f}%", 100.0 * (r.final_val_loss / reference - 1.0));
    out += fmt::format("{:<{}}  {:<12} {:>7} {:>9} {:>10.4f} {:>9} {:>9} {:>9} {:>10} {:>9}\n", r.name, name_width,
                       r.quantization, r.steps, format_si(static_cast<double>(r.tokens)), r.final_train_loss,
                       r.has_val ? fmt::format("{:.4f}", r.final_val_loss) : "-",
                       r.has_val ? fmt::format("{:.4f}", r.best_val_loss) : "-", gap, format_si(r.tokens_per_s),
                       format_duration(r.wall_s));
  }
  if (runs.size() > 1) out += "gap: final validation loss relative to the first run\n";
  out += "val loss: each run's last evaluation in training (eval.batches batches at fixed places of its validation "
         "tokens); `nibble eval RUN` averages every window instead\n";
  return out;
}

namespace {

// 1, 2 or 5 times a power of ten: about `count` ticks over [lo, hi].
double tick_step(double lo, double hi, int count) {
  const double raw = (hi - lo) / count;
  if (!(raw > 0)) return 1;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * magnitude) return m * magnitude;
  return 10 * magnitude;
}

cairo_status_t append_png(void* closure, const unsigned char* data, unsigned int length) {
  auto* out = static_cast<std::vector<uint8_t>*>(closure);
  out->insert(out->end(), data, data + length);
  return CAIRO_STATUS_SUCCESS;
}

constexpr double kPalette[][3] = {{0.12, 0.47, 0.71}, {0.84, 0.15, 0.16}, {0.17, 0.63, 0.17}, {1.0, 0.5, 0.05},
                                  {0.58, 0.4, 0.74},  {0.55, 0.34, 0.29}, {0.89, 0.47, 0.76}, {0.5, 0.5, 0.5}};

// The plot's geometry: the image, the plot area inside its margins, and the data ranges it spans.
struct PlotFrame {
  int width = 1000, height = 620;
  double left = 80, right = 30, top = 50, bottom = 70;
  double x_max = 0, y_min = INFINITY, y_max = -INFINITY;
  double plot_w = 0, plot_h = 0;
  double px(double tokens) const { return left + plot_w * tokens / x_max; }
  double py(double loss) const { return top + plot_h * (1.0 - (loss - y_min) / (y_max - y_min)); }
};

// Tokens from 0 to the last recorded; losses over every finite train and validation point, padded.
PlotFrame frame_for(const std::vector<RunSummary>& runs) {
  PlotFrame f;
  for (const auto& r : runs) {
    for (const auto& s : r.history.steps)
      if (std::isfinite(s.loss)) {
        f.x_max = std::max(f.x_max, static_cast<double>(s.tokens));
        f.y_min = std::min(f.y_min, s.loss);
        f.y_max = std::max(f.y_max, s.loss);
      }
    for (const auto& e : r.history.evals)
      if (std::isfinite(e.val_loss)) {
        f.x_max = std::max(f.x_max, static_cast<double>(e.tokens));
        f.y_min = std::min(f.y_min, e.val_loss);
        f.y_max = std::max(f.y_max, e.val_loss);
      }
  }
  if (!(f.x_max > 0) || !std::isfinite(f.y_min)) throw UsageError("the runs have no finite loss to plot");
  if (f.y_max - f.y_min < 1e-6) {
    f.y_min -= 0.5;
    f.y_max += 0.5;
  }
  const double pad = 0.04 * (f.y_max - f.y_min);
  f.y_min -= pad;
  f.y_max += pad;
  f.plot_w = f.width - f.left - f.right;
  f.plot_h = f.height - f.top - f.bottom;
  return f;
}

// Grid and tick labels, the frame, the axis labels and the title.
void draw_axes(cairo_t* cr, const PlotFrame& f) {
  const double ys = tick_step(f.y_min, f.y_max, 8), xs = tick_step(0, f.x_max, 8);
  cairo_set_line_width(cr, 1);
  for (double y = std::ceil(f.y_min / ys) * ys; y <= f.y_max; y += ys) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, f.left, f.py(y));
    cairo_line_to(cr, f.left + f.plot_w, f.py(y));
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    const std::string label = fmt::format("{:.2f}", y);
    cairo_move_to(cr, f.left - 45, f.py(y) + 4);
    cairo_show_text(cr, label.c_str());
  }
  for (double x = 0; x <= f.x_max * 1.0001; x += xs) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, f.px(x), f.top);
    cairo_line_to(cr, f.px(x), f.top + f.plot_h);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    const std::string label = format_si(x);
    cairo_move_to(cr, f.px(x) - 12, f.top + f.plot_h + 18);
    cairo_show_text(cr, label.c_str());
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, f.left, f.top, f.plot_w, f.plot_h);
  cairo_stroke(cr);
  cairo_move_to(cr, f.left + f.plot_w / 2 - 40, f.height - 25);
  cairo_show_text(cr, "training tokens");
  cairo_save(cr);
  cairo_move_to(cr, 22, f.top + f.plot_h / 2 + 15);
  cairo_rotate(cr, -M_PI / 2);
  cairo_show_text(cr, "loss");
  cairo_restore(cr);
  cairo_set_font_size(cr, 16);
  cairo_move_to(cr, f.left, 30);
  cairo_show_text(cr, "loss vs training tokens (thin: train, thick with points: validation)");
}

// Each run's curves, clipped to the plot area: train thin and translucent, validation thick with points.
void draw_curves(cairo_t* cr, const PlotFrame& f, const std::vector<RunSummary>& runs) {
  cairo_rectangle(cr, f.left, f.top, f.plot_w, f.plot_h);
  cairo_clip(cr);
  for (size_t i = 0; i < runs.size(); ++i) {
    const double* c = kPalette[i % std::size(kPalette)];
    cairo_set_source_rgba(cr, c[0], c[1], c[2], 0.45);
    cairo_set_line_width(cr, 1.2);
    bool started = false;
    for (const auto& s : runs[i].history.steps) {
      if (!std::isfinite(s.loss)) continue;
      if (started) cairo_line_to(cr, f.px(static_cast<double>(s.tokens)), f.py(s.loss));
      else cairo_move_to(cr, f.px(static_cast<double>(s.tokens)), f.py(s.loss));
      started = true;
    }
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    cairo_set_line_width(cr, 2.5);
    started = false;
    for (const auto& e : runs[i].history.evals) {
      if (!std::isfinite(e.val_loss)) continue;
      if (started) cairo_line_to(cr, f.px(static_cast<double>(e.tokens)), f.py(e.val_loss));
      else cairo_move_to(cr, f.px(static_cast<double>(e.tokens)), f.py(e.val_loss));
      started = true;
    }
    cairo_stroke(cr);
    for (const auto& e : runs[i].history.evals) {
      if (!std::isfinite(e.val_loss)) continue;
      cairo_arc(cr, f.px(static_cast<double>(e.tokens)), f.py(e.val_loss), 3.5, 0, 2 * M_PI);
      cairo_fill(cr);
    }
  }
  cairo_reset_clip(cr);
}

// Legend, top right: each run's colour, name, recipe and final validation loss. As wide as its
// longest label (a sweep's run names are long), the font made smaller until it fits the plot.
void draw_legend(cairo_t* cr, const PlotFrame& f, const std::vector<RunSummary>& runs) {
  std::vector<std::string> labels;
  for (const auto& r : runs)
    labels.push_back(r.has_val ? fmt::format("{} ({}) val {:.4f}", r.name, r.quantization, r.final_val_loss)
                               : fmt::format("{} ({})", r.name, r.quantization));
  double size = 13, widest = 0;
  for (; size >= 8; size -= 1) {
    cairo_set_font_size(cr, size);
    widest = 0;
    for (const auto& label : labels) {
      cairo_text_extents_t e;
      cairo_text_extents(cr, label.c_str(), &e);
      widest = std::max(widest, e.x_advance);
    }
    if (widest + 45 <= f.plot_w) break;
  }
  const double x = std::max(f.left + 10, f.left + f.plot_w - widest - 40);
  for (size_t i = 0; i < runs.size(); ++i) {
    const double* c = kPalette[i % std::size(kPalette)];
    const double y = f.top + 20 + (size + 7) * static_cast<double>(i);
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    cairo_rectangle(cr, x, y - size * 0.7, 18, size * 0.75);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    cairo_move_to(cr, x + 25, y);
    cairo_show_text(cr, labels[i].c_str());
  }
}

}  // namespace

void plot_loss_curves(const std::vector<RunSummary>& runs, const fs::path& png_path) {
  if (runs.empty()) throw UsageError("nothing to plot: give at least one run directory");
  const PlotFrame frame = frame_for(runs);
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, frame.width, frame.height);
  cairo_t* cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 13);
  draw_axes(cr, frame);
  draw_curves(cr, frame, runs);
  draw_legend(cr, frame, runs);

  std::vector<uint8_t> png;
  cairo_surface_flush(surface);
  const cairo_status_t status = cairo_surface_write_to_png_stream(surface, append_png, &png);
  cairo_destroy(cr);
  cairo_surface_destroy(surface);
  if (status != CAIRO_STATUS_SUCCESS)
    throw UsageError(fmt::format("cairo could not encode the plot: {}", cairo_status_to_string(status)));
  io::write_output_file(png_path, png);
}

}  // namespace nibble::train
