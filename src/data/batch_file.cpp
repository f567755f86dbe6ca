#include "data/batch_file.h"

#include "io/safetensors.h"

namespace soltrain {

HostBatch load_batch_file(const std::filesystem::path& path) {
  const SafetensorsFile f(path);
  const TensorEntry& ids = f.at("input_ids");
  const TensorEntry& tgt = f.at("targets");
  if (ids.shape.size() != 2 || ids.shape[0] <= 0 || ids.shape[1] <= 0)
    user_error(path.string(), ": input_ids must be [batch, seq_len], got ", shape_str(ids.shape));
  if (tgt.shape != ids.shape)
    user_error(path.string(), ": targets ", shape_str(tgt.shape), " must match input_ids ", shape_str(ids.shape));
  HostBatch b;
  b.rows = int(ids.shape[0]);
  b.seq_len = int(ids.shape[1]);
  b.input_ids = read_as_i32(ids, path.string() + ": input_ids");
  b.targets = read_as_i32(tgt, path.string() + ": targets");
  if (f.find("cu_seqlens")) {
    b.positions = read_as_i32(f.at("positions"), path.string() + ": positions");
    b.cu_seqlens = read_as_i32(f.at("cu_seqlens"), path.string() + ": cu_seqlens");
    const int32_t n = b.rows * b.seq_len;
    bool ok = int32_t(b.positions.size()) == n && b.cu_seqlens.size() >= 2 && b.cu_seqlens.front() == 0 &&
              b.cu_seqlens.back() == n;
    for (size_t d = 0; ok && d + 1 < b.cu_seqlens.size(); ++d) ok = b.cu_seqlens[d + 1] > b.cu_seqlens[d];
    if (!ok) user_error(path.string(), ": positions / cu_seqlens do not describe ", n, " tokens in documents");
  }
  // A preference batch's pairs (chosen, rejected document), the reference's sums and ORPO's prompt targets
  // (model/transformer.h HostBatch): as save_batch_file writes them; the objective checks their ranges.
  if (f.find("pairs")) b.pairs = read_as_i32(f.at("pairs"), path.string() + ": pairs");
  if (f.find("prompt_targets"))
    b.prompt_targets = read_as_i32(f.at("prompt_targets"), path.string() + ": prompt_targets");
  if (f.find("desirable"))
    for (int32_t v : read_as_i32(f.at("desirable"), path.string() + ": desirable")) b.desirable.push_back(v != 0);
  if (f.find("ref_nll")) {
    const TensorEntry& r = f.at("ref_nll");
    b.ref_nll.resize(size_t(shape_numel(r.shape)));
    read_as_f32(r, r.shape, b.ref_nll.data(), path.string() + ": ref_nll");
  }
  if (b.pairs.size() % 2 != 0 || (!b.ref_nll.empty() && b.ref_nll.size() != b.pairs.size()) ||
      (!b.prompt_targets.empty() && 2 * b.prompt_targets.size() != b.pairs.size()) ||
      (!b.desirable.empty() && 2 * b.desirable.size() != b.pairs.size()))
    user_error(path.string(), ": pairs [P,2], ref_nll [2P], prompt_targets [P] and desirable [P] do not agree");
  return b;
}

void save_batch_file(const std::filesystem::path& path, const HostBatch& b) {
  auto t = [&](const std::vector<int32_t>& v, Shape s) {
    return Tensor{const_cast<int32_t*>(v.data()), DType::I32, std::move(s), Device::CPU};
  };
  std::vector<NamedTensor> tensors = {{"input_ids", t(b.input_ids, {b.rows, b.seq_len})},
                                      {"targets", t(b.targets, {b.rows, b.seq_len})}};
  if (!b.cu_seqlens.empty()) {
    tensors.push_back({"positions", t(b.positions, {b.rows, b.seq_len})});
    tensors.push_back({"cu_seqlens", t(b.cu_seqlens, {int64_t(b.cu_seqlens.size())})});
  }
  if (!b.pairs.empty()) tensors.push_back({"pairs", t(b.pairs, {int64_t(b.pairs.size() / 2), 2})});
  if (!b.prompt_targets.empty())
    tensors.push_back({"prompt_targets", t(b.prompt_targets, {int64_t(b.prompt_targets.size())})});
  std::vector<int32_t> desirable(b.desirable.begin(), b.desirable.end());
  if (!desirable.empty()) tensors.push_back({"desirable", t(desirable, {int64_t(desirable.size())})});
  if (!b.ref_nll.empty())
    tensors.push_back({"ref_nll", Tensor{const_cast<float*>(b.ref_nll.data()), DType::F32,
                                         Shape{int64_t(b.ref_nll.size())}, Device::CPU}});
  write_safetensors(path, tensors);
}

void save_update_batches(const std::filesystem::path& dir, int64_t step, const std::vector<HostBatch>& micro) {
  std::filesystem::create_directories(dir);
  for (size_t m = 0; m < micro.size(); ++m)
    save_batch_file(dir / cat("step-", step, "-micro-", m, ".safetensors"), micro[m]);
}

}  // namespace soltrain
