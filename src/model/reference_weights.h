// A frozen copy of a model's compute weights: the reference policy of GRPO with beta > 0 under full fine-tuning
// (TRL keeps a second model for it; LoRA needs no copy: its reference is the base with the adapters off). Taken
// once, before training moves the weights (a resumed run's checkpoint is restored after it, so the reference
// stays the model the run started from), and lent to a model for one forward pass at a time.
#pragma once
#include <string>
#include <vector>

#include "core/buffer.h"
#include "model/parameters.h"

namespace soltrain {

class ReferenceWeights {
 public:
  // Copies every parameter's compute value (dense weights only) out of `source` onto the ops' device.
  ReferenceWeights(Ops& ops, const ParameterStore& source);
  size_t bytes() const { return buffer_.bytes(); }
  // The device bytes a copy of `source` takes, without making it (the run's memory check before allocation).
  static size_t bytes_for(const ParameterStore& source);
  // Why `params` cannot borrow a copy of `source` (a parameter missing, or of another shape or dtype), or empty.
  static std::string mismatch(const ParameterStore& source, const ParameterStore& params);

  // While a Lend lives, `params` (the same names and shapes as the source) computes with the copy: each
  // parameter's value points at it, and back when the Lend ends. Forward passes only: the gradients and the
  // optimizer never see the copy.
  class Lend {
   public:
    Lend(ReferenceWeights& ref, ParameterStore& params);
    ~Lend();
    Lend(const Lend&) = delete;
    Lend& operator=(const Lend&) = delete;

   private:
    ParameterStore& params_;
    std::vector<void*> own_;  // each parameter's value pointer while it is lent
  };

 private:
  Buffer buffer_;
  std::vector<Tensor> values_;  // per parameter of the source, in its order, viewing buffer_
};

}  // namespace soltrain
