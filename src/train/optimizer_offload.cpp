// AdamW's update with the fp32 masters and/or moments in host memory (`offload_master`, `offload_optimizer`):
// each (group, decay) range, cut into chunks, is copied into one of two device staging slots on the side
// stream, updated on the main stream by the same adamw() the resident update runs, and written back on the
// side stream. Chunk i+1 is copied up while chunk i is updated, and a slot is refilled only after its
// write-back, so the copies overlap the updates and no step waits for the host.
#include <vector>

#include "train/optimizer.h"

namespace soltrain {

void AdamW::step_streamed(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  const std::vector<ParamRange>& pieces = pieces_;  // cut once, in the constructor
  if (pieces.empty()) return;

  const bool host_master = offload_.master, host_moments = offload_.optimizer;
  // Where each of master (0), m (1), v (2) sits in a slot; -1: not staged (resident on the device).
  const int at_m = host_master ? 1 : 0;
  const int where[3] = {host_master ? 0 : -1, host_moments ? at_m : -1, host_moments ? at_m + 1 : -1};
  auto staged = [&](size_t i, int which) {
    const Buffer& slot = stage_[i % 2];
    return Tensor{static_cast<float*>(slot.data()) + int64_t(where[which]) * chunk_,
                  DType::F32,
                  {pieces[i].numel},
                  slot.device()};
  };
  // The home of piece i's master / m / v: the store's masters, or the moments' buffers (host or device).
  auto home = [&](size_t i, int which) {
    const ParamRange& p = pieces[i];
    if (which == 0) return params_.masters(p);
    const Buffer& b = which == 1 ? m_ : v_;
    return Tensor{static_cast<float*>(b.data()) + p.offset, DType::F32, {p.numel}, b.device()};
  };
  // On the side stream: queued behind the previous step's write-backs (same stream), and free to run during
  // this step's backward still on the device, as nothing here reads what backward writes.
  auto upload = [&](size_t i) {
    for (int w = 0; w < 3; ++w)
      if (where[w] >= 0) ops_.upload_async(staged(i, w), home(i, w));
    return ops_.mark();
  };

  ops_.use_stream(Ops::Stream::Side);
  uint64_t next = upload(0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const uint64_t ready = next;
    // The other slot: its last use, piece i-1's write-back, is already queued ahead on this stream.
    if (i + 1 < pieces.size()) next = upload(i + 1);
    ops_.use_stream(Ops::Stream::Main);
    ops_.wait_mark(ready);
    const ParamRange& p = pieces[i];
    AdamWParams a{lr, cfg.beta1, cfg.beta2, cfg.eps, p.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
    a.grad_sumsq = grad_sumsq;
    a.max_grad_norm = cfg.max_grad_norm;
    Tensor master = where[0] >= 0 ? staged(i, 0) : home(i, 0);
    Tensor copy = params_.values(p);
    // On the CPU the masters are the compute copy: the written-back master is what the model reads.
    ops_.adamw(master, params_.grads(p), where[1] >= 0 ? staged(i, 1) : home(i, 1),
               where[2] >= 0 ? staged(i, 2) : home(i, 2), a, params_.values_alias_masters() ? nullptr : &copy);
    const uint64_t done = ops_.mark();
    ops_.use_stream(Ops::Stream::Side);
    ops_.wait_mark(done);
    for (int w = 0; w < 3; ++w)
      if (where[w] >= 0) ops_.download_async(home(i, w), staged(i, w));
  }
  // Whatever runs next on the main stream (a checkpoint reading the host masters and moments, the next step)
  // sees the written-back values.
  ops_.use_stream(Ops::Stream::Main);
  ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
}

}  // namespace soltrain
