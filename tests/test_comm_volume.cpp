// The communication plan `bench --plan-only --gpus N` prints (train/comm_volume.h) is what a rank's step
// actually calls: rank 0 of N ranks steps a tiny model through a communicator that counts every collective's
// elements instead of moving them, for each ZeRO stage, full fine-tuning and LoRA, one and three micro-batches
// and recompute none and full, and the plan's calls and bytes equal the counts.
#include <cstring>
#include <string>
#include <vector>

#include "data/batch_file.h"
#include "model/checkpoint.h"
#include "test_util.h"
#include "train/comm_volume.h"
#include "train/train_step.h"

namespace soltrain::test {
namespace {

// Rank 0 of `size`: every collective counted by the bytes a ring sends from this rank; the outputs hold this
// rank's own part (the other ranks' parts are left as they were: the numbers are not what is tested).
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  const char* backend() const override { return "counting"; }
  void all_reduce_sum(Tensor t) override {
    v.all_reduce += 2.0 * (size_ - 1) / size_ * double(t.bytes());
    ++v.all_reduces;
  }
  void all_reduce_max(Tensor t) override { all_reduce_sum(t); }
  void reduce_scatter_sum(Tensor out, const Tensor& in) override {
    ASSERT_EQ(in.numel(), out.numel() * size_);
    v.reduce_scatter += double(size_ - 1) * double(out.bytes());
    ++v.reduce_scatters;
    if (out.data != in.data) std::memcpy(out.data, in.data, size_t(out.bytes()));
  }
  void all_gather(Tensor out, const Tensor& in) override {
    ASSERT_EQ(out.numel(), in.numel() * size_);
    v.all_gather += double(size_ - 1) * double(in.bytes());
    ++v.all_gathers;
    if (out.data != in.data) std::memcpy(out.data, in.data, size_t(in.bytes()));
  }
  void broadcast(Tensor, int) override {}
  void barrier() override {}
  int64_t all_max_host(int64_t x) override { return x; }
  CommVolume v;

 private:
  int size_;
};

TEST(CommVolume, ThePlanIsWhatARankCalls) {
  const auto dir = fixtures() / "models" / "qwen3-tiny-linear";  // 3 layers: the two gather buffers are reused
  const HostBatch batch = load_batch_file(dir / "batch.safetensors");
  const OptimizerConfig opt{5e-3f, 0.9, 0.999, 1e-8f, 0.01f, 0.5f, Moments::F32};
  for (int size : {2, 4})
    for (int zero : {0, 1, 2, 3})
      for (bool lora : {false, true})
        for (int micro : {1, 3})
          for (Recompute rc : {Recompute::None, Recompute::Full}) {
            if (rc == Recompute::Full && zero != 3) continue;  // (only stage 3's gathers meet recompute)
            SCOPED_TRACE(cat(size, " ranks, ZeRO ", zero, lora ? ", LoRA" : ", full", ", ", micro,
                             " micro-batches, recompute ", recompute_name(rc)));
            auto ops = make_cpu_ops();
            std::optional<LoraConfig> lc;
            if (lora) lc = LoraConfig{4, 8.0f, 0.0f, all_lora_module_names(), false, 1};
            auto model = load_pretrained(dir, *ops, lc, /*gradients=*/zero != 3);
            model->plan(batch.rows, batch.seq_len, rc);
            CountingCommunicator comm(size);
            TrainStep step(*model, opt, comm, zero);
            const std::vector<HostBatch> micros(size_t(micro), batch);
            for (int update = 0; update < 2; ++update) {
              comm.v = {};
              step.run(micros, 1e-3f, micro * batch.counted());
              const CommVolume want = comm_volume(step.data_parallel()->plan(), zero, model->head_group(), micro,
                                                  dtype_size(ops->activation_dtype()));
              EXPECT_EQ(comm.v.all_gathers, want.all_gathers);
              EXPECT_EQ(comm.v.reduce_scatters, want.reduce_scatters);
              EXPECT_EQ(comm.v.all_reduces, want.all_reduces);
              EXPECT_DOUBLE_EQ(comm.v.all_gather, want.all_gather);
              EXPECT_DOUBLE_EQ(comm.v.reduce_scatter, want.reduce_scatter);
              EXPECT_DOUBLE_EQ(comm.v.all_reduce, want.all_reduce);
              EXPECT_GT(want.total(), 0);
            }
          }
}

}  // namespace
}  // namespace soltrain::test
