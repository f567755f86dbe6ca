// Inputs soltrain used to take silently or report unclearly (issue 28): synonyms given together with
// different values, AdamW betas of 1, a damaged DPO reference cache, an adapter with an absurd rank or NaN
// weights, CSV files with invalid UTF-8, a byte order mark, old Mac line ends or 10^5 columns.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "cli/config.h"
#include "cli/demo_kit.h"
#include "data/record_reader.h"
#include "fault_test_util.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/peft_adapter.h"

namespace soltrain::test {
namespace {

namespace fs = std::filesystem;

// The config error of `yaml` ("" when it parses).
std::string config_error(const std::string& yaml, const std::vector<std::string>& set = {}) {
  try {
    parse_train_config("output_dir: o\ndatasets: [d.jsonl]\n" + yaml, "c.yaml", set, TrainMode::kSft);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(SilentInputs, SynonymsGivenTogetherMustAgree) {
  const std::pair<const char*, const char*> conflicting[] = {
      {"model: m\nmicro_batch_size: 2\nper_device_train_batch_size: 4\n", "micro_batch_size"},
      {"model: m\nlr_scheduler: cosine\nlr_scheduler_type: linear\n", "lr_scheduler"},
      {"model: m\nlora: true\nlora_r: 8\nlora_rank: 16\n", "lora_r"},
      {"base_model: a\nmodel: b\n", "base_model"},
      {"model: m\nnum_epochs: 1\nnum_train_epochs: 3\n", "num_epochs"},
      {"model: m\ngradient_checkpointing: true\nrecompute: none\n", "gradient_checkpointing"},
      {"model: m\nloss_scale: all\ntrain_on_inputs: false\n", "loss_scale"},
      {"model: m\nadapter: lora\nlora: false\n", "adapter"},
      {"model: m\nfp8: true\nrecipe: bf16\n", "fp8"},
      {"model: m\nval_set_size: 0.1\nvalidation_split_ratio: 0.2\n", "val_set_size"},
  };
  for (const auto& [yaml, key] : conflicting) {
    const std::string e = config_error(yaml);
    EXPECT_NE(e.find("are the same setting with different values"), std::string::npos) << yaml << "\n" << e;
    EXPECT_NE(e.find(key), std::string::npos) << e;
  }
  // Agreeing synonyms are fine (numbers by value, booleans by truth), and an override replaces the file's.
  for (const char* yaml :
       {"model: m\nmicro_batch_size: 2\nper_device_train_batch_size: 2\n", "model: m\nlearning_rate: 1e-4\n",
        "model: m\nlora_r: 8\nlora_rank: 8\nlora: true\n", "model: m\ngradient_checkpointing: true\nrecompute: full\n",
        "model: m\nadapter: lora\nlora: true\n"})
    EXPECT_EQ(config_error(yaml), "") << yaml;
  const TrainConfig c = parse_train_config("model: m\noutput_dir: o\ndatasets: [d.jsonl]\nlr_scheduler_type: linear\n",
                                           "c.yaml", {"lr_scheduler=cosine"}, TrainMode::kSft);
  EXPECT_EQ(c.lr_scheduler_type, ScheduleType::kCosine);
}

TEST(SilentInputs, AdamBetasOfOneAreRefusedAsTorchDoes) {
  for (const char* k : {"adamw_beta1", "adamw_beta2"}) {
    const std::string e = config_error(std::string("model: m\n") + k + ": 1\n");
    EXPECT_NE(e.find(std::string(k) + ": \"1\" is not valid: expected a number in [0, 1)"), std::string::npos) << e;
    EXPECT_EQ(config_error(std::string("model: m\n") + k + ": 0.999\n"), "");
  }
}

// A LoRA adapter folder for the demo-shaped model in `dir`, from a short CPU run.
fs::path trained_adapter(const TinyRun& r) {
  const CliRun run =
      run_bounded("sft " + r.config("model: model\noutput_dir: run\nlora: true\nlora_rank: 4\n"), r.t, 60);
  EXPECT_EQ(run.code, 0) << run.err;
  return r.t.path / "run" / "adapter";
}

TEST(SilentInputs, AdaptersWithAnAbsurdRankOrNanWeightsAreRefused) {
  TinyRun r;
  const fs::path adapter = trained_adapter(r);
  // r: 2^40 used to wrap to 0 ("got 0").
  const fs::path big = r.t.path / "big";
  fs::copy(adapter, big);
  auto cfg = nlohmann::json::parse(read_text(big / "adapter_config.json"));
  cfg["r"] = 1099511627776;
  write_text(big / "adapter_config.json", cfg.dump());
  expect_refused(run_bounded("merge --model " + (r.t.path / "model").string() + " --adapter " + big.string() +
                                 " --out " + (r.t.path / "m1").string(),
                             r.t, 30),
                 "\"r\" must be an integer from 1 to 1048576, got 1099511627776");
  // One NaN in lora_B.
  const fs::path nan = r.t.path / "nan";
  fs::copy(adapter, nan);
  {
    const SafetensorsFile f(adapter / "adapter_model.safetensors");
    std::vector<std::vector<float>> values;
    std::vector<StreamedTensor> tensors;
    for (const auto& [name, e] : f.entries()) {
      values.push_back(to_f32(e));
      if (name.find("lora_B") != std::string::npos) values.back()[0] = std::nanf("");
      const float* v = values.back().data();
      const size_t bytes = values.back().size() * sizeof(float);
      tensors.push_back({name, DType::F32, e.shape, [v, bytes](void* dst) { std::memcpy(dst, v, bytes); }});
    }
    fs::remove(nan / "adapter_model.safetensors");
    write_safetensors_streamed(nan / "adapter_model.safetensors", tensors);
  }
  expect_refused(run_bounded("merge --model " + (r.t.path / "model").string() + " --adapter " + nan.string() +
                                 " --out " + (r.t.path / "m2").string(),
                             r.t, 30),
                 "holds NaN");
  EXPECT_FALSE(fs::exists(r.t.path / "m2"));
}

struct ReadBack {
  std::vector<nlohmann::ordered_json> records;
  std::vector<std::string> errors;  // "where: error" of each record that could not be read
};

ReadBack read_all(const fs::path& p) {
  RecordReader reader(p);
  ReadBack out;
  nlohmann::ordered_json r;
  std::string where, error;
  while (reader.next(r, where, error)) {
    if (r.is_null())
      out.errors.push_back(where + ": " + error);
    else
      out.records.push_back(r);
  }
  return out;
}

TEST(SilentInputs, CsvFilesAsPandasReadsThem) {
  TempDir t;
  auto records = [&](const std::string& name, const std::string& bytes) {
    write_text(t.path / name, bytes);
    return read_all(t.path / name);
  };
  // A byte order mark (Excel) is not part of the first column's name.
  const auto bom = records("bom.csv", "\xEF\xBB\xBFinstruction,output\nhi,there\n");
  ASSERT_EQ(bom.records.size(), 1u);
  EXPECT_EQ(bom.records[0]["instruction"], "hi");
  // Old Mac line ends (a lone \r).
  const auto mac = records("mac.csv", "instruction,output\ra,b\rc,d\r");
  ASSERT_EQ(mac.records.size(), 2u);
  EXPECT_EQ(mac.records[1]["output"], "d");
  // Invalid UTF-8: that record alone is bad, named by file and line (bad_records: skip drops it, the default
  // stops there with this line).
  const auto bad = records("bad.csv", "instruction,output\nok,fine\n\xff\xfe,x\nalso,fine\n");
  EXPECT_EQ(bad.records.size(), 2u);
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].find("bad.csv:3: column \"instruction\" is not valid UTF-8"), std::string::npos)
      << bad.errors[0];
  // 200k columns: read in linear time (quadratic took 38 s).
  std::string header, row;
  for (int i = 0; i < 200000; ++i) header += (i ? "," : "") + cat("c", i), row += (i ? "," : "") + cat(i);
  const auto start = std::chrono::steady_clock::now();
  const auto wide = records("wide.csv", header + "\n" + row + "\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(wide.records.size(), 1u);
  EXPECT_EQ(wide.records[0]["c199999"], "199999");
}

TEST(SilentInputs, BadCsvRecordsAreSkippedOnAsk) {
  TinyRun r;
  write_text(r.t.path / "bad.csv",
             "instruction,output\nreverse abc,cba\n\xff\xfe,x\nreverse xyz,zyx\nreverse def,fed\n");
  const std::string base = "model: model\ndatasets: [{path: bad.csv, type: alpaca}]\n";
  expect_refused(run_bounded("sft " + r.config(base + "output_dir: out\n"), r.t, 30),
                 "bad.csv:3: column \"instruction\" is not valid UTF-8");
  const CliRun skip = run_bounded("sft " + r.config(base + "bad_records: skip\noutput_dir: out2\n"), r.t, 60);
  EXPECT_EQ(skip.code, 0) << skip.err;
  // That row, and only it, was passed over: three documents written, one record counted as skipped.
  const auto m = nlohmann::json::parse(read_text(r.t.path / "out2" / "prepared" / "train-0-bad" / "manifest.json"));
  EXPECT_EQ(m["documents"], 3) << m.dump();
  EXPECT_EQ(m["skipped_records"], 1) << m.dump();
}

// A dataset file whose name holds a newline and an escape sequence (a hub file can): its shard folder's name
// carries neither.
TEST(SilentInputs, ShardFolderNamesCarryNoControlCharacters) {
  TinyRun r;
  const std::string odd = "odd\n\x1b[31mname.jsonl";
  fs::copy_file(r.t.path / "train.jsonl", r.t.path / odd);
  const CliRun run =
      run_bounded("sft " + r.config("model: model\noutput_dir: out\ndatasets: [{path: \"odd\\n\\e[31mname.jsonl\", "
                                    "type: conversation}]\n"),
                  r.t, 60);
  ASSERT_EQ(run.code, 0) << run.err;
  bool found = false;
  for (const auto& e : fs::directory_iterator(r.t.path / "out" / "prepared")) {
    const std::string n = e.path().filename().string();
    EXPECT_EQ(n.find_first_of("\n\x1b"), std::string::npos) << n;
    found = found || n == "train-0-odd___31mname";
  }
  EXPECT_TRUE(found);
}

TEST(SilentInputs, GenerateNamesAnInvalidPrompt) {
  TinyRun r;
  expect_refused(
      run_bounded("generate --model " + (r.t.path / "model").string() + " --prompt \"$(printf '\\377')\" --device cpu",
                  r.t, 30),
      "--prompt: not valid UTF-8");
}

}  // namespace
}  // namespace soltrain::test
