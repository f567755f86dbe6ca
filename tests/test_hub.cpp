// Hub ids: downloads into huggingface_hub's cache layout from a fake hub on 127.0.0.1 (tests/fake_hub.h),
// the model loading from it, the second run offline from the cache alone, corrupt and interrupted
// transfers, and the one-line errors (401, 404, offline with an empty cache).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "cli/config.h"
#include "cli/dataset_card.h"
#include "cli/demo_kit.h"
#include "cli/hub_inputs.h"
#include "cli_test_util.h"
#include "data_test_util.h"
#include "fake_hub.h"
#include "hub/hub_download.h"
#include "hub/hub_resolve.h"
#include "inputs_guard.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "model/checkpoint.h"
#include "test_util.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;
using test::FakeHub;
using test::FakeRepo;
using test::HubEnv;
using test::ScopedEnv;

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

FakeRepo fixture_model_repo() {
  FakeRepo r = test::fixture_model_repo(kCommit);
  r.files["README.md"] = "not downloaded";
  return r;
}

TEST(Hub, IdsAndCacheLayout) {
  EXPECT_TRUE(looks_like_hub_id("Qwen/Qwen3-0.6B"));
  EXPECT_TRUE(looks_like_hub_id("tatsu-lab/alpaca"));
  for (const char* local : {"model", "./a/b", "../x/y", "/abs/m", "data/train.jsonl", "a/b/c", "a--b/c", "a/.x"})
    EXPECT_FALSE(looks_like_hub_id(local)) << local;
  EXPECT_EQ(repo_folder_name({RepoType::kModel, "Qwen/Qwen3-0.6B"}), "models--Qwen--Qwen3-0.6B");
  EXPECT_EQ(repo_folder_name({RepoType::kDataset, "tatsu-lab/alpaca"}), "datasets--tatsu-lab--alpaca");
  {
    ScopedEnv a("HF_HUB_CACHE", nullptr), b("HUGGINGFACE_HUB_CACHE", nullptr), c("HF_HOME", "/h"), d("HOME", "/u");
    EXPECT_EQ(hub_cache_dir(), fs::path("/h/hub"));
    ScopedEnv e("HF_HUB_CACHE", "/c");
    EXPECT_EQ(hub_cache_dir(), fs::path("/c"));
  }
  {
    ScopedEnv a("HF_HUB_CACHE", nullptr), b("HUGGINGFACE_HUB_CACHE", nullptr), c("HF_HOME", nullptr),
        d("XDG_CACHE_HOME", nullptr), e("HOME", "/u");
    EXPECT_EQ(hub_cache_dir(), fs::path("/u/.cache/huggingface/hub"));
  }
  EXPECT_EQ(normalize_etag("W/\"abc\""), "abc");
  EXPECT_EQ(pick_dataset_files({"README.md", ".gitattributes", "data/train-00000-of-00001.parquet",
                                "data/test-00000-of-00001.parquet", "alpaca_data.json", "dataset_infos.json"}),
            (std::vector<std::string>{"data/train-00000-of-00001.parquet"}));
  EXPECT_EQ(pick_dataset_files({"b.jsonl", "a.jsonl.gz", "notes.txt"}),
            (std::vector<std::string>{"a.jsonl.gz", "b.jsonl"}));
  // another split by its name (Hugging Face's keywords: test / testing / eval / evaluation), and none when no file
  // holds it
  EXPECT_EQ(pick_dataset_files({"data/train-00000-of-00001.parquet", "data/test-00000-of-00001.parquet"}, "test"),
            (std::vector<std::string>{"data/test-00000-of-00001.parquet"}));
  EXPECT_EQ(pick_dataset_files({"train.jsonl", "eval.jsonl"}, "test"), (std::vector<std::string>{"eval.jsonl"}));
  EXPECT_TRUE(pick_dataset_files({"train.jsonl", "dev.jsonl"}, "test").empty());
  EXPECT_TRUE(pick_dataset_files({"b.jsonl"}, "validation").empty());
  // c4's names: the split after a dash, validation files left out of train (a prefix match took them all)
  EXPECT_EQ(pick_dataset_files({"en/c4-train.00000-of-01024.json.gz", "en/c4-train.00001-of-01024.json.gz",
                                "en/c4-validation.00000-of-00008.json.gz"}),
            (std::vector<std::string>{"en/c4-train.00000-of-01024.json.gz", "en/c4-train.00001-of-01024.json.gz"}));
  EXPECT_EQ(pick_dataset_files({"en/c4-train.00000-of-01024.json.gz", "en/c4-validation.00000-of-00008.json.gz"},
                               "validation"),
            (std::vector<std::string>{"en/c4-validation.00000-of-00008.json.gz"}));
  // a word that only starts with a split name is not one (trainer_logs.jsonl is not the train split)
  EXPECT_EQ(pick_dataset_files({"training/a.jsonl", "trainer_logs.jsonl", "testing/b.jsonl"}),
            (std::vector<std::string>{"training/a.jsonl"}));
}

