// ZeRO-3 inside one process, where every collective can be watched: a rank that skips a micro-batch (no
// targets) makes the same collectives, in the same order and sizes, as one that trains on it (else the ranks
// would hang or mix up their layers); no full-size buffer is left for the weights or gradients; and at world
// size 1 the step is the single process's, for every recompute policy (recompute gathers a layer again).
// The multi-rank trajectories, checkpoints and memory plan are tests/test_data_parallel.cpp's.
#include <cstring>
#include <string>
#include <vector>

#include "data/batch_file.h"
#include "model/checkpoint.h"
#include "test_util.h"
#include "train/train_step.h"

namespace soltrain::test {
namespace {

// World size 1, every collective recorded by kind and size. `in_place`: it says it works in place, as NCCL
// does (Zero3 then uses the slices as its buffers), and counts the calls that did not.
class RecordingCommunicator final : public Communicator {
 public:
  explicit RecordingCommunicator(bool in_place = false) : in_place_(in_place) {}
  bool shards_in_place() const override { return in_place_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "recording"; }
  void all_reduce_sum(Tensor t) override { calls.push_back("all_reduce " + std::to_string(t.numel())); }
  void all_reduce_max(Tensor t) override { calls.push_back("all_reduce_max " + std::to_string(t.numel())); }
  void reduce_scatter_sum(Tensor out, const Tensor& in) override {
    calls.push_back("reduce_scatter " + std::to_string(in.numel()));
    copy(out, in);
  }
  void all_gather(Tensor out, const Tensor& in) override {
    calls.push_back("all_gather " + std::to_string(in.numel()));
    copy(out, in);
  }
  void broadcast(Tensor, int) override { calls.push_back("broadcast"); }
  void barrier() override {}
  int64_t all_max_host(int64_t v) override { return v; }
  std::vector<std::string> calls;
  int copies = 0;  // collectives whose output was not their input

