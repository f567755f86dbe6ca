#include "model/expert_placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace soltrain {
namespace {

int64_t owner(int64_t expert, int64_t experts, int ranks) {
  return expert / (experts / ranks);
}

}  // namespace

ExpertPlacement native_placement(const std::vector<int64_t>& rows, int ranks) {
  const int64_t E = int64_t(rows.size());
  SOLTRAIN_CHECK(ranks > 0 && E % ranks == 0, "expert placement: ", E, " experts over ", ranks, " ranks");
  ExpertPlacement p(rows.size());
  for (int64_t e = 0; e < E; ++e)
    if (rows[size_t(e)] > 0) p[size_t(e)].push_back({int(owner(e, E, ranks)), 0, rows[size_t(e)]});
  return p;
}

std::vector<int64_t> placement_loads(const ExpertPlacement& p, int ranks) {
  std::vector<int64_t> load(size_t(ranks), 0);
  for (const auto& chunks : p)
    for (const ExpertChunk& c : chunks) load.at(size_t(c.rank)) += c.end - c.begin;
  return load;
}

double placement_imbalance(const ExpertPlacement& p, int ranks) {
  const std::vector<int64_t> load = placement_loads(p, ranks);
  const int64_t total = std::accumulate(load.begin(), load.end(), int64_t(0));
  if (total == 0) return 1.0;
  return double(*std::max_element(load.begin(), load.end())) * double(ranks) / double(total);
}

ExpertPlacement least_loaded_placement(const std::vector<int64_t>& rows, int ranks, double capacity, int64_t min_rows) {
  const int64_t E = int64_t(rows.size());
  SOLTRAIN_CHECK(ranks > 0 && E % ranks == 0 && capacity > 0, "expert placement: ", E, " experts over ", ranks,
                 " ranks, capacity ", capacity);
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t(0));
  // m_α = α · Σv / P, whole rows (at least one)
  const int64_t cap = std::max<int64_t>(int64_t(std::ceil(capacity * double(total) / double(ranks))), 1);
  std::vector<int64_t> pending(size_t(ranks), 0), assigned(size_t(ranks), 0);
  for (int64_t e = 0; e < E; ++e) pending[size_t(owner(e, E, ranks))] += rows[size_t(e)];
  auto effective = [&](int g) { return assigned[size_t(g)] + pending[size_t(g)]; };
  auto room = [&](int g) { return cap - effective(g); };

  std::vector<int64_t> order(rows.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rows[size_t(a)] > rows[size_t(b)]; });

  ExpertPlacement p(rows.size());
  for (const int64_t e : order) {
    const int64_t v = rows[size_t(e)];
    if (v <= 0) continue;
    const int n = int(owner(e, E, ranks));
    std::vector<ExpertChunk>& chunks = p[size_t(e)];
    auto give = [&](int g, int64_t begin, int64_t count) {
      chunks.push_back({g, begin, begin + count});
      assigned[size_t(g)] += count;
    };
    pending[size_t(n)] -= v;
    const int64_t native_room = room(n);
    if (native_room >= v) {
      give(n, 0, v);
      continue;
    }
    int64_t done = 0;
    if (native_room > 0) {
      give(n, 0, native_room);
      done = native_room;
    }
    if (ranks == 1) {  // (no other rank: the rest stays home)
      give(n, done, v - done);
      continue;
    }
    while (done < v) {
      const int64_t left = v - done;
      std::vector<int> others;
      for (int g = 0; g < ranks; ++g)
        if (g != n) others.push_back(g);
      std::stable_sort(others.begin(), others.end(), [&](int a, int b) { return effective(a) < effective(b); });
      bool placed = false;
      for (const int h : others) {
        const int64_t c = std::min(left, room(h));
        if (c <= 0 || (c < min_rows && left > c)) continue;
        give(h, done, c);
        done += c;
        placed = true;
        break;
      }
      if (!placed) {  // nobody has useful room: the least loaded takes the rest, over its capacity
        give(others.front(), done, left);
        done = v;
      }
    }
  }
  return p;
}

}  // namespace soltrain
