// soltrain quantize (hidden; a test tool): every matrix of a safetensors file quantised to a QLoRA base format,
// written in the layouts other tools read, so tests/tools/check_quant.py can check our NF4 blocks and FP8
// tiles (and LLM.int8's rows: `X` the int8 codes as U8 bytes, `X.SCB` the rows' absmax) against torch and
// bitsandbytes. NF4 in bitsandbytes' serialised names: `X` (packed codes, the even element in the high
// nibble), `X.absmax` (U8 codes of the absmaxes), `X.nested_absmax`, `X.nested_quant_map`, `X.quant_map` and
// `X.offset` (the absmaxes' mean); FP8 as the Qwen3 FP8 checkpoints: `X` F8_E4M3 and `X_scale_inv`.
#include <cstring>
#include <iostream>

#include "cli/commands.h"
#include "io/safetensors.h"
#include "kernels/cpu/quantize.h"
#include "kernels/quant.h"

namespace soltrain {

std::function<int()> add_quantize_command(CLI::App& app) {
  struct Opts {
    std::string in, out, format;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("quantize", "quantise every matrix of a safetensors file (test tool)");
  c->group("");  // hidden: for tests/tools/check_quant.py
  c->add_option("--in", o->in, "safetensors file")->required();
  c->add_option("--out", o->out, "output safetensors file")->required();
  c->add_option("--format", o->format, "nf4, fp8, int8 or nvfp4")
      ->required()
      ->check(CLI::IsMember({"nf4", "fp8", "int8", "nvfp4"}));
  return [o]() {
    const SafetensorsFile in(o->in);
    // Every output tensor's bytes live here until the file is written.
    std::vector<std::vector<uint8_t>> store;
    std::vector<NamedTensor> out;
    auto add = [&](const std::string& name, DType dtype, Shape shape, const void* bytes) {
      const size_t n = size_t(shape_numel(shape)) * dtype_size(dtype);
      store.emplace_back(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + n);
      out.push_back({name, Tensor{store.back().data(), dtype, std::move(shape), Device::CPU}});
    };
    store.reserve(6 * in.entries().size() + 1);
    for (const auto& [name, e] : in.entries()) {
      if (e.shape.size() != 2) continue;
      std::vector<float> w(size_t(shape_numel(e.shape)));
      read_as_f32(e, e.shape, w.data(), o->in + ": " + name);
      const int64_t rows = e.shape[0], cols = e.shape[1], n = rows * cols;
      if (o->format == "fp8") {
        const int64_t T = quant::kFp8Tile;
        std::vector<uint8_t> q(static_cast<size_t>(n));
        std::vector<float> s(size_t(((rows + T - 1) / T) * ((cols + T - 1) / T)));
        fp8_block_quantize(w.data(), rows, cols, q.data(), s.data());
        add(name, DType::F8E4M3, e.shape, q.data());
        add(name + "_scale_inv", DType::F32, {(rows + T - 1) / T, (cols + T - 1) / T}, s.data());
        continue;
      }
      if (o->format == "nvfp4") {  // ModelOpt's names: X (the codes, two a byte), X_scale (E4M3), X_scale_2 (F32)
        if (cols % quant::kNvfp4Block != 0) continue;
        std::vector<uint8_t> q(static_cast<size_t>(n / 2)), s(size_t(quant::nvfp4_scale_bytes(rows, cols)));
        nvfp4_quantize(w.data(), rows, cols, q.data(), s.data());
        add(name, DType::U8, {rows, cols / 2}, q.data());
        add(name + "_scale", DType::F8E4M3, {rows, cols / quant::kNvfp4Block}, s.data() + quant::kNvfp4BlockScalesAt);
        add(name + "_scale_2", DType::F32, {}, s.data());
        continue;
      }
      if (o->format == "int8") {  // bitsandbytes' names: the codes (int8 stored as U8 bytes) and SCB
        std::vector<uint8_t> q(static_cast<size_t>(n));
        std::vector<float> absmax(static_cast<size_t>(rows));
        int8_row_quantize(w.data(), rows, cols, q.data(), absmax.data());
        add(name, DType::U8, e.shape, q.data());
        add(name + ".SCB", DType::F32, {rows}, absmax.data());
        continue;
      }
      const quant::Nf4Layout l(n);
      std::vector<uint8_t> data(size_t(l.data_bytes())), scale(size_t(l.scale_bytes()));
      nf4_quantize(w.data(), n, data.data(), scale.data());
      float codes[16];
      for (int i = 0; i < 16; ++i) codes[i] = quant::nf4_code(i);
      add(name, DType::U8, {l.data_bytes()}, data.data());
      add(name + ".absmax", DType::U8, {l.blocks}, scale.data() + l.codes_offset());
      add(name + ".nested_absmax", DType::F32, {l.nested}, scale.data() + l.nested_offset());
      add(name + ".nested_quant_map", DType::F32, {256}, scale.data() + 4);
      add(name + ".quant_map", DType::F32, {16}, codes);
      add(name + ".offset", DType::F32, {1}, scale.data());
    }
    write_safetensors(o->out, out, {{"format", o->format}});
    std::cout << "quantize: " << out.size() << " tensors written to " << o->out << "\n";
    return 0;
  };
}

}  // namespace soltrain
