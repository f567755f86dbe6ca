#include "core/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

using Bytes = std::optional<uint64_t>;

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Bytes parse_u64(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// A file holding one number. A file that is missing or unparseable reads as unknown: these are the kernel's
// files, not the user's, and a figure we cannot read must not stop a run.
Bytes read_number(const fs::path& p) {
  const auto text = read_text(p);
  return text ? parse_u64(*text) : std::nullopt;
}

// "key value" lines (memory.stat), or "Key:   value kB" lines (/proc/meminfo, scaled by the unit).
Bytes read_field(const fs::path& p, std::string_view key) {
  const auto text = read_text(p);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string k, value, unit;
    words >> k >> value >> unit;
    if (!k.empty() && k.back() == ':') k.pop_back();
    if (k != key) continue;
    const Bytes v = parse_u64(value);
    if (!v) return std::nullopt;
    return unit == "kB" ? *v * 1024 : *v;
  }
  return std::nullopt;
}

// Field `i` of /proc/self/statm (0: virtual size, 1: resident), in bytes; 0 when unread.
uint64_t own_statm_bytes(int i) {
  const auto statm = read_text("/proc/self/statm");
  if (!statm) return 0;
  std::istringstream in(*statm);
  uint64_t v = 0;
  for (int k = 0; k <= i; ++k) in >> v;
  return in ? v * uint64_t(::sysconf(_SC_PAGESIZE)) : 0;
}

// An environment variable holding a size: "3000000000", "512M", "3G".
Bytes env_bytes(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  std::string s = v;
  uint64_t unit = 1;
  switch (s.back()) {
    case 'K':
    case 'k': unit = uint64_t(1) << 10; break;
    case 'M':
    case 'm': unit = uint64_t(1) << 20; break;
    case 'G':
    case 'g': unit = uint64_t(1) << 30; break;
    default: break;
  }
  if (unit > 1) s.pop_back();
  const Bytes n = parse_u64(s);
  return n ? Bytes(*n * unit) : std::nullopt;
}

struct Cgroup {
  Bytes limit, usage, inactive_file;
  std::string name;
};

// v2 when memory.max exists, else v1; a limit of "max" (v2) is no limit. v1 writes "no limit" as a huge
// number (2^63 rounded down to a page), which the minimum with MemTotal takes care of.
std::optional<Cgroup> read_cgroup(const fs::path& root) {
  if (const auto max = read_text(root / "memory.max")) {
    Cgroup c;
    c.name = "cgroup v2 memory.max";
    if (max->rfind("max", 0) != 0) c.limit = parse_u64(*max);
    c.usage = read_number(root / "memory.current");
    c.inactive_file = read_field(root / "memory.stat", "inactive_file");
    return c;
  }
  const fs::path v1 = root / "memory";
  if (const Bytes limit = read_number(v1 / "memory.limit_in_bytes")) {
    Cgroup c;
    c.name = "cgroup v1 memory.limit_in_bytes";
    c.limit = limit;
    c.usage = read_number(v1 / "memory.usage_in_bytes");
    c.inactive_file = read_field(v1 / "memory.stat", "total_inactive_file");
    return c;
  }
  return std::nullopt;
}

std::string gib(uint64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << double(bytes) / double(uint64_t(1) << 30) << " GiB";
  return s.str();
}

}  // namespace

HostMemory read_host_memory(const HostMemoryFiles& files) {
  Bytes limit = read_field(files.meminfo, "MemTotal"), available = read_field(files.meminfo, "MemAvailable");
  std::string limit_from = "MemTotal";
  if (const auto cg = read_cgroup(files.cgroup_root); cg && cg->limit) {
    if (!limit || *cg->limit < *limit) limit = cg->limit, limit_from = cg->name;
    // The page cache counts in the cgroup's usage but is given back under pressure, so what a process can
    // still get is the limit less the working set (usage - inactive_file), as `docker stats` and the kubelet
    // count it. Without a usage figure: the whole limit.
    uint64_t cg_available = *cg->limit;
    if (cg->usage) {
      const uint64_t working_set = *cg->usage - std::min(*cg->usage, cg->inactive_file.value_or(0));
      cg_available = *cg->limit > working_set ? *cg->limit - working_set : 0;
    }
    available = available ? std::min(*available, cg_available) : cg_available;
  }
  // `ulimit -v` (RLIMIT_AS) bounds this process's address space whatever the machine has: what is left of it
  // is what an allocation can still get (malloc fails past it, with no word of which input asked).
  // SOLTRAIN_HOST_MEMORY_LIMIT (bytes, or with K/M/G) caps the resident memory the checks allow: for a machine
  // shared with other jobs, and the fuzz job (whose sanitizers rule out ulimit -v) makes a bomb a failure with it.
  if (files.meminfo == HostMemoryFiles{}.meminfo) {
    // A cap on what this process uses (`used`: its resident or virtual size) lowers both figures.
    auto cap_by = [&](uint64_t cap, uint64_t used, const char* from) {
      if (!limit || cap < *limit) limit = cap, limit_from = from;
      const uint64_t left = cap > used ? cap - used : 0;
      available = available ? std::min(*available, left) : left;
    };
    if (const Bytes cap = env_bytes("SOLTRAIN_HOST_MEMORY_LIMIT"))
      cap_by(*cap, own_statm_bytes(1), "SOLTRAIN_HOST_MEMORY_LIMIT");
    rlimit as{};
    if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
      cap_by(as.rlim_cur, own_statm_bytes(0), "ulimit -v");
  }
  HostMemory m;
  if (!limit && !available) return m;  // nothing read: unknown
  m.known = true;
  // One figure alone bounds the other (a meminfo without MemAvailable: kernels before 3.14).
  m.limit = limit.value_or(*available);
  m.limit_from = limit ? limit_from : "MemAvailable";
  m.available = std::min(available.value_or(m.limit), m.limit);
  return m;
}

std::string host_memory_refusal(uint64_t bytes, const HostMemory& m, std::string_view what, std::string_view hint) {
  if (!m.known || bytes <= m.available) return "";
  return cat("out of host memory: ", what, " needs ", gib(bytes), ", ", gib(m.available), " available of a ",
             gib(m.limit), " limit (", m.limit_from, "): ", hint);
}

void check_host_memory(uint64_t bytes, std::string_view what, std::string_view hint) {
  const std::string refusal = host_memory_refusal(bytes, read_host_memory(), what, hint);
  if (!refusal.empty()) throw UserError(refusal);
}

std::string describe_host_memory(const HostMemory& m) {
  if (!m.known) return "unknown (no /proc/meminfo or cgroup files)";
  return cat(gib(m.limit), " limit (", m.limit_from, "), ", gib(m.available), " available");
}

}  // namespace soltrain
