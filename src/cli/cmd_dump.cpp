// `soltrain dump`: logits, loss and every trainable parameter's gradient of one batch (all weights, or with
// --adapter the LoRA tensors under PEFT's names), for comparison with PyTorch / PEFT.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "data/batch_file.h"
#include "io/output_dir.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"

namespace soltrain {

std::function<int()> add_dump_command(CLI::App& app) {
  struct Opts {
    std::string model, adapter, save_adapter, batch, out, device = "cpu", residual_dtype = "auto", qlora = "none";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("dump", "write logits, loss and gradients of one batch as safetensors");
  c->add_option("--model", o->model, "Hugging Face model folder")->required();
  c->add_option("--adapter", o->adapter, "PEFT LoRA adapter folder: the base is frozen, gradients are the adapter's");
  c->add_option("--save-adapter", o->save_adapter,
                "also write the loaded adapter back out as soltrain saves adapters (PEFT round-trip checks)")
      ->needs("--adapter");
  c->add_option("--qlora", o->qlora,
                "hold the frozen base quantised: nf4 or fp8 (quantised on load; an FP8 checkpoint is fp8 as stored)")
      ->check(CLI::IsMember({"none", "nf4", "fp8"}))
      ->needs("--adapter")
      ->capture_default_str();
  c->add_option("--batch", o->batch, "safetensors with input_ids and targets [B,T]")->required();
  c->add_option("--out", o->out, "output .safetensors file")->required();
  c->add_option("--residual-dtype", o->residual_dtype,
                "the residual stream's dtype on the GPU: auto (fp32 with LoRA, else bf16), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  add_device_option(c, o->device);
  return [o]() {
    if (!o->save_adapter.empty()) {
      check_output_dir(o->save_adapter, false, "", "adapter (--save-adapter)");
      check_output_apart_from_inputs(o->save_adapter, "--save-adapter",
                                     {{o->model, "--model"}, {o->adapter, "--adapter"}});
    }
    auto ops = make_ops(o->device);
    const WeightFormat base = o->qlora == "nf4"   ? WeightFormat::Nf4
                              : o->qlora == "fp8" ? WeightFormat::Fp8Block
                                                  : WeightFormat::Dense;
    auto model = o->adapter.empty() ? load_pretrained(o->model, *ops)
                                    : load_pretrained_with_adapter(o->model, o->adapter, *ops, base);
    model->enable_dropout(false);  // a reference to compare with is deterministic (PEFT in eval mode)
    const HostBatch batch = load_batch_file(o->batch);
    validate_batch(batch, model->config().vocab_size, o->batch);
    model->set_residual_dtype(parse_residual_dtype(o->residual_dtype, "--residual-dtype"));
    model->plan(batch.rows, batch.seq_len);
    const int64_t V = model->config().vocab_size;
    std::vector<float> logits(size_t(batch.rows) * size_t(batch.seq_len) * size_t(V));
    ops->zero(model->params().all_grads());
    const StepResult r = model->step(batch, true, logits.data());

    float loss = float(r.loss);
    std::vector<NamedTensor> out{
        {"logits", Tensor{logits.data(), DType::F32, {batch.rows, batch.seq_len, V}, Device::CPU}},
        {"loss", Tensor{&loss, DType::F32, {1}, Device::CPU}}};
    std::vector<std::vector<float>> grads;
    grads.reserve(model->params().all().size());
    for (const Parameter& p : model->params().all()) {
      if (!p.trainable) continue;
      grads.emplace_back(size_t(shape_numel(p.shape)));
      Tensor h{grads.back().data(), DType::F32, p.shape, Device::CPU};
      ops->copy(h, p.grad);
      out.push_back({"grad." + p.name, h});
    }
    write_safetensors(o->out, out);
    if (!o->save_adapter.empty()) save_adapter(*model, o->save_adapter, {o->model});
    std::cout << "loss " << r.loss << " over " << r.counted << " targets; wrote " << o->out << "\n";
    return 0;
  };
}

}  // namespace soltrain
