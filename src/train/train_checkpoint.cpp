#include "train/train_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "core/error.h"
#include "hub/hub_cache.h"
#include "io/atomic_file.h"
#include "io/deferred_writes.h"
#include "io/input_file.h"
#include "io/json_file.h"
#include "io/sha256.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"
#include "train/trained_model.h"
#include "train/zero3.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kChecksums = "checksums.sha256";
// What a resume reads (the loader's position, the seed, ...); trainer_state.json is HF Trainer's. A checkpoint
// from before soltrain_state.json held this in trainer_state.json, and its weights in model/ or adapter/.
constexpr const char* kSoltrainState = "soltrain_state.json";

std::string shard_name(int rank, int size) {
  return cat("optimizer-shard-", rank, "-of-", size, ".safetensors");
}

// Every file of a staged checkpoint, relative to it, sorted (the checksum list itself and marker files aside).
std::vector<std::string> checkpoint_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = e.path().lexically_relative(dir).generic_string();
    if (e.is_regular_file() && rel != kChecksums && e.path().filename().string()[0] != '.') out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// checksums.sha256 in `sha256sum` format ("<hex>  <file>"), so `sha256sum -c` checks a checkpoint too: a
// flipped bit in a tensor file no longer resumes silently.
void write_checksums(const fs::path& dir) {
  std::string text;
  for (const std::string& f : checkpoint_files(dir)) text += sha256_file(dir / f) + "  " + f + "\n";
  write_file_atomic(dir / kChecksums, text);
}

// A checkpoint written before checksums were (none listed) is read as before.
void verify_checksums(const fs::path& dir) {
  const fs::path list = dir / kChecksums;
  if (!fs::exists(list)) return;
  std::istringstream in(read_input_file(list, "a checkpoint's checksum list"));
  for (std::string line; std::getline(in, line);) {
    if (line.size() < 67 || line.substr(64, 2) != "  ")
      user_error(list.string(), ": malformed line \"", line, "\" (expected \"<sha256>  <file>\")");
    const std::string want = line.substr(0, 64), file = line.substr(66);
    if (!is_safe_repo_path(file)) user_error(list.string(), ": names a file outside the checkpoint: \"", file, "\"");
    if (!fs::exists(dir / file))
      user_error((dir / file).string(), ": missing from the checkpoint (", kChecksums, " lists it)");
    if (sha256_file(dir / file) != want)
      user_error(
          (dir / file).string(),
          ": its sha256 differs from the one saved with the checkpoint: the file is damaged; resume from another "
          "checkpoint (resume_from_checkpoint: <folder>)");
  }
}

}  // namespace

namespace {

nlohmann::json best_eval_json(const BestEval& b) {
  if (std::isnan(b.loss)) return nullptr;
  return {{"loss", b.loss}, {"step", b.step}, {"without_gain", b.without_gain}};
}

BestEval best_eval_from_json(const nlohmann::json& j) {
  BestEval b;
  if (j.is_null()) return b;
  b.loss = j.at("loss").get<double>();
  b.step = j.at("step").get<int64_t>();
  b.without_gain = j.at("without_gain").get<int>();
  return b;
}

// HF Trainer's trainer_state.json (transformers.TrainerState loads it): the step, the schedule's length and
// log_history, the rows of metrics.jsonl up to this step under their HF names (loss, learning_rate, grad_norm,
// epoch, eval_loss), so tools that plot or pick checkpoints from it read ours.
nlohmann::json hf_trainer_state(const TrainConfig& c, const TrainerState& s) {
  nlohmann::json history = nlohmann::json::array();
  double epoch = 0;
  std::ifstream in(c.output_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || row.value("step", int64_t(-1)) > s.step) continue;  // a line cut by a kill, or later
    if (row.contains("epoch") && row["epoch"].is_number()) epoch = row["epoch"].get<double>();
    history.push_back(std::move(row));
  }
  // The best validation loss as the Trainer records it (metric_for_best_model "loss"), once there is one.
  const BestEval& b = s.best_eval;
  const bool best = !std::isnan(b.loss);
  const fs::path best_dir = c.output_dir / ("checkpoint-" + std::to_string(b.step));
  const bool best_saved = best && (b.step == s.step || fs::is_directory(best_dir));
  return {{"best_global_step", best ? nlohmann::json(b.step) : nlohmann::json(nullptr)},
          {"best_metric", best ? nlohmann::json(b.loss) : nlohmann::json(nullptr)},
          {"best_model_checkpoint", best_saved ? nlohmann::json(best_dir.string()) : nlohmann::json(nullptr)},
          {"epoch", epoch},
          {"eval_steps", c.eval_steps},
          {"global_step", s.step},
          {"is_hyper_param_search", false},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"log_history", history},
          {"logging_steps", c.logging_steps},
          {"max_steps", s.total_steps},
          {"num_input_tokens_seen", 0},
          {"num_train_epochs", int64_t(std::ceil(c.num_epochs))},
          {"save_steps", c.save_steps},
          {"stateful_callbacks", nlohmann::json::object()},
          {"total_flos", 0},
          {"train_batch_size", c.per_device_train_batch_size},
          {"trial_name", nullptr},
          {"trial_params", nullptr}};
}

