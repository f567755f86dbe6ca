#include "train/curves_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

namespace soltrain {

namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string px(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

}  // namespace

std::string svg_chart(const std::vector<Series>& series, const std::string& title, double left, double top, double w,
                      double h) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  std::string o = "<text x=\"" + px(left) + "\" y=\"" + px(top - 8) + "\" font-size=\"14\">" + title + "</text>\n";
  o += "<rect x=\"" + px(left) + "\" y=\"" + px(top) + "\" width=\"" + px(w) + "\" height=\"" + px(h) +
       "\" fill=\"none\" stroke=\"#888\"/>\n";
  if (!(x0 <= x1)) return o + "<text x=\"" + px(left + 10) + "\" y=\"" + px(top + 20) + "\">no data</text>\n";
  // A flat series still gets a visible band instead of a division by zero.
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y0 -= std::abs(y0) * 0.05 + 1e-12, y1 += std::abs(y1) * 0.05 + 1e-12;
  auto sx = [&](double x) { return left + (x - x0) / (x1 - x0) * w; };
  auto sy = [&](double y) { return top + h - (y - y0) / (y1 - y0) * h; };
  const std::string axis = "font-size=\"11\" fill=\"#444\"";
  o += "<text x=\"" + px(left - 4) + "\" y=\"" + px(top + 10) + "\" text-anchor=\"end\" " + axis + ">" + num(y1) +
       "</text>\n";
  o += "<text x=\"" + px(left - 4) + "\" y=\"" + px(top + h) + "\" text-anchor=\"end\" " + axis + ">" + num(y0) +
       "</text>\n";
  o += "<text x=\"" + px(left) + "\" y=\"" + px(top + h + 14) + "\" " + axis + ">step " + num(x0) + "</text>\n";
  o += "<text x=\"" + px(left + w) + "\" y=\"" + px(top + h + 14) + "\" text-anchor=\"end\" " + axis + ">" + num(x1) +
       "</text>\n";
  double legend_x = left + w - 10;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    const Series& s = *it;
    o += "<text x=\"" + px(legend_x) + "\" y=\"" + px(top + 16) + "\" text-anchor=\"end\" font-size=\"12\" fill=\"" +
         s.color + "\">" + s.name + "</text>\n";
    legend_x -= 9.0 * double(s.name.size()) + 16;
    if (s.points) {
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i]))
          o += "<circle cx=\"" + px(sx(s.x[i])) + "\" cy=\"" + px(sy(s.y[i])) + "\" r=\"3\" fill=\"" + s.color +
               "\"/>\n";
      continue;
    }
    std::string pts;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) pts += px(sx(s.x[i])) + "," + px(sy(s.y[i])) + " ";
    o += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\" points=\"" + pts + "\"/>\n";
  }
  return o;
}

void write_training_curves(const std::filesystem::path& metrics_jsonl, const std::filesystem::path& svg) {
  Series loss{"train loss", "#1f77b4", {}, {}}, eval{"validation loss", "#ff7f0e", {}, {}, true},
      lr{"learning rate", "#2ca02c", {}, {}};
  std::ifstream in(metrics_jsonl);
  std::string l;
  while (std::getline(in, l)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(l);
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    const double step = j.value("step", 0.0);
    auto get = [&](const char* k) { return j[k].is_number() ? j[k].get<double>() : NAN; };
    if (j.contains("loss")) loss.x.push_back(step), loss.y.push_back(get("loss"));
    if (j.contains("learning_rate")) lr.x.push_back(step), lr.y.push_back(get("learning_rate"));
    if (j.contains("eval_loss")) eval.x.push_back(step), eval.y.push_back(get("eval_loss"));
  }
  const double W = 760, H = 560;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(W) + "\" height=\"" + px(H) +
                  "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += svg_chart({loss, eval}, "loss", 70, 30, W - 100, 280);
  s += svg_chart({lr}, "learning rate", 70, 370, W - 100, 150);
  s += "</svg>\n";
  write_file_atomic(svg, s);
}

}  // namespace soltrain
