// Host memory limits (core/host_memory.h) read from fake /proc/meminfo and cgroup files: v2, v1, "max",
// missing and unreadable files, and the refusal line.
#include <fstream>
#include <regex>
#include <sstream>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "test_util.h"
#include "train/run_training.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t GiB = uint64_t(1) << 30;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// A meminfo as the kernel writes it (values in kB).
std::string meminfo(uint64_t total, uint64_t available) {
  return cat("MemTotal:       ", total / 1024, " kB\nMemFree:        ", available / 2048,
             " kB\nMemAvailable:   ", available / 1024, " kB\nBuffers:          123456 kB\n");
}

struct Fake {
  test::TempDir t;
  HostMemoryFiles files{t.path / "meminfo", t.path / "cgroup"};
};

TEST(HostMemory, CgroupV2LimitBelowMemTotalWins) {
  Fake f;
  write(f.files.meminfo, meminfo(512 * GiB, 500 * GiB));
  write(f.files.cgroup_root / "memory.max", cat(16 * GiB, "\n"));
  write(f.files.cgroup_root / "memory.current", cat(6 * GiB, "\n"));
  // 2 GiB of the usage is page cache the kernel gives back: the working set is 4 GiB.
  write(f.files.cgroup_root / "memory.stat",
        cat("anon 4000\nfile 9000\nactive_file 1\ninactive_file ", 2 * GiB, "\nshmem 0\n"));
  const HostMemory m = read_host_memory(f.files);
  ASSERT_TRUE(m.known);
  EXPECT_EQ(m.limit, 16 * GiB);
  EXPECT_EQ(m.limit_from, "cgroup v2 memory.max");
  EXPECT_EQ(m.available, 12 * GiB);
}

TEST(HostMemory, CgroupV2MaxMeansMeminfo) {
  Fake f;
  write(f.files.meminfo, meminfo(64 * GiB, 40 * GiB));
  write(f.files.cgroup_root / "memory.max", "max\n");
  write(f.files.cgroup_root / "memory.current", cat(50 * GiB, "\n"));
  const HostMemory m = read_host_memory(f.files);
  ASSERT_TRUE(m.known);
  EXPECT_EQ(m.limit, 64 * GiB);
  EXPECT_EQ(m.limit_from, "MemTotal");
  EXPECT_EQ(m.available, 40 * GiB);
}

TEST(HostMemory, MemAvailableBelowTheCgroupsRoomWins) {
  Fake f;
  write(f.files.meminfo, meminfo(64 * GiB, 3 * GiB));  // the machine itself is nearly full
  write(f.files.cgroup_root / "memory.max", cat(32 * GiB, "\n"));
  write(f.files.cgroup_root / "memory.current", cat(1 * GiB, "\n"));
  const HostMemory m = read_host_memory(f.files);
  EXPECT_EQ(m.limit, 32 * GiB);
  EXPECT_EQ(m.available, 3 * GiB);
}

TEST(HostMemory, CgroupV1Limit) {
  Fake f;
  write(f.files.meminfo, meminfo(256 * GiB, 200 * GiB));
  const fs::path v1 = f.files.cgroup_root / "memory";
  write(v1 / "memory.limit_in_bytes", cat(8 * GiB, "\n"));
  write(v1 / "memory.usage_in_bytes", cat(5 * GiB, "\n"));
  write(v1 / "memory.stat", cat("cache 1\ninactive_file 7\ntotal_inactive_file ", 1 * GiB, "\n"));
  const HostMemory m = read_host_memory(f.files);
  EXPECT_EQ(m.limit, 8 * GiB);
  EXPECT_EQ(m.limit_from, "cgroup v1 memory.limit_in_bytes");
  EXPECT_EQ(m.available, 4 * GiB);  // 8 - (5 - 1)
}