// Everything of a checkpoint but sharded optimizer moments, into the folder being staged. The weights lie at
// the top as in HF Trainer's checkpoint-N, so PEFT and transformers load the folder as saved; a full
// fine-tune's are the fp32 masters (a resume continues bitwise).
void write_contents(const fs::path& staged, const TrainConfig& c, const Transformer& model, const AdamW& opt,
                    const TrainerState& s, bool optimizer) {
  write_trained_model(c, model, staged, /*fp32_masters=*/true);
  if (optimizer) opt.save(staged / "optimizer.safetensors");  // every rank holds all of it: rank 0 writes it
  if (const Fp8Recipe* f = model.fp8()) f->save(staged / "fp8_state.safetensors");
  const nlohmann::json state = {{"step", s.step},
                                {"total_steps", s.total_steps},
                                {"loader", s.loader.to_json()},
                                {"seed", s.seed},
                                {"dropout_passes", model.dropout_step()},
                                {"lr_scheduler_type", to_string(c.lr_scheduler_type)},
                                {"learning_rate", c.learning_rate},
                                {"best_eval", best_eval_json(s.best_eval)}};
  write_file_atomic(staged / kSoltrainState, state.dump(2) + "\n");
  write_file_atomic(staged / "trainer_state.json", hf_trainer_state(c, s).dump(2) + "\n");
  write_file_atomic(staged / "config.yaml", c.source_text);
}

}  // namespace

void save_checkpoint(const fs::path& dir, const TrainConfig& c, const Transformer& model, const AdamW& opt,
                     const TrainerState& s, Communicator* comm, Zero3* zero3) {
  const bool many = comm && comm->size() > 1, lead = !comm || comm->rank() == 0;
  // Sharded moments: every rank writes its shard into a folder beside the checkpoint; rank 0 moves them in.
  const fs::path shards = dir.parent_path() / (dir.filename().string() + ".shards.tmp");
  if (many && opt.sharded()) {
    if (lead) {
      fs::remove_all(shards);
      fs::create_directories(shards);
    }
    comm->barrier();
    opt.save(shards / shard_name(comm->rank(), comm->size()));
    comm->barrier();
  }
  if (!lead) {
    if (zero3) zero3->serve_masters();  // (until rank 0 has written the weights)
    comm->barrier();                    // until rank 0 has committed the checkpoint
    return;
  }
  StagedDir staged(dir);
  if (many && opt.sharded()) {
    for (int r = 0; r < comm->size(); ++r)
      fs::rename(shards / shard_name(r, comm->size()), staged.path() / shard_name(r, comm->size()));
    fs::remove_all(shards);
  }
  if (zero3) zero3->begin_masters();
  write_contents(staged.path(), c, model, opt, s, /*optimizer=*/!(many && opt.sharded()));
  if (zero3) zero3->end_masters();
  write_checksums(staged.path());
  staged.commit();
  if (many) comm->barrier();
}

