// output_dir/training_curves.svg: training and validation loss above, learning rate below, drawn from
// metrics.jsonl as plain SVG (no plotting dependency; any browser shows it).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace soltrain {

struct Series {
  std::string name, color;
  std::vector<double> x, y;
  bool points = false;  // markers instead of a line (evaluations are sparse)
};

// One chart: the series scaled into a w × h box at (left, top), axes labelled with their ranges.
std::string svg_chart(const std::vector<Series>& series, const std::string& title, double left, double top, double w,
                      double h);

// Reads metrics.jsonl and writes the two charts to `svg` (atomically).
void write_training_curves(const std::filesystem::path& metrics_jsonl, const std::filesystem::path& svg);

}  // namespace soltrain
