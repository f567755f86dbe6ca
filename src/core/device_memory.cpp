#include "core/device_memory.h"

#include <mutex>
#include <unordered_map>

namespace soltrain {

namespace {
struct Ledger {
  std::mutex m;
  std::unordered_map<void*, size_t> held;
  DeviceMemory totals;
};
Ledger& ledger() {
  static Ledger* l = new Ledger;  // (never destroyed: buffers freed during static destruction still find it)
  return *l;
}
}  // namespace

void device_allocated(void* p, size_t bytes) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> g(l.m);
  l.held[p] = bytes;
  l.totals.live += bytes;
  if (l.totals.live > l.totals.peak) l.totals.peak = l.totals.live;
}

void device_freed(void* p) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> g(l.m);
  const auto it = l.held.find(p);
  if (it == l.held.end()) return;
  l.totals.live -= it->second;
  l.held.erase(it);
}

DeviceMemory device_memory() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> g(l.m);
  return l.totals;
}

void reset_device_peak() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> g(l.m);
  l.totals.peak = l.totals.live;
}

}  // namespace soltrain