TEST(HostMemory, CgroupV1UnlimitedIsMemTotal) {
  Fake f;
  write(f.files.meminfo, meminfo(256 * GiB, 200 * GiB));
  write(f.files.cgroup_root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");
  write(f.files.cgroup_root / "memory" / "memory.usage_in_bytes", cat(10 * GiB, "\n"));
  const HostMemory m = read_host_memory(f.files);
  EXPECT_EQ(m.limit, 256 * GiB);
  EXPECT_EQ(m.limit_from, "MemTotal");
  EXPECT_EQ(m.available, 200 * GiB);
}

TEST(HostMemory, NoCgroupFilesMeansMeminfo) {
  Fake f;
  write(f.files.meminfo, meminfo(16 * GiB, 9 * GiB));
  const HostMemory m = read_host_memory(f.files);
  EXPECT_TRUE(m.known);
  EXPECT_EQ(m.limit, 16 * GiB);
  EXPECT_EQ(m.available, 9 * GiB);
}

TEST(HostMemory, NoMeminfoMeansTheCgroupAlone) {
  Fake f;
  write(f.files.cgroup_root / "memory.max", cat(4 * GiB, "\n"));  // no usage file either: the whole limit
  const HostMemory m = read_host_memory(f.files);
  ASSERT_TRUE(m.known);
  EXPECT_EQ(m.limit, 4 * GiB);
  EXPECT_EQ(m.available, 4 * GiB);
}

TEST(HostMemory, UsageAboveTheLimitLeavesNothing) {
  Fake f;
  write(f.files.meminfo, meminfo(16 * GiB, 9 * GiB));
  write(f.files.cgroup_root / "memory.max", cat(2 * GiB, "\n"));
  write(f.files.cgroup_root / "memory.current", cat(3 * GiB, "\n"));
  EXPECT_EQ(read_host_memory(f.files).available, 0u);
}

TEST(HostMemory, UnreadableFiguresAreIgnoredNotFatal) {
  Fake f;
  write(f.files.meminfo, "MemTotal: lots kB\nMemAvailable:   1048576 kB\n");
  write(f.files.cgroup_root / "memory.max", "12x\n");
  const HostMemory m = read_host_memory(f.files);
  ASSERT_TRUE(m.known);
  EXPECT_EQ(m.available, 1 * GiB);
  EXPECT_EQ(m.limit, 1 * GiB);  // only MemAvailable could be read
  EXPECT_EQ(m.limit_from, "MemAvailable");
}

TEST(HostMemory, NothingReadableIsUnknownAndRefusesNothing) {
  Fake f;
  const HostMemory m = read_host_memory(f.files);
  EXPECT_FALSE(m.known);
  EXPECT_EQ(host_memory_refusal(uint64_t(1) << 60, m, "x"), "");
  EXPECT_NE(describe_host_memory(m).find("unknown"), std::string::npos);
}

TEST(HostMemory, RefusalGivesTheFiguresInOneLine) {
  HostMemory m{true, 16 * GiB, 12 * GiB, "cgroup v2 memory.max"};
  EXPECT_EQ(host_memory_refusal(12 * GiB, m, "the plan"), "");
  const std::string line = host_memory_refusal(13 * GiB, m, "the plan");
  EXPECT_EQ(line,
            "out of host memory: the plan needs 13.00 GiB, 12.00 GiB available of a 16.00 GiB limit (cgroup v2 "
            "memory.max): lower per_device_train_batch_size or sequence_len, or use a smaller model or lora");
  EXPECT_EQ(describe_host_memory(m), "16.00 GiB limit (cgroup v2 memory.max), 12.00 GiB available");
}

// The real machine's files read without error and give a plausible figure (this test runs on Linux).
TEST(HostMemory, ThisMachine) {
  const HostMemory m = read_host_memory();
  ASSERT_TRUE(m.known);
  EXPECT_GT(m.limit, uint64_t(64) << 20);
  EXPECT_LE(m.available, m.limit);
}

// A host buffer past what this machine has left is refused with the figures before anything is touched (the
// allocator alone would say yes under overcommit, and the memset would get the process killed).
TEST(HostMemory, HostBufferBeyondTheLimitIsRefused) {
  const HostMemory m = read_host_memory();
  ASSERT_TRUE(m.known);
  try {
    Buffer::host(size_t(m.limit) + (size_t(1) << 30));
    FAIL() << "allocated more than the limit";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("available of a"), std::string::npos) << e.what();
  }
}

// The memory plan printed before step 1 shows the host side and the real limit.
TEST(HostMemory, MemoryPlanShowsHostMemory) {
  test::TempDir t;
  DemoModelShape shape;
  shape.hidden = 64, shape.layers = 1, shape.heads = 2, shape.kv_heads = 1, shape.intermediate = 128;
  write_random_model(t.path / "model", shape, 3);
  write_reversal_dataset(t.path / "train.jsonl", 20, 4);
  std::ofstream(t.path / "c.yaml") << "model: model\noutput_dir: out\ndatasets:\n  - path: train.jsonl\n"
                                      "    type: conversation\nsequence_len: 64\nmax_steps: 1\ndevice: cpu\n";
  auto ops = make_cpu_ops();
  std::ostringstream log;
  run_training(load_train_config(t.path / "c.yaml", {}, TrainMode::kSft), TrainMode::kSft, *ops, log);
  const std::string text = log.str();
  const size_t at = text.find("sft: host memory: ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string line = text.substr(at, text.find('\n', at) - at);
  EXPECT_TRUE(std::regex_search(line, std::regex(R"(host memory: [0-9.]+ [KMG]iB planned \(batch staging )"))) << line;
  EXPECT_NE(line.find("every buffer above"), std::string::npos) << line;  // the CPU backend's buffers are host's
  EXPECT_NE(line.find(" limit ("), std::string::npos) << line;
  EXPECT_NE(line.find(" available"), std::string::npos) << line;
}

// SOLTRAIN_HOST_MEMORY_LIMIT caps what the checks allow (the fuzz job's budget; a shared machine's).
TEST(HostMemory, AnEnvironmentCapBoundsTheChecks) {
  ::setenv("SOLTRAIN_HOST_MEMORY_LIMIT", "64M", 1);
  const HostMemory m = read_host_memory();
  ::unsetenv("SOLTRAIN_HOST_MEMORY_LIMIT");
  ASSERT_TRUE(m.known);
  EXPECT_EQ(m.limit, uint64_t(64) << 20);
  EXPECT_EQ(m.limit_from, "SOLTRAIN_HOST_MEMORY_LIMIT");
  EXPECT_LT(m.available, uint64_t(64) << 20);  // less what this process already holds
  EXPECT_NE(host_memory_refusal(uint64_t(65) << 20, m, "a test").find("SOLTRAIN_HOST_MEMORY_LIMIT"), std::string::npos);
}

}  // namespace
}  // namespace soltrain
