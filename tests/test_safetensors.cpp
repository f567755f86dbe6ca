// safetensors reading and writing: bit-exact round trips, sharded checkpoints, and every kind of corrupt
// file getting a UserError that names the file (never a crash).
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void spit(const std::filesystem::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}
// A file with the given raw header and `data_bytes` bytes of data.
std::string with_header(const std::string& header, size_t data_bytes) {
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + std::string(data_bytes, '\x01');
}

// Expects opening `bytes` as a safetensors file to fail with a UserError containing `needle`.
void expect_rejected(const std::string& bytes, const std::string& needle) {
  TempDir t;
  const auto p = t.path / "bad.safetensors";
  spit(p, bytes);
  try {
    SafetensorsFile f(p);
    ADD_FAILURE() << "accepted a corrupt file; expected an error containing '" << needle << "'";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(p.string()), std::string::npos) << "error must name the file: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(Safetensors, RoundTripIsBitExactForEveryDtype) {
  SOLTRAIN_SEEDED_RNG(rng, 101u);
  auto f = random_vec(6 * 7, rng);
  std::vector<uint16_t> b(5 * 3);
  for (auto& x : b) x = f32_to_bf16(std::normal_distribution<float>()(rng));
  std::vector<int32_t> i(9);
  for (auto& x : i) x = int32_t(rng());
  std::vector<int64_t> l(4);
  for (auto& x : l) x = int64_t(rng()) << 20;
  TempDir t;
  const auto p = t.path / "x.safetensors";
  write_safetensors(p,
                    {{"a.weight", Tensor{f.data(), DType::F32, {6, 7}}},
                     {"b", Tensor{b.data(), DType::BF16, {5, 3}}},
                     {"ids", Tensor{i.data(), DType::I32, {9}}},
                     {"big", Tensor{l.data(), DType::I64, {2, 2}}}},
                    {{"format", "pt"}});
  const SafetensorsFile r(p);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.at("a.weight").shape, (Shape{6, 7}));
  EXPECT_EQ(0, std::memcmp(r.at("a.weight").data, f.data(), f.size() * 4));
  EXPECT_EQ(0, std::memcmp(r.at("b").data, b.data(), b.size() * 2));
  EXPECT_EQ(r.at("b").dtype, DType::BF16);
  EXPECT_EQ(read_as_i32(r.at("ids"), "ids"), i);
  EXPECT_EQ(0, std::memcmp(r.at("big").data, l.data(), l.size() * 8));
  // bf16 widens exactly
  std::vector<float> wide(b.size());
  read_as_f32(r.at("b"), {5, 3}, wide.data(), "b");
  for (size_t k = 0; k < b.size(); ++k) EXPECT_EQ(f32_to_bf16(wide[k]), b[k]);
}

TEST(Safetensors, ReadsFilesWrittenByTheReferenceLibrary) {
  // written by python safetensors (HF save_pretrained)
  const SafetensorsFile f(fixtures() / "models" / "qwen3-tiny" / "model.safetensors");
  EXPECT_EQ(f.at("model.embed_tokens.weight").shape, (Shape{320, 64}));
  EXPECT_EQ(f.at("model.embed_tokens.weight").dtype, DType::F32);
}

TEST(Safetensors, ShardedCheckpointRoundTrip) {
  SOLTRAIN_SEEDED_RNG(rng, 102u);
  std::vector<std::vector<float>> data;
  std::vector<NamedTensor> tensors;
  for (int k = 0; k < 7; ++k) data.push_back(random_vec(size_t(100 + 37 * k), rng));
  for (int k = 0; k < 7; ++k)
    tensors.push_back({cat("t", k), Tensor{data[k].data(), DType::F32, {int64_t(data[k].size())}}});
  TempDir t;
  write_checkpoint(t.path, tensors, 1500);  // ~1.5 KB shards: several files
  ASSERT_TRUE(std::filesystem::exists(t.path / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(t.path / "model.safetensors"));
  const auto index = nlohmann::json::parse(slurp(t.path / "model.safetensors.index.json"));
  std::set<std::string> files;
  for (auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_EQ(files.size(), 6u);  // 400..1288-byte tensors packed greedily under 1500 bytes
  EXPECT_TRUE(files.count("model-00001-of-00006.safetensors"));
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), size_t(7 * 100 + 37 * 21) * 4);
  const CheckpointReader r(t.path);
  EXPECT_EQ(r.names().size(), 7u);
  for (int k = 0; k < 7; ++k) EXPECT_EQ(0, std::memcmp(r.entry(cat("t", k)).data, data[k].data(), data[k].size() * 4));
  // a shard that the index names but that is gone
  std::filesystem::remove(t.path / index["weight_map"]["t3"].get<std::string>());
  EXPECT_THROW(CheckpointReader{t.path}, UserError);
}

TEST(Safetensors, CorruptFilesGetOneClearError) {
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string good = with_header(good_header, 16);
  expect_rejected(good.substr(0, good.size() - 5), "out of range");        // truncated data
  expect_rejected(good.substr(0, 20), "exceeds the file size");            // truncated header
  expect_rejected("abc", "truncated");                                     // shorter than the length
  expect_rejected(with_header("{\"w\": [1, 2", 0), "header is not JSON");  // not JSON
  expect_rejected(with_header("[1,2]", 0), "not a JSON object");
  expect_rejected(with_header(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,40]}})", 16), "out of range");
  expect_rejected(with_header(R"({"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", 16), "needs 24 bytes");
  expect_rejected(with_header(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2), "unsupported dtype");
  expect_rejected(with_header(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "negative");
  expect_rejected(with_header(R"({"w":{"dtype":"F32","shape":[2]}})", 8), "needs dtype, shape and data_offsets");
  expect_rejected(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "out of range");
  // the data must be the tensors laid end to end: no overlap, no gap, nothing left over
  const std::string two = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)";
  expect_rejected(with_header(two + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "overlap");
  expect_rejected(with_header(two + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "overlap");
  expect_rejected(with_header(two + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
                  "bytes [8, 12) of the data belong to no tensor");
  expect_rejected(with_header(good_header, 20), "bytes [16, 20) at the end of the data belong to no tensor");
  expect_rejected(with_header(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
                  "bytes [0, 8) of the data belong to no tensor");
  // JSON the parser refuses for other reasons than syntax: a number out of range, nesting 10^5 deep
  expect_rejected(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"x":1e99999})", 8),
                  "header is not JSON");
  expect_rejected(with_header(std::string(100000, '[') + std::string(100000, ']'), 0), "header is not JSON");
  // the header's key order need not follow the offsets (JSON objects have no order)
  {
    TempDir t;
    spit(t.path / "swapped.safetensors", with_header(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                                                     R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                                     16));
    EXPECT_NO_THROW(SafetensorsFile(t.path / "swapped.safetensors"));
  }
  // the well-formed one is accepted
  TempDir t;
  spit(t.path / "ok.safetensors", good);
  EXPECT_NO_THROW(SafetensorsFile(t.path / "ok.safetensors"));
}

TEST(Safetensors, MissingAndMisShapedTensorsAreUserErrors) {
  const SafetensorsFile f(fixtures() / "models" / "qwen3-tiny" / "model.safetensors");
  EXPECT_THROW(f.at("nope"), UserError);
  std::vector<float> dst(320 * 64);
  EXPECT_THROW(read_as_f32(f.at("model.embed_tokens.weight"), {64, 320}, dst.data(), "embed"), UserError);
  EXPECT_THROW(SafetensorsFile("/nonexistent/x.safetensors"), UserError);
}

}  // namespace
}  // namespace soltrain::test
