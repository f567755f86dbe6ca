// AdamW's update with the fp32 masters and/or the moments in host memory (`offload_master`,
// `offload_optimizer`; fp32 or 8-bit moments): the update is cut into pieces, and each piece's host-held
// tensors are copied into one of two device staging slots on the upload stream, updated on the main stream by
// the same kernel the resident update runs (adamw, or adamw_8bit on whole 256-element blocks), and written
// back on the side stream. Piece i+1 is copied up while piece i is updated, and a slot is refilled only after
// its write-back, so the copies overlap the updates and no step waits for the host.
#include <vector>

#include "kernels/blockwise8.h"
#include "train/optimizer.h"

namespace soltrain {

void AdamW::stream_pieces(size_t count, const std::function<std::vector<Staged>(size_t)>& staged,
                          const std::function<void(size_t, const std::vector<Staged>&)>& update) {
  if (count == 0) return;
  // Copies up on the Upload stream, write-backs on Side: PCIe carries both directions at once. Uploads are
  // free to run during this step's backward still on the device (nothing here reads what backward writes),
  // but not before the previous step's write-backs, which they read (the host homes) or overwrite (slots).
  ops_.wait(Ops::Stream::Upload, Ops::Stream::Side);
  uint64_t written_back[2] = {0, 0};  // per slot: Side's mark after the write-back of the last piece it held
  std::vector<Staged> staged_in[2];   // per slot: what its piece staged (computed once, read again after update)
  auto upload = [&](size_t i) {
    ops_.use_stream(Ops::Stream::Upload);
    if (written_back[i % 2]) ops_.wait_mark(written_back[i % 2]);  // the slot's previous piece is home
    staged_in[i % 2] = staged(i);
    for (const Staged& s : staged_in[i % 2]) ops_.upload_async(s.stage, s.home);
    return ops_.mark();
  };
  uint64_t next = upload(0);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t ready = next;
    if (i + 1 < count) next = upload(i + 1);  // into the other slot, once piece i-1's write-back is queued
    ops_.use_stream(Ops::Stream::Main);
    ops_.wait_mark(ready);
    const std::vector<Staged>& st = staged_in[i % 2];
    update(i, st);
    const uint64_t done = ops_.mark();
    ops_.use_stream(Ops::Stream::Side);
    ops_.wait_mark(done);
    for (const Staged& s : st)
      if (s.back) ops_.download_async(s.home, s.stage);
    written_back[i % 2] = ops_.mark();
  }
  // Whatever runs next on the main stream (a checkpoint reading the host masters and moments, the next step)
  // sees the written-back values. (A part of an update in backward leaves them in flight while the next layers'
  // backward runs: the caller waits once the update's last part is queued.)
  ops_.use_stream(Ops::Stream::Main);
  if (only_group_ < 0) ops_.wait(Ops::Stream::Main, Ops::Stream::Side);
}

