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
  return b;
}

}  // namespace soltrain