PendingCheckpoint::PendingCheckpoint(const fs::path& dir, SnapshotPool* pool, bool lead)
    : writes(pool), final_dir(dir) {
  if (lead) staged.emplace(dir);
}

PendingCheckpoint::~PendingCheckpoint() {
  if (copies_done) copies_done();
}

std::unique_ptr<PendingCheckpoint> snapshot_checkpoint(const fs::path& dir, const TrainConfig& c,
                                                       const Transformer& model, const AdamW& opt,
                                                       const TrainerState& s, SnapshotPool* pool, Communicator* comm,
                                                       int64_t job, int timeout_s) {
  const bool many = comm && comm->size() > 1, lead = !many || comm->rank() == 0;
  auto p = std::make_unique<PendingCheckpoint>(dir, pool, lead);
  const bool sharded = many && opt.sharded();
  if (sharded) {
    // Named as a staged folder of rank 0's process (stale_partials.h): a killed job's is cleaned up, never
    // mistaken for this one's.
    p->shards = dir.parent_path() / cat(".", dir.filename().string(), ".shards.partial-", job);
    p->rank = comm->rank();
    p->world = comm->size();
    p->timeout_s = timeout_s;
  }
  {
    DeferredWrites::Capture capture(p->writes);
    if (lead) write_contents(p->staged->path(), c, model, opt, s, /*optimizer=*/!sharded);
    if (sharded) opt.save(p->shards / (shard_name(p->rank, p->world) + ".part"));  // renamed once whole
  }
  // The fills queued their device copies on the current stream: the next update (the only writer of the masters
  // and moments) comes after them there; work on the other streams is ordered after them too.
  Ops& ops = const_cast<Transformer&>(model).ops();
  p->copies_done = ops.fence();
  for (Ops::Stream other : {Ops::Stream::Side, Ops::Stream::Upload}) ops.wait(other, Ops::Stream::Main);
  return p;
}

