#!/usr/bin/env bash
# Builds everything and runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j3  # many tests wait on subprocesses
# The Python API (python/tests) over the module just built, its references computed live by transformers,
# PEFT 0.21 (0.22 moved Qwen2-MoE's gate/up/down LoRA onto its experts, which soltrain follows 0.21 in not doing:
# pinned until that is built), TRL, LLaMA-Factory, bitsandbytes (the LLM.int8 base's reference), torchao 0.17 (adamw_torch_8bit's, QAT's and the NVFP4 base's;
# the version Axolotl pins) and mistral-common (the tekken tokenizer's
# and Mistral chat formats') on CPU torch, and the clients soltrain's outputs must
# satisfy (Ray for the Ray launcher's jobs, openai for serve, wandb, mlflow, swanlab and OpenTelemetry's Prometheus exporter for report_to, huggingface_hub for push_to_hub): from PyPI when
# missing (torch pinned to the CPU build this machine kind keeps on disk; an unpinned torch would be a multi-GB
# CUDA build).
python3 -c "import pytest, datasets, torch, transformers, peft, trl, bitsandbytes, torchao, mistral_common, openai, wandb, mlflow, swanlab, opentelemetry.exporter.prometheus, ray; assert torchao.__version__ == '0.17.0' and peft.__version__.startswith('0.21.')" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check pytest datasets torch==2.13.0 transformers 'peft==0.21.*' trl \
    bitsandbytes torchao==0.17.0 mistral-common==1.13.1 openai wandb mlflow-skinny swanlab \
    opentelemetry-exporter-prometheus ray
# LLaMA-Factory's data code (python/tests/test_llama_factory.py's reference): its wheel without its dependencies,
# whose pins (transformers <= 5.6) would replace the ones above; what its data code imports is among them, and omegaconf.
python3 -c "import omegaconf, importlib.metadata as m; assert m.version('llamafactory') == '0.9.5'" 2>/dev/null || {
  python3 -m pip install --quiet --disable-pip-version-check omegaconf &&
    python3 -m pip install --quiet --disable-pip-version-check --no-deps llamafactory==0.9.5
}
python3 -m pytest python/tests -q