TEST(Hub, ConfigKeepsHubIdsAndRevision) {
  const TrainConfig c = parse_train_config(
      "base_model: Qwen/Qwen3-0.6B\nrevision: v1.0\noutput_dir: o\n"
      "datasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n    revision: refs/convert/parquet\n  - data/x.jsonl\n",
      "dir/cfg.yaml", {}, TrainMode::kSft);
  EXPECT_EQ(c.model_hub_id, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(c.revision, "v1.0");
  ASSERT_EQ(c.datasets.size(), 2u);
  EXPECT_EQ(c.datasets[0].hub_id, "tatsu-lab/alpaca");
  EXPECT_EQ(c.datasets[0].revision, "refs/convert/parquet");
  EXPECT_EQ(c.datasets[1].hub_id, "");
  EXPECT_EQ(c.datasets[1].path, fs::path("data/x.jsonl"));  // base_model: Axolotl's file, from the working folder
  // A local folder of that name wins over the hub.
  test::TempDir t;
  fs::create_directories(t.path / "Org" / "local");
  const TrainConfig l = parse_train_config("model: Org/local\noutput_dir: o\ndatasets: [x.jsonl]\n",
                                           (t.path / "cfg.yaml").string(), {}, TrainMode::kSft);
  EXPECT_EQ(l.model_hub_id, "");
  EXPECT_EQ(l.model, t.path / "Org" / "local");
}

TEST(Hub, FreshCacheDownloadsVerifiesAndLoadsThenOfflineReadsTheCache) {
  std::optional<FakeHub> hub(std::in_place);
  hub->add("models/tiny-org/qwen3-tiny", fixture_model_repo());
  HubEnv env(hub->endpoint());
  std::ostringstream log;
  const HubClient c = hub_client_from_env(log, false);
  const fs::path dir = resolve_hub_model(c, "tiny-org/qwen3-tiny", "main");

  // huggingface_hub's layout: refs/main → commit, snapshots/<commit>/<file> → ../../blobs/<etag>.
  const fs::path repo = env.cache_dir() / "models--tiny-org--qwen3-tiny";
  EXPECT_EQ(dir, repo / "snapshots" / kCommit);
  EXPECT_EQ(read_file(repo / "refs" / "main"), kCommit);
  const std::string bytes = read_file(test::fixtures() / "models" / "qwen3-tiny" / "model.safetensors");
  const std::string sha = sha256_hex(bytes);
  ASSERT_TRUE(fs::is_symlink(dir / "model.safetensors"));
  EXPECT_EQ(fs::read_symlink(dir / "model.safetensors"), fs::path("../../blobs") / sha);
  EXPECT_EQ(read_file(repo / "blobs" / sha), bytes);
  EXPECT_TRUE(fs::is_symlink(dir / "config.json"));
  EXPECT_FALSE(fs::exists(dir / "README.md"));  // only the files soltrain reads
  EXPECT_NE(log.str().find("model.safetensors: 100%"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("sha256 ok"), std::string::npos) << log.str();
  // The token was never sent to the blob storage, and the LFS file came through the redirect.
  bool blob_get = false;
  for (const std::string& r : hub->requests()) {
    EXPECT_EQ(r.find("[auth]"), std::string::npos) << r;
    blob_get = blob_get || r == "GET /cdn/" + sha;
  }
  EXPECT_TRUE(blob_get);

  auto ops = make_cpu_ops();
  const auto model = load_pretrained(dir, *ops);
  const auto ref = load_pretrained(test::fixtures() / "models" / "qwen3-tiny", *ops);
  EXPECT_EQ(model->params().numel(), ref->params().numel());

  hub.reset();  // no server any more
  ScopedEnv offline("HF_HUB_OFFLINE", "1");
  std::ostringstream log2;
  EXPECT_EQ(resolve_hub_model(hub_client_from_env(log2, false), "tiny-org/qwen3-tiny", "main"), dir);
  EXPECT_EQ(log2.str(), "");
}

TEST(Hub, CorruptDownloadIsRefetched) {
  FakeHub hub;
  hub.add("models/tiny-org/qwen3-tiny", fixture_model_repo());
  HubEnv env(hub.endpoint());
  hub.corrupt_next = 1;
  std::ostringstream log;
  const fs::path dir = resolve_hub_model(hub_client_from_env(log, false), "tiny-org/qwen3-tiny", "main");
  EXPECT_NE(log.str().find("does not match the hub's"), std::string::npos) << log.str();
  const std::string bytes = read_file(test::fixtures() / "models" / "qwen3-tiny" / "model.safetensors");
  EXPECT_EQ(read_file(dir / "model.safetensors"), bytes);
  EXPECT_EQ(hub.corrupt_next, 0);
}

TEST(Hub, CorruptEveryTimeIsOneLine) {
  FakeHub hub;
  hub.add("models/tiny-org/qwen3-tiny", fixture_model_repo());
  HubEnv env(hub.endpoint());
  hub.corrupt_next = 100;
  std::ostringstream log;
  try {
    resolve_hub_model(hub_client_from_env(log, false), "tiny-org/qwen3-tiny", "main");
    FAIL() << "a corrupt blob was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("arrived corrupted 3 times"), std::string::npos) << e.what();
  }
  const std::string sha = sha256_hex(read_file(test::fixtures() / "models" / "qwen3-tiny" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(env.cache_dir() / "models--tiny-org--qwen3-tiny" / "blobs" / sha));
}

TEST(Hub, InterruptedDownloadResumesFromIncompleteFile) {
  FakeHub hub;
  hub.add("models/tiny-org/qwen3-tiny", fixture_model_repo());
  HubEnv env(hub.endpoint());
  const std::string bytes = read_file(test::fixtures() / "models" / "qwen3-tiny" / "model.safetensors");
  const std::string sha = sha256_hex(bytes);
  // A previous run stopped after 1000 bytes.
  const fs::path blobs = env.cache_dir() / "models--tiny-org--qwen3-tiny" / "blobs";
  fs::create_directories(blobs);
  test::write_text(blobs / (sha + ".incomplete"), bytes.substr(0, 1000));
  // And this run's transfer is cut halfway once more.
  hub.cut_next = 1;
  std::ostringstream log;
  const fs::path dir = resolve_hub_model(hub_client_from_env(log, false), "tiny-org/qwen3-tiny", "main");
  EXPECT_EQ(read_file(dir / "model.safetensors"), bytes);
  EXPECT_FALSE(fs::exists(blobs / (sha + ".incomplete")));
  EXPECT_NE(log.str().find("interrupted at byte"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("sha256 ok"), std::string::npos) << log.str();
  std::vector<std::string> ranges;
  for (const std::string& r : hub.requests())
    if (r.find("Range:") != std::string::npos) ranges.push_back(r);
  const size_t after_cut = 1000 + (bytes.size() - 1000) / 2;
  ASSERT_EQ(ranges.size(), 2u) << ::testing::PrintToString(hub.requests());
  EXPECT_EQ(ranges[0], "GET /cdn/" + sha + " Range: bytes=1000-");
  EXPECT_EQ(ranges[1], "GET /cdn/" + sha + " Range: bytes=" + std::to_string(after_cut) + "-");
}

TEST(Hub, PrivateRepoNeedsTheToken) {
  FakeHub hub;
  FakeRepo r = fixture_model_repo();
  r.private_repo = true;
  hub.add("models/tiny-org/private", r);
  HubEnv env(hub.endpoint());
  std::ostringstream log;
  ScopedEnv token("HF_TOKEN", hub.token.c_str());
  const fs::path dir = resolve_hub_model(hub_client_from_env(log, false), "tiny-org/private", "main");
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  bool sent = false;
  for (const std::string& q : hub.requests()) {
    sent = sent || (q.rfind("HEAD ", 0) == 0 && q.ends_with("[auth]"));
    if (q.find(" /cdn/") != std::string::npos) {
      EXPECT_FALSE(q.ends_with("[auth]")) << q;  // not to the storage
    }
  }
  EXPECT_TRUE(sent);
}

TEST(Hub, ShardedModelFetchesTheIndexAndItsShards) {
  FakeHub hub;
  FakeRepo r = fixture_model_repo();
  const fs::path src = test::fixtures() / "models" / "qwen3-tiny";
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (const std::string& n : CheckpointReader(src).names())
    index["weight_map"][n] = "model-00001-of-00001.safetensors";
  r.files.erase("model.safetensors");
  r.files["model.safetensors.index.json"] = index.dump();
  r.files["model-00001-of-00001.safetensors"] = read_file(src / "model.safetensors");
  r.files["model-00002-of-00002.safetensors"] = "a shard the index does not name";
  r.lfs = {"model-00001-of-00001.safetensors", "model-00002-of-00002.safetensors"};
  hub.add("models/tiny-org/sharded", r);
  HubEnv env(hub.endpoint());
  std::ostringstream log;
  const fs::path dir = resolve_hub_model(hub_client_from_env(log, false), "tiny-org/sharded", "main");
  EXPECT_TRUE(fs::exists(dir / "model-00001-of-00001.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model-00002-of-00002.safetensors"));
  auto ops = make_cpu_ops();
  EXPECT_NO_THROW(load_pretrained(dir, *ops));
}

// Through the binary: a config naming hub ids trains, then trains again offline with no server.
struct CliHub {
  test::TempDir t;
  CliHub(FakeHub& hub) {
    DemoModelShape s;
    s.hidden = 32, s.layers = 1, s.heads = 2, s.kv_heads = 1, s.head_dim = 16, s.intermediate = 64;
    write_random_model(t.path / "m", s, 7);
    FakeRepo model;
    model.commit = kCommit;
    for (const auto& e : fs::directory_iterator(t.path / "m"))
      model.files[e.path().filename().string()] = read_file(e.path());
    model.lfs = {"model.safetensors"};
    hub.add("models/org/tiny", model);
    write_reversal_dataset(t.path / "train.jsonl", 40, 8);
    FakeRepo data;
    data.commit = "fedcba9876543210fedcba9876543210fedcba98";
    data.files["data/train.jsonl"] = read_file(t.path / "train.jsonl");
    data.files["data/test.jsonl"] = "not a training file";
    data.files["data/validation.jsonl"] = read_file(t.path / "train.jsonl");  // (a split of its own, readable)
    data.files["README.md"] = "# reversal";
    data.lfs = {"data/train.jsonl"};
    hub.add("datasets/org/reversal", data);
    hub.add("models/org/private", FakeRepo{kCommit, {{"config.json", "{}"}}, {}, true});
    guard.arm({t.path / "m", t.path / "train.jsonl"});
  }
  test::InputsGuard guard;  // (after t: compared before the folder goes)
  fs::path config(const std::string& model, const std::string& out, const std::string& split = "") const {
    const fs::path p = t.path / (out + ".yaml");
    test::write_text(p, "model: " + model + "\noutput_dir: " + out +
                            "\ndatasets:\n  - path: org/reversal\n    type: conversation\n" +
                            (split.empty() ? "" : "    split: " + split + "\n") +
                            "sequence_len: 64\nper_device_train_batch_size: 2\nmax_steps: 2\nlogging_steps: 1\n");
    return p;
  }
};

TEST(Hub, SftTrainsFromHubIdsThenOfflineFromTheCache) {
  std::optional<FakeHub> hub(std::in_place);
  CliHub h(*hub);
  HubEnv env(hub->endpoint());
  const auto r = test::run("sft " + h.config("org/tiny", "out1").string(), h.t);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("download org/tiny model.safetensors: 100%"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dataset org/reversal: 1 file"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(h.t.path / "out1" / "model" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(h.t.path / "out1" / "model" / "tokenizer.json"));  // copied from the snapshot

  hub.reset();
  ScopedEnv offline("HF_HUB_OFFLINE", "1");
  test::InputsGuard cache;  // a run from the cache reads it and changes nothing there
  cache.arm({env.cache_dir()});
  const auto again = test::run("sft " + h.config("org/tiny", "out2").string(), h.t);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(again.err.find("download "), std::string::npos) << again.err;
  // `generate --model` takes a hub id as well.
  const auto gen = test::run("generate --model org/tiny --prompt ab --max-new-tokens 2", h.t);
  EXPECT_EQ(gen.code, 0) << gen.err;
}

// A hub dataset's other split: its own files by their names (data/validation.jsonl), downloaded and read as that
// split; the train split's run never fetched them, and an offline run of a split that was not fetched names it.
TEST(Hub, ASplitOtherThanTrainReadsItsOwnFiles) {
  std::optional<FakeHub> hub(std::in_place);
  CliHub h(*hub);
  HubEnv env(hub->endpoint());
  const auto r = test::run("sft " + h.config("org/tiny", "out1", "validation").string(), h.t);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("dataset org/reversal: 1 file"), std::string::npos) << r.err;
  const fs::path snap =
      env.cache_dir() / "datasets--org--reversal" / "snapshots" / "fedcba9876543210fedcba9876543210fedcba98";
  EXPECT_TRUE(fs::exists(snap / "data" / "validation.jsonl")) << r.err;
  EXPECT_FALSE(fs::exists(snap / "data" / "train.jsonl")) << r.err;
  hub.reset();
  ScopedEnv offline("HF_HUB_OFFLINE", "1");
  const auto test_split = test::run("sft " + h.config("org/tiny", "out2", "test").string(), h.t);
  EXPECT_EQ(test_split.code, 2) << test_split.err;
  EXPECT_NE(test_split.err.find("no data file of split \"test\" is"), std::string::npos) << test_split.err;
}

int lines(const std::string& s) {
  return int(std::count(s.begin(), s.end(), '\n'));
}

std::string user_error_of(const std::function<void()>& f) {
  return test::user_error_text(f);
}

// datasets' data_files patterns (globs within a folder, ** across) and a dataset card's configs (name, the default,
// the forms data_files takes there), as datasets.load_dataset chooses a repository's files.
TEST(Hub, DataFilesAndCardConfigsChooseFiles) {
  const std::vector<std::string> repo = {"README.md",
                                         "en/c4-train.00001-of-00002.json.gz",
                                         "en/c4-train.00000-of-00002.json.gz",
                                         "en/c4-validation.00000-of-00001.json.gz",
                                         "realnewslike/c4-train.00000-of-00001.json.gz",
                                         "pretrain/rp_sub.jsonl.zst"};
  EXPECT_EQ(pick_data_files(repo, {"pretrain/rp_sub.jsonl.zst"}, "d"),
            (std::vector<std::string>{"pretrain/rp_sub.jsonl.zst"}));
  EXPECT_EQ(pick_data_files(repo, {"en/c4-train.*.json.gz", "./en/c4-train.00000-of-00002.json.gz"}, "d"),
            (std::vector<std::string>{"en/c4-train.00000-of-00002.json.gz", "en/c4-train.00001-of-00002.json.gz"}));
  EXPECT_EQ(pick_data_files(repo, {"*/c4-train.*"}, "d").size(), 3u);  // * stays within a folder
  EXPECT_EQ(pick_data_files(repo, {"**/c4-validation*"}, "d"),
            (std::vector<std::string>{"en/c4-validation.00000-of-00001.json.gz"}));
  EXPECT_EQ(user_error_of([&] { pick_data_files(repo, {"*.json.gz"}, "dataset org/c4"); }),
            "dataset org/c4: data_files: \"*.json.gz\" matches no file");

  const std::string card =
      "---\nlicense: odc-by\nconfigs:\n- config_name: en\n  default: true\n  data_files:\n"
      "  - split: train\n    path: en/c4-train.*.json.gz\n  - split: validation\n"
      "    path: en/c4-validation.*.json.gz\n- config_name: realnewslike\n"
      "  data_files:\n  - split: train\n    path: [realnewslike/c4-train.*.json.gz]\n---\n# C4\n";
  EXPECT_EQ(card_data_files(card, "", "train", "d"), (std::vector<std::string>{"en/c4-train.*.json.gz"}));
  EXPECT_EQ(card_data_files(card, "", "validation", "d"), (std::vector<std::string>{"en/c4-validation.*.json.gz"}));
  EXPECT_EQ(card_data_files(card, "realnewslike", "train", "d"),
            (std::vector<std::string>{"realnewslike/c4-train.*.json.gz"}));
  EXPECT_EQ(user_error_of([&] { card_data_files(card, "realnewslike", "validation", "d"); }),
            "d: config \"realnewslike\" has no split \"validation\" (it has train)");
  EXPECT_EQ(user_error_of([&] { card_data_files(card, "fr", "train", "d"); }),
            "d: name: \"fr\": the dataset card has no such config (it has en, realnewslike)");
  // no default among several: one line; a bare path is the train split; no configs (or no header): nullopt
  const std::string two =
      "---\nconfigs:\n- config_name: a\n  data_files: a/*.jsonl\n- config_name: b\n"
      "  data_files: [b/x.jsonl, b/y.jsonl]\n---\n";
  EXPECT_EQ(user_error_of([&] { card_data_files(two, "", "train", "d"); }),
            "d: the dataset has several configs (a, b) and none is the default: choose one with the dataset's name: "
            "(Axolotl's key)");
  EXPECT_EQ(card_data_files(two, "b", "train", "d"), (std::vector<std::string>{"b/x.jsonl", "b/y.jsonl"}));
  EXPECT_FALSE(card_data_files("---\nlicense: mit\n---\n", "", "train", "d").has_value());
  EXPECT_FALSE(card_data_files("# reversal", "", "train", "d").has_value());
}

// data_files of a local folder: its files by path or glob, each one dataset entry; on a file, or `name` on a local
// path, one line.
TEST(Hub, LocalFolderDataFiles) {
  test::TempDir t;
  for (const char* f : {"a/x.jsonl", "b/y.jsonl", "b/z.jsonl"}) {
    fs::create_directories((t.path / f).parent_path());
    test::write_text(t.path / f, "{}\n");
  }
  TrainConfig c;
  DatasetSpec d;
  d.path = t.path;
  d.data_files = {"b/*.jsonl"};
  c.datasets = {d};
  std::ostringstream log;
  resolve_hub_inputs(c, log);
  ASSERT_EQ(c.datasets.size(), 2u);
  EXPECT_EQ(c.datasets[0].path, t.path / "b" / "y.jsonl");
  EXPECT_EQ(c.datasets[1].path, t.path / "b" / "z.jsonl");
  EXPECT_TRUE(c.datasets[1].data_files.empty());
  c.datasets = {d};
  c.datasets[0].path = t.path / "a" / "x.jsonl";
  EXPECT_EQ(user_error_of([&] { resolve_hub_inputs(c, log); }),
            "dataset " + (t.path / "a" / "x.jsonl").string() +
                ": data_files names files inside a folder or hub dataset; this is a file");
  c.datasets = {d};
  c.datasets[0].name = "en";
  EXPECT_EQ(user_error_of([&] { resolve_hub_inputs(c, log); }),
            "dataset " + t.path.string() + ": name: picks a config of a hub dataset's card");
}

// `name` and `data_files` of a hub dataset end to end: only the chosen files are downloaded and trained on.
TEST(Hub, ConfigNameAndDataFilesChooseWhatIsDownloaded) {
  std::optional<FakeHub> hub(std::in_place);
  CliHub h(*hub);
  HubEnv env(hub->endpoint());
  const std::string rows = read_file(h.t.path / "train.jsonl");
  FakeRepo data;
  data.commit = "abcdefabcdefabcdefabcdefabcdefabcdefabcd";
  data.files["README.md"] =
      "---\nconfigs:\n- config_name: en\n  default: true\n  data_files:\n  - split: train\n"
      "    path: en/c4-train.*.jsonl\n- config_name: realnewslike\n  data_files:\n"
      "  - split: train\n    path: realnewslike/c4-train.*.jsonl\n---\n";
  for (const char* f : {"en/c4-train.00000-of-00002.jsonl", "en/c4-train.00001-of-00002.jsonl",
                        "en/c4-validation.00000-of-00001.jsonl", "realnewslike/c4-train.00000-of-00001.jsonl"})
    data.files[f] = rows;
  hub->add("datasets/org/c4", data);
  auto run = [&](const std::string& out, const std::string& keys) {
    const fs::path p = h.t.path / (out + ".yaml");
    test::write_text(p, "model: org/tiny\noutput_dir: " + out +
                            "\ndatasets:\n  - path: org/c4\n    type: conversation\n" + keys +
                            "sequence_len: 64\nper_device_train_batch_size: 2\nmax_steps: 1\n");
    return test::run("sft " + p.string(), h.t);
  };
  const fs::path snap = env.cache_dir() / "datasets--org--c4" / "snapshots" / data.commit;
  const auto named = run("o1", "    name: realnewslike\n");
  ASSERT_EQ(named.code, 0) << named.err;
  EXPECT_NE(named.err.find("dataset org/c4: 1 file in"), std::string::npos) << named.err;
  EXPECT_TRUE(fs::exists(snap / "realnewslike" / "c4-train.00000-of-00001.jsonl"));
  EXPECT_FALSE(fs::exists(snap / "en"));  // the other config's files are never fetched
  const auto by_default = run("o2", "");
  ASSERT_EQ(by_default.code, 0) << by_default.err;
  EXPECT_NE(by_default.err.find("dataset org/c4: 2 files in"), std::string::npos) << by_default.err;
  EXPECT_FALSE(fs::exists(snap / "en" / "c4-validation.00000-of-00001.jsonl"));
  const auto files = run("o3", "    data_files: en/c4-validation.*.jsonl\n");
  ASSERT_EQ(files.code, 0) << files.err;
  EXPECT_NE(files.err.find("dataset org/c4: 1 file in"), std::string::npos) << files.err;
  EXPECT_TRUE(fs::exists(snap / "en" / "c4-validation.00000-of-00001.jsonl"));
  const auto bad = run("o4", "    name: fr\n");
  EXPECT_EQ(bad.code, 2);  // (after the model's line) one line
  EXPECT_NE(bad.err.find("\nerror: dataset org/c4: name: \"fr\": the dataset card has no such config (it has en, "
                         "realnewslike)\n"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(lines(bad.err), 2) << bad.err;
}

// Axolotl's examples/streaming/pretrain.yaml as written (its model and dataset ids served by the fake hub;
// fineweb-edu's card config sample-10BT, JSON lines here): a pt run streaming the config's files in order, and a resume
// from its checkpoint continuing at the exact record: the same losses as the run that was not interrupted.
TEST(Hub, AxolotlStreamingPretrainExampleRunsAndResumesExactly) {
  std::optional<FakeHub> hub(std::in_place);
  CliHub h(*hub);
  HubEnv env(hub->endpoint());
  FakeRepo smol;
  smol.commit = kCommit;
  for (const auto& e : fs::directory_iterator(h.t.path / "m"))
    smol.files[e.path().filename().string()] = read_file(e.path());
  hub->add("models/HuggingFaceTB/SmolLM2-135M", smol);
  FakeRepo web;
  web.commit = "5555555555aaaaaaaaaa5555555555aaaaaaaaaa";
  web.files["README.md"] =
      "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*/*\n"
      "- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*\n---\n";
  std::mt19937 rng(test::test_seed(17));
  const char* words[] = {"soil", "cell", "energy", "the", "of", "water", "history", "is", "a", "light"};
  for (const char* f : {"sample/10BT/000_00000.jsonl", "sample/10BT/001_00000.jsonl", "data/CC-MAIN/000.jsonl"}) {
    std::string rows;
    for (int i = 0; i < 150; ++i) {  // (each shorter than sequence_len: Axolotl's drop would leave longer ones out)
      std::string text;
      for (int k = 0, n = 20 + int(rng() % 120); k < n; ++k) text += (k ? " " : "") + std::string(words[rng() % 10]);
      rows += "{\"text\": \"" + text + "\", \"id\": \"<urn:" + std::to_string(i) + ">\", \"score\": 3.1}\n";
    }
    web.files[f] = rows;
  }
  hub->add("datasets/HuggingFaceFW/fineweb-edu", web);
  std::string yaml = read_file(fs::path(SOLTRAIN_FIXTURES) / "peer_configs" / "axolotl-streaming-pretrain.yaml");
  yaml.replace(yaml.find("OUTPUT_DIR"), 10, "out");
  test::write_text(h.t.path / "pretrain.yaml", yaml);
  const std::string cfg = (h.t.path / "pretrain.yaml").string();
  const auto whole = test::run("train " + cfg + " --set max_steps=4 --set save_steps=2 --set logging_steps=1", h.t);
  ASSERT_EQ(whole.code, 0) << whole.err;
  EXPECT_NE(whole.err.find("dataset HuggingFaceFW/fineweb-edu: 2 files in "), std::string::npos) << whole.err;
  EXPECT_NE(whole.err.find(" (0 cached), streamed: each downloaded when training reaches it\n"), std::string::npos)
      << whole.err;
  // 4 updates of 8 x 1024 tokens read less than the first file: the second is never downloaded
  const fs::path snap = env.cache_dir() / "datasets--HuggingFaceFW--fineweb-edu" / "snapshots" / web.commit;
  EXPECT_TRUE(fs::exists(snap / "sample" / "10BT" / "000_00000.jsonl"));
  EXPECT_FALSE(fs::exists(snap / "sample" / "10BT" / "001_00000.jsonl"));
  EXPECT_NE(whole.err.find("\npt: pretraining_dataset: the datasets are read in order; Axolotl's shuffle buffer "),
            std::string::npos)
      << whole.err;
  EXPECT_NE(whole.err.find("training documents streamed in order from 2 dataset files (1 x 1024 micro-batches)"),
            std::string::npos)
      << whole.err;
  EXPECT_EQ(whole.err.find("tokenize: wrote"), std::string::npos) << "nothing is tokenized ahead: " << whole.err;
  EXPECT_TRUE(fs::exists(h.t.path / "out" / "model" / "model.safetensors"));
  const auto resumed = test::run("train " + cfg + " --set max_steps=4 --set save_steps=2 --set logging_steps=1 " +
                                     "--set output_dir=again --set resume_from_checkpoint=out/checkpoint-2",
                                 h.t);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  auto losses = [&](const std::string& dir) {
    std::map<int64_t, double> out;
    for (const nlohmann::json& j : test::read_jsonl(h.t.path / dir / "metrics.jsonl"))
      if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    return out;
  };
  const auto a = losses("out"), b = losses("again");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 2u);
  for (int64_t step : {3, 4}) EXPECT_EQ(a.at(step), b.at(step)) << "step " << step;
  EXPECT_NE(a.at(1), a.at(3));
  // nothing to preprocess: as Axolotl's streaming datasets need no `axolotl preprocess`
  const auto pre = test::run("preprocess " + cfg + " --set output_dir=pre", h.t);
  ASSERT_EQ(pre.code, 0) << pre.err;
  EXPECT_NE(pre.err.find("tokenize: the training datasets are streamed (pretraining_dataset): read and tokenized as "
                         "training reaches them, nothing prepared here\n"),
            std::string::npos)
      << pre.err;
}

TEST(Hub, RefusedAndMissingReposAreOneLine) {
  FakeHub hub;
  CliHub h(hub);
  HubEnv env(hub.endpoint());
  const auto gated = test::run("sft " + h.config("org/private", "o").string(), h.t);
  EXPECT_EQ(gated.code, 2) << gated.err;
  EXPECT_EQ(lines(gated.err), 1) << gated.err;
  EXPECT_NE(gated.err.find("model org/private"), std::string::npos) << gated.err;
  EXPECT_NE(gated.err.find("set HF_TOKEN"), std::string::npos) << gated.err;
  EXPECT_NE(gated.err.find("401"), std::string::npos) << gated.err;

  const auto missing = test::run("sft " + h.config("org/no-such-model", "o").string(), h.t);
  EXPECT_EQ(missing.code, 2) << missing.err;
  EXPECT_EQ(lines(missing.err), 1) << missing.err;
  EXPECT_NE(missing.err.find("model org/no-such-model"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("check the spelling"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("404"), std::string::npos) << missing.err;

  ScopedEnv offline("HF_HUB_OFFLINE", "1");
  const auto empty = test::run("sft " + h.config("org/tiny", "o").string(), h.t);
  EXPECT_EQ(empty.code, 2) << empty.err;
  EXPECT_EQ(lines(empty.err), 1) << empty.err;
  EXPECT_NE(empty.err.find("model org/tiny"), std::string::npos) << empty.err;
  EXPECT_NE(empty.err.find("HF_HUB_OFFLINE=1"), std::string::npos) << empty.err;
}

TEST(Hub, UnreachableHubIsOneLine) {
  test::TempDir t;
  HubEnv env("http://127.0.0.1:1");  // nothing listens on port 1
  std::ostringstream log;
  try {
    resolve_hub_model(hub_client_from_env(log, false), "org/tiny", "main");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach http://127.0.0.1:1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace soltrain