namespace {

// Rank 0's writer: every rank's shard, once whole, moved into the staged checkpoint.
void gather_shards(PendingCheckpoint& p) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(p.timeout_s);
  for (int r = 0; r < p.world; ++r) {
    const fs::path shard = p.shards / shard_name(r, p.world);
    while (!fs::exists(shard)) {
      if (p.cancelled)
        throw RankFailure(cat(p.final_dir.string(), ": abandoned while waiting for rank ", r, "'s shard"));
      if (std::chrono::steady_clock::now() > deadline)
        throw RankFailure(cat(p.final_dir.string(), ": rank ", r, "'s optimizer shard did not arrive within ",
                              p.timeout_s, " s (ddp_timeout)"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    fs::rename(shard, p.staged->path() / shard.filename());
  }
  fs::remove_all(p.shards);
}

}  // namespace

void finish_checkpoint(PendingCheckpoint& p) {
  if (auto done = std::exchange(p.copies_done, nullptr)) done();
  if (!p.shards.empty()) fs::create_directories(p.shards);
  p.writes.write_all();
  if (!p.shards.empty()) {
    const fs::path mine = p.shards / shard_name(p.rank, p.world);
    fs::rename(fs::path(mine.string() + ".part"), mine);  // whole: rank 0 may take it
  }
  if (const char* ms = std::getenv("SOLTRAIN_TEST_SLOW_SAVE_MS"))  // tests: a kill -9 lands mid-write
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  if (!p.staged) return;  // another rank: its part is written
  if (!p.shards.empty()) gather_shards(p);
  write_checksums(p.staged->path());
  p.staged->commit();
}

namespace {
// optimizer.safetensors, or every optimizer-shard-<r>-of-<n>.safetensors (all n of them).
std::vector<fs::path> optimizer_files(const fs::path& dir) {
  if (fs::exists(dir / "optimizer.safetensors")) return {dir / "optimizer.safetensors"};
  std::vector<fs::path> found;
  int of = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    int r = 0, size = 0;
    if (std::sscanf(n.c_str(), "optimizer-shard-%d-of-%d.safetensors", &r, &size) != 2 || shard_name(r, size) != n)
      continue;
    if (of >= 0 && size != of) user_error(dir.string(), ": optimizer shards of ", of, " and of ", size, " ranks mixed");
    of = size;
    found.push_back(e.path());
  }
  if (found.empty()) user_error(dir.string(), ": not a soltrain checkpoint of this kind (no optimizer.safetensors)");
  if (int(found.size()) != of)
    user_error(dir.string(), ": has ", found.size(), " of the ", of, " optimizer shards (", shard_name(0, of),
               " ...): the checkpoint is incomplete");
  std::sort(found.begin(), found.end());
  return found;
}
}  // namespace

TrainerState load_checkpoint(const fs::path& dir, Transformer& model, AdamW& opt) {
  const bool lora = model.lora().has_value();
  const fs::path legacy_weights = dir / (lora ? "adapter" : "model");
  const fs::path weights = fs::is_directory(legacy_weights) ? legacy_weights : dir;
  const fs::path state_file = fs::exists(dir / kSoltrainState) ? dir / kSoltrainState : dir / "trainer_state.json";
  for (const fs::path& f : {state_file, weights / (lora ? "adapter_config.json" : "config.json")})
    if (!fs::exists(f))
      user_error(
          dir.string(), ": not a soltrain checkpoint of this kind (no ", f.lexically_relative(dir).string(),
          lora ? "; a LoRA run resumes from a LoRA run's checkpoint)" : "; a full run resumes from a full run's)");
  verify_checksums(dir);
  const nlohmann::json j = read_json_file(state_file);
  TrainerState s;
  int64_t dropout_passes = 0;
  try {
    s.step = j.at("step").get<int64_t>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.loader = LoaderState::from_json(j.at("loader"));
    dropout_passes = j.value("dropout_passes", s.step);
    if (j.contains("best_eval")) s.best_eval = best_eval_from_json(j.at("best_eval"));
  } catch (const nlohmann::json::exception& e) {
    user_error(state_file.string(), ": malformed (", e.what(), ")");
  }
  if (lora)
    load_adapter_weights(model, weights);
  else
    s.weight_bytes_read = load_weights(model, weights);
  // The dropout masks continue where the interrupted run was: they are drawn per pass (micro-batch), so the
  // count of passes is stored; a checkpoint from before it was (one pass per step then) falls back to the step.
  model.set_dropout_step(dropout_passes);
  // FP8 scaling continues too; a checkpoint of a bf16 run (none stored) starts it as a new run does.
  if (Fp8Recipe* f = model.fp8(); f && fs::exists(dir / "fp8_state.safetensors"))
    f->load(dir / "fp8_state.safetensors");
  opt.load(optimizer_files(dir));
  if (opt.steps_done() != s.step)
    user_error(dir.string(), ": optimizer step ", opt.steps_done(), " does not match trainer step ", s.step);
  return s;
}

std::vector<fs::path> list_checkpoints(const fs::path& output_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !name.starts_with("checkpoint-")) continue;
    const std::string digits = name.substr(11);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    found.emplace_back(std::stoll(digits), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [n, p] : found) out.push_back(p);
  return out;
}

void prune_checkpoints(const fs::path& output_dir, int keep, int64_t protect) {
  if (keep <= 0) return;
  std::vector<fs::path> all = list_checkpoints(output_dir);
  // As the Trainer rotates them: the best moved last, and with a limit of 1 the newest kept beside it.
  const fs::path kept = output_dir / ("checkpoint-" + std::to_string(protect));
  if (protect >= 0 && !all.empty() && all.back() != kept && std::erase(all, kept) > 0) keep = std::max(keep - 1, 1);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i]);
}

std::optional<fs::path> resolve_resume(const TrainConfig& c) {
  const ResumeFrom& r = c.resume_from_checkpoint;
  if (r.kind == ResumeFrom::kFresh) return std::nullopt;
  if (r.kind == ResumeFrom::kLatest) {
    const std::vector<fs::path> all = list_checkpoints(c.output_dir);
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  const fs::path& p = r.folder;
  if (!fs::is_directory(p)) user_error("resume_from_checkpoint: ", p.string(), " is not a folder");
  return p;
}

}  // namespace soltrain