void AdamW::step_streamed(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  std::vector<ParamRange> pieces;  // cut once, in the constructor; a part's are its group's
  std::vector<int64_t> moments_at;
  for (const Piece& p : pieces_)
    if (updates(p.range.group)) pieces.push_back(p.range), moments_at.push_back(p.moments_at);
  const bool host_master = offload_.master, host_moments = offload_.optimizer;
  // The home of piece i's master (0) / m (1) / v (2): the store's masters, or the moments' buffers.
  auto home = [&](size_t i, int which) {
    const ParamRange& p = pieces[i];
    if (which == 0) return params_.masters(p);
    const Buffer& b = which == 1 ? m_ : v_;
    return Tensor{static_cast<float*>(b.data()) + moments_at[i], DType::F32, {p.numel}, b.device()};
  };
  // Slot i % 2 holds [master (offload_master) | m | v (offload_optimizer)], chunk_ floats each.
  auto staged = [&](size_t i) {
    std::vector<Staged> st;
    const Buffer& slot = stage_[i % 2];
    int64_t at = 0;
    for (int w = 0; w < 3; ++w) {
      if (!(w == 0 ? host_master : host_moments)) continue;
      st.push_back(
          {home(i, w), Tensor{static_cast<float*>(slot.data()) + at, DType::F32, {pieces[i].numel}, slot.device()}});
      at += chunk_;
    }
    // offload_grads: a decoder layer's gradient comes up after them (read only: nothing goes back)
    if (params_.grads_on_host(pieces[i]))
      st.push_back({params_.grads(pieces[i]),
                    Tensor{static_cast<float*>(slot.data()) + at, DType::F32, {pieces[i].numel}, slot.device()},
                    false});
    return st;
  };
  stream_pieces(pieces.size(), staged, [&](size_t i, const std::vector<Staged>& st) {
    const ParamRange& p = pieces[i];
    size_t k = 0;  // st holds the staged ones in the order master, m, v, gradient
    Tensor master = host_master ? st[k++].stage : home(i, 0);
    Tensor m = host_moments ? st[k++].stage : home(i, 1);
    Tensor v = host_moments ? st[k++].stage : home(i, 2);
    const Tensor grad = params_.grads_on_host(p) ? st[k++].stage : params_.grads(p);
    AdamWParams a{lr, cfg.beta1, cfg.beta2, cfg.eps, p.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
    a.grad_sumsq = grad_sumsq;
    a.max_grad_norm = cfg.max_grad_norm;
    a.sr_seed = sr_seed(p.offset);
    Tensor copy = params_.values(p);
    // On the CPU the masters are the compute copy: the written-back master is what the model reads.
    ops_.adamw(master, grad, m, v, a, params_.values_alias_masters() ? nullptr : &copy);
  });
}

void AdamW::step_streamed_8bit(const OptimizerConfig& cfg, float lr, float grad_scale, const Tensor* grad_sumsq) {
  std::vector<Piece8> pieces8;  // cut once, in the constructor; a part's are its group's
  for (const Piece8& pc : pieces8_)
    if (updates(slots_[pc.slot].param->group)) pieces8.push_back(pc);
  const bool host_master = offload_.master, host_moments = offload_.optimizer;
  const int64_t blocks = chunk_ / kBlockwise8Block;  // chunk_ is a whole number of blocks
  // Slot i % 2 holds [master (offload_master) | m | v | m absmax | v absmax (offload_optimizer)]: chunk_ floats
  // for each of the first three (codes take a quarter of it, small parameters' fp32 moments all), then
  // `blocks` floats for each absmax; then (offload_grads, a decoder layer's parameter) chunk_ floats of gradient.
  const int64_t grad_at = chunk_ * (int64_t(host_master) + 2 * int64_t(host_moments)) + 2 * blocks * host_moments;
  auto piece_range = [&](const Piece8& pc) { return range(slots_[pc.slot], pc.at, pc.numel); };
  auto staged_state = [&](size_t i) {
    const Piece8& pc = pieces8[i];
    const Slot& s = slots_[pc.slot];
    const Buffer& slot = stage_[i % 2];
    auto at = [&](int64_t floats, DType t, int64_t n) {
      return Tensor{static_cast<float*>(slot.data()) + floats, t, {n}, slot.device()};
    };
    std::vector<Staged> st;
    int64_t next = 0;
    if (host_master) {
      st.push_back({params_.masters(piece_range(pc)), at(0, DType::F32, pc.numel)});
      next = chunk_;
    }
    if (!host_moments) return st;
    for (bool second : {false, true}) {
      const int64_t where = next + (second ? chunk_ : 0);
      if (!s.quantised) {
        st.push_back({fp32_moment(s, second).flat_part(pc.at, pc.numel), at(where, DType::F32, pc.numel)});
        continue;
      }
      st.push_back({quantised(s, second).code.flat_part(pc.at, pc.numel), at(where, DType::U8, pc.numel)});
    }
    if (s.quantised) {
      const int64_t b0 = pc.at / kBlockwise8Block, nb = (pc.numel + kBlockwise8Block - 1) / kBlockwise8Block;
      for (bool second : {false, true})
        st.push_back({quantised(s, second).absmax.flat_part(b0, nb),
                      at(next + 2 * chunk_ + (second ? blocks : 0), DType::F32, nb)});
    }
    return st;
  };
  auto staged = [&](size_t i) {
    std::vector<Staged> st = staged_state(i);
    const ParamRange r = piece_range(pieces8[i]);
    if (params_.grads_on_host(r)) {
      const Buffer& slot = stage_[i % 2];
      st.push_back({params_.grads(r),
                    Tensor{static_cast<float*>(slot.data()) + grad_at, DType::F32, {r.numel}, slot.device()}, false});
    }
    return st;
  };
  stream_pieces(pieces8.size(), staged, [&](size_t i, const std::vector<Staged>& st) {
    const Piece8& pc = pieces8[i];
    const Slot& s = slots_[pc.slot];
    const ParamRange r = piece_range(pc);
    AdamWParams a{lr, cfg.beta1, cfg.beta2, cfg.eps, r.decay ? cfg.weight_decay : 0.0f, step_, grad_scale};
    a.grad_sumsq = grad_sumsq;
    a.max_grad_norm = cfg.max_grad_norm;
    a.sr_seed = sr_seed(r.offset);
    size_t k = 0;  // st holds the staged ones in the order master, m, v, m absmax, v absmax
    Tensor master = host_master ? st[k++].stage : params_.masters(r);
    Tensor copy = params_.values(r);
    Tensor* copy_out = params_.values_alias_masters() ? nullptr : &copy;
    const Tensor grad = params_.grads_on_host(r) ? st.back().stage : params_.grads(r);
    if (!s.quantised) {
      Tensor m = host_moments ? st[k++].stage : fp32_moment(s, false).flat_part(pc.at, pc.numel);
      Tensor v = host_moments ? st[k++].stage : fp32_moment(s, true).flat_part(pc.at, pc.numel);
      return ops_.adamw(master, grad, m, v, a, copy_out);
    }
    // A piece starts on a block boundary, so its blocks are the parameter's blocks from b0 on.
    const int64_t b0 = pc.at / kBlockwise8Block, nb = (pc.numel + kBlockwise8Block - 1) / kBlockwise8Block;
    Blockwise8 m = quantised(s, false), v = quantised(s, true);
    if (host_moments) {
      m.code = st[k].stage, v.code = st[k + 1].stage, m.absmax = st[k + 2].stage, v.absmax = st[k + 3].stage;
    } else {
      m.code = m.code.flat_part(pc.at, pc.numel), v.code = v.code.flat_part(pc.at, pc.numel);
      m.absmax = m.absmax.flat_part(b0, nb), v.absmax = v.absmax.flat_part(b0, nb);
    }
    ops_.adamw_8bit(master, grad, m, v, a, copy_out);
  });
}

}  // namespace soltrain
