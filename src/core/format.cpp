#include "core/format.h"

#include <cmath>
#include <cstdio>

namespace soltrain {

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!std::isfinite(bytes) || bytes < 0) return "?";
  int u = 0;
  while (bytes >= 1023.5 && u < 5) bytes /= 1024, ++u;  // (1023.5 B would round to "1024 B")
  char b[32];
  if (u == 0) {
    std::snprintf(b, sizeof b, "%.0f B", bytes);
    return b;
  }
  // Three significant digits, then the zeros after the point dropped: 8.00 → 8, 41.50 → 41.5.
  std::snprintf(b, sizeof b, bytes >= 99.95 ? "%.0f" : bytes >= 9.995 ? "%.1f" : "%.2f", bytes);
  std::string s = b;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s + " " + units[u];
}

}  // namespace soltrain
