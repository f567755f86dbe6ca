// Inputs that ask for more memory than there is, or that never end (issue 28): a few hundred KB of .zst or
// .gz expanding to gigabytes, absurd gradient_accumulation_steps or samples, a device or FIFO where a file
// belongs. Each is one `error:` line naming the input, in bounded time, with the user's files unchanged.
// The bombs run under `ulimit -v` so that the refusal, not the machine's size, bounds them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "fault_test_util.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

// `gib` GiB of zero bytes, compressed as .zst or .gz (a few hundred KB either way).
void write_zero_bomb(const fs::path& p, int gib) {
  const std::string zeros(size_t(1) << 20, '\0');
  std::string out;
  if (p.extension() == ".zst") {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
    std::string buf(ZSTD_CStreamOutSize(), '\0');
    for (int i = 0; i <= gib * 1024; ++i) {
      const bool last = i == gib * 1024;
      ZSTD_inBuffer in{zeros.data(), last ? 0 : zeros.size(), 0};
      for (bool done = false; !done;) {
        ZSTD_outBuffer o{buf.data(), buf.size(), 0};
        const size_t left = ZSTD_compressStream2(c, &o, &in, last ? ZSTD_e_end : ZSTD_e_continue);
        out.append(buf.data(), o.pos);
        done = last ? left == 0 : in.pos == in.size;
      }
    }
    ZSTD_freeCCtx(c);
  } else {
    z_stream z{};
    deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // + 16: a gzip header
    std::string buf(1 << 16, '\0');
    for (int i = 0; i <= gib * 1024; ++i) {
      const bool last = i == gib * 1024;
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(zeros.data()));
      z.avail_in = last ? 0 : uInt(zeros.size());
      do {
        z.next_out = reinterpret_cast<Bytef*>(buf.data());
        z.avail_out = uInt(buf.size());
        deflate(&z, last ? Z_FINISH : Z_NO_FLUSH);
        out.append(buf.data(), buf.size() - z.avail_out);
      } while (z.avail_out == 0);
    }
    deflateEnd(&z);
  }
  write_text(p, out);
}

// `soltrain ARGS` under `ulimit -v KB` (bash), bounded in time.
CliRun run_limited(const std::string& args, const TempDir& t, long kb) {
  const std::string cmd = "ulimit -v " + std::to_string(kb) + "; exec timeout -k 5 60 " SOLTRAIN_BIN " " + args + " >" +
                          (t.path / "o").string() + " 2>" + (t.path / "e").string();
  const int status = std::system(("bash -c '" + cmd + "'").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(t.path / "o"), read_text(t.path / "e")};
}

TEST(InputBombs, CompressedDataExpandingPastMemoryIsRefusedNamingTheFile) {
  for (const char* name : {"bomb.jsonl.zst", "bomb.jsonl.gz"}) {
    SCOPED_TRACE(name);
    TinyRun r;
    write_zero_bomb(r.t.path / name, 3);
    EXPECT_LT(fs::file_size(r.t.path / name), 16u << 20);
    const std::string cfg = r.config(std::string("model: model\noutput_dir: out\ndatasets: [") + name + "]\n");
    const auto before = snapshot(r.t.path / name);
    expect_refused(run_limited("sft " + cfg, r.t, 2 << 20), name);
    EXPECT_NE(read_text(r.t.path / "e").find("out of host memory"), std::string::npos) << read_text(r.t.path / "e");
    EXPECT_EQ(snapshot(r.t.path / name), before);
  }
}

// 9.5 KB of parquet whose run-length dictionary indices repeat one 4 KB string 2^22 times (16 GiB).
TEST(InputBombs, AParquetDictionaryBombIsRefusedNamingTheFile) {
  TinyRun r;
  fs::copy_file(fixtures() / "parquet" / "bomb_dictionary.parquet", r.t.path / "bomb.parquet");
  const std::string cfg = r.config("model: model\noutput_dir: out\ndatasets: [{path: bomb.parquet, type: text}]\n");
  expect_refused(run_limited("sft " + cfg, r.t, 2 << 20), "bomb.parquet: row group 0");
  EXPECT_NE(read_text(r.t.path / "e").find("out of host memory"), std::string::npos) << read_text(r.t.path / "e");
}

TEST(InputBombs, AbsurdAccumulationAndSamplesAreRefusedBeforeAllocating) {
  TinyRun r;
  expect_refused(
      run_bounded("sft " + r.config("model: model\noutput_dir: out\ngradient_accumulation_steps: 100000000\n"), r.t,
                  30),
      "lower gradient_accumulation_steps");
  TinyRun s;
  expect_refused(run_bounded("sft " + s.config("model: model\noutput_dir: out\ndatasets:\n  - path: train.jsonl\n"
                                               "    type: conversation\n    samples: 1000000000\n"),
                             s.t, 30),
                 "lower samples");
  // The 10^8 under a 2 GiB host (the refusal must not depend on this machine's free memory).
  expect_refused(run_bounded("sft " + s.config("model: model\noutput_dir: out2\ndatasets:\n  - path: train.jsonl\n"
                                               "    type: conversation\n    samples: 100000000\n"),
                             s.t, 30, "SOLTRAIN_HOST_MEMORY_LIMIT=2G"),
                 "lower samples");
}

TEST(InputBombs, DevicesAndFifosWhereFilesBelongAreNamed) {
  TinyRun r;
  // A dataset path that is a device.
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: out\ndatasets: [/dev/zero]\n"), r.t, 30),
                 "/dev/zero: not a regular file (a device)");
  // A model whose config.json is a link to /dev/zero (read forever before).
  fs::remove(r.t.path / "model" / "config.json");
  fs::create_symlink("/dev/zero", r.t.path / "model" / "config.json");
  r.inputs_changed();
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: out2\n"), r.t, 30),
                 "config.json: not a regular file (a device)");
  // A FIFO there (blocked forever before).
  fs::remove(r.t.path / "model" / "config.json");
  ASSERT_EQ(::mkfifo((r.t.path / "model" / "config.json").c_str(), 0600), 0);
  r.inputs_changed();
  expect_refused(run_bounded("sft " + r.config("model: model\noutput_dir: out2b\n"), r.t, 30),
                 "config.json: not a regular file (a FIFO)");
  // A FIFO as the config file, and as the hub token file (both blocked forever before).
  ASSERT_EQ(::mkfifo((r.t.path / "fifo.yaml").c_str(), 0600), 0);
  expect_refused(run_bounded("sft " + (r.t.path / "fifo.yaml").string(), r.t, 30), "not a regular file (a FIFO)");
  fs::create_directories(r.t.path / "home");
  ASSERT_EQ(::mkfifo((r.t.path / "home" / "token").c_str(), 0600), 0);
  const std::string hub_cfg = r.config("model: org/some-model\noutput_dir: out3\n");
  expect_refused(
      run_bounded("sft " + hub_cfg, r.t, 30, "HF_HOME=" + (r.t.path / "home").string() + " HF_TOKEN= HF_HUB_OFFLINE=1"),
      "token: not a regular file (a FIFO)");
}

}  // namespace
}  // namespace soltrain::test