 private:
  bool in_place_;
  void copy(Tensor out, const Tensor& in) {
    ASSERT_EQ(out.numel(), in.numel());
    if (out.data == in.data) return;
    ++copies;
    std::memcpy(out.data, in.data, size_t(in.bytes()));
  }
};

const OptimizerConfig kOpt{5e-3f, 0.9, 0.999, 1e-8f, 0.01f, 0.5f, Moments::F32};

std::vector<float> masters(Ops& ops, const Transformer& m) {
  std::vector<float> all;
  for (const Parameter& p : m.params().all()) {
    std::vector<float> v(size_t(shape_numel(p.shape)));
    m.params().download(ops, p, v.data());
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

TEST(Zero3, AnIdleMicroBatchMakesTheCollectivesOfATrainedOne) {
  const auto dir = fixtures() / "models" / "qwen3-tiny-linear";  // 3 layers: the two buffers are reused
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  HostBatch none = batch;
  std::fill(none.targets.begin(), none.targets.end(), -100);
  auto ops = make_cpu_ops();
  auto model = load_pretrained(dir, *ops, std::nullopt, /*gradients=*/false);
  EXPECT_EQ(model->params().trainable_bytes().grads, 0u) << "no full-size gradient buffer, ever";
  EXPECT_ANY_THROW(model->params().all_grads());
  model->plan(batch.rows, batch.seq_len, Recompute::Full);
  RecordingCommunicator comm;
  TrainStep step(*model, kOpt, comm, 3);
  // Weights and gradients are this rank's slices only: at world size 1 exactly the model, no second copy.
  EXPECT_EQ(model->params().all_grads().numel(), model->params().numel());
  EXPECT_EQ(model->params().trainable_bytes().masters, size_t(model->params().numel()) * 4);
  EXPECT_EQ(model->params().trainable_bytes().grads, size_t(model->params().numel()) * 4);
  const std::vector<HostBatch> both{batch, batch}, one{batch, none};
  step.run(both, 1e-3f, 2 * batch.counted());
  const std::vector<std::string> trained = comm.calls;
  comm.calls.clear();
  step.run(one, 1e-3f, batch.counted());
  EXPECT_EQ(comm.calls, trained);
  // Two passes of 3 layers + the head group: reductions in every pass, not one per update.
  EXPECT_EQ(std::count_if(trained.begin(), trained.end(), [](const std::string& c) { return c.starts_with("reduce"); }),
            2 * 4);
}

// in_place: the communicator works in place (as NCCL does), so the slices are the buffers and backward
// accumulates into them as the single process does: bitwise its step, with no buffer beyond the slices and
// every collective issued, in place. Otherwise each micro-batch's gradients are reduced from a scratch and
// added into the slice: the same sums in another order (1e-6).
void one_rank_trains_as_the_single_process(bool in_place) {
  // Tied (2 layers) and untied (3 layers: the two layer buffers are reused within a pass).
  for (const char* name : {"qwen3-tiny", "qwen3-tiny-linear"})
    for (Recompute rc : {Recompute::None, Recompute::Elementwise, Recompute::Selective, Recompute::Full}) {
      SCOPED_TRACE(std::string(name) + ", recompute " + recompute_name(rc));
      const auto dir = fixtures() / "models" / name;
      const HostBatch batch = load_batch_file(dir / "batch.safetensors");
      HostBatch second = batch;
      std::rotate(second.input_ids.begin(), second.input_ids.begin() + 3, second.input_ids.end());
      const std::vector<HostBatch> micro{batch, second};
      const int64_t counted = batch.counted() + second.counted();
      auto ops = make_cpu_ops();
      auto single = load_pretrained(dir, *ops), sharded = load_pretrained(dir, *ops, std::nullopt, false);
      single->plan(batch.rows, batch.seq_len, rc);
      sharded->plan(batch.rows, batch.seq_len, rc);
      TrainStep a(*single, kOpt);
      RecordingCommunicator comm(in_place);
      TrainStep b(*sharded, kOpt, comm, 3);
      const Zero3::Bytes bytes = b.data_parallel()->zero3()->bytes();
      if (in_place) {
        EXPECT_EQ(bytes.gathered + bytes.grad_scratch, 0u) << "the slices are the buffers";
      } else {
        EXPECT_GT(bytes.gathered * bytes.grad_scratch, 0u);
      }
      for (int s = 0; s < 2; ++s) {
        a.run(micro, 1e-3f, counted);
        b.run(micro, 1e-3f, counted);
        if (in_place) {
          EXPECT_EQ(b.loss(), a.loss()) << "update " << s;
          EXPECT_EQ(b.grad_norm(), a.grad_norm()) << "update " << s;
        } else {
          EXPECT_NEAR(b.loss(), a.loss(), 1e-6 * a.loss()) << "update " << s;
          EXPECT_NEAR(b.grad_norm(), a.grad_norm(), 1e-6 * a.grad_norm()) << "update " << s;
        }
      }
      // Every reduction was issued (one per group and micro-batch) and every group gathered in each update.
      const auto count = [&](const char* kind) {
        return std::count_if(comm.calls.begin(), comm.calls.end(),
                             [&](const std::string& c) { return c.starts_with(kind); });
      };
      const int groups = int(sharded->params().groups());
      EXPECT_EQ(count("reduce_scatter"), 2 * 2 * groups);
      EXPECT_GE(count("all_gather"), 2 * groups);  // each group at least once an update (two layer buffers)
      if (in_place) {
        EXPECT_EQ(comm.copies, 0);
      }
      // The sharded model's masters, streamed group by group as a checkpoint reads them.
      b.settle();
      b.data_parallel()->zero3()->begin_masters();
      const std::vector<float> want = masters(*ops, *single), got = masters(*ops, *sharded);
      b.data_parallel()->zero3()->end_masters();
      ASSERT_EQ(got.size(), want.size());
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
      if (in_place) {
        EXPECT_EQ(got, want);
      } else {
        EXPECT_LT(worst, 1e-6);
      }
      // Training on after the checkpoint's gather (in place, onto the masters themselves) is still the same.
      if (in_place) {
        b.run(micro, 1e-3f, counted);
        a.run(micro, 1e-3f, counted);
        EXPECT_EQ(b.loss(), a.loss()) << "after the checkpoint";
      }
    }
}

TEST(Zero3, OneRankTrainsAsTheSingleProcessForEveryRecompute) {
  one_rank_trains_as_the_single_process(/*in_place=*/false);
}

TEST(Zero3, OneRankInPlaceIsTheSingleProcessBitwise) {
  one_rank_trains_as_the_single_process(/*in_place=*/true);
}

}  // namespace
}  // namespace soltrain::test
