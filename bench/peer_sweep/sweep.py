#!/usr/bin/env python3
"""Peer-example sweep: the Axolotl and Surogate example configs for dense Llama / Qwen2 / Qwen3 / Mistral
models, run unchanged through `soltrain` on tiny random stand-ins of their models and data sets.

What it does (see README.md beside this file):
  1. selects the configs from the peers' bare git mirrors (HEAD) by the architecture their base model is;
  2. builds a Hugging Face hub cache (huggingface_hub's layout) with a tiny stand-in for every model id and
     data set id the selected configs name, and lays out each peer's checkout (examples/, deepspeed_configs/)
     as the working folder, as a user running `axolotl train examples/...` from a checkout has it;
  3. runs each config with only output_dir and max_steps changed (text edit: those top-level lines replaced,
     everything else byte for byte), with HF_HUB_CACHE pointing at the stand-ins and HF_HUB_OFFLINE=1 and WANDB_MODE=offline;
  4. classifies RUNS / REFUSED-ONE-LINE / FAILED and writes results-axolotl.md, results-surogate.md and
     results.json beside this file.

Usage:
  python3 bench/peer_sweep/sweep.py                       # both peers, every selected config
  python3 bench/peer_sweep/sweep.py --peer axolotl --only 'llama-3/lora'   # a subset (regex on the path)
  python3 bench/peer_sweep/sweep.py --list                # the selection and the exclusions only
Options: --bin (default /tmp/sweep-bin/soltrain), --work (default /tmp/peer_sweep), --timeout (300 s),
--rebuild (build the stand-in cache again), --no-write (do not rewrite the results files).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
AXOLOTL_GIT = Path("/work/.mirror/axolotl-ai-cloud+axolotl/repo")
SUROGATE_GIT = Path("/work/.mirror/invergent-ai+surogate/repo")
TOKENIZERS = REPO / "build" / "tokenizers"          # tests/tools/fetch_tokenizers.sh output (real files)
LLAMA3_TOKCFG = REPO / "tests" / "fixtures" / "tokenizers" / "llama3" / "tokenizer_config.json"
CACHE_VERSION = "10"  # bump when a stand-in changes, so an old cache is rebuilt

# --------------------------------------------------------------------------------------------------------
# Selection: the architecture each base model id is (from the hub repositories' config.json).
# Dense Llama / Qwen2 / Qwen3 / Mistral decoder-only text models are selected; everything else is excluded
# with the reason given.
# --------------------------------------------------------------------------------------------------------

# id -> stand-in spec. arch: llama | qwen2 | qwen3 | mistral. tok: which tokenizer stand-in (see TOKENIZER_KINDS).
# real_max_pos: the real model's max_position_embeddings (the stand-in gets max(real, 8192, sequence_len)).
L31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
L32_ROPE = dict(L31_ROPE, factor=32.0)
MODELS: dict[str, dict] = {
    # ---- Llama 3.x (Llama 3 tokenizer) ----
    "meta-llama/Llama-3.1-8B": dict(arch="llama", tok="llama31-base", real_max_pos=131072, rope=L31_ROPE),
    "NousResearch/Meta-Llama-3.1-8B": dict(arch="llama", tok="llama31-base", real_max_pos=131072, rope=L31_ROPE),
    "neuralmagic/Sparse-Llama-3.1-8B-2of4": dict(arch="llama", tok="llama31-base", real_max_pos=131072, rope=L31_ROPE,
                                                 note="real weights are 2:4-sparse bf16 (plain layout); stand-in dense random"),
    "hugging-quants/Meta-Llama-3.1-405B-BNB-NF4-BF16": dict(arch="llama", tok="llama31-base", real_max_pos=131072,
                                                            rope=L31_ROPE, quant="bnb-nf4"),
    "NousResearch/Meta-Llama-3-8B": dict(arch="llama", tok="llama3-base", real_max_pos=8192, rope={"rope_theta": 500000.0}),
    "casperhansen/llama-3-70b-fp16": dict(arch="llama", tok="llama3-base", real_max_pos=8192,
                                          rope={"rope_theta": 500000.0}, dtype="float16"),
    "NousResearch/Meta-Llama-3-8B-Instruct": dict(arch="llama", tok="llama3-instruct", real_max_pos=8192,
                                                  rope={"rope_theta": 500000.0}),
    "meta-llama/Meta-Llama-3-8B-Instruct": dict(arch="llama", tok="llama3-instruct", real_max_pos=8192,
                                                rope={"rope_theta": 500000.0}),
    "meta-llama/Llama-3.2-1B": dict(arch="llama", tok="llama32-base", real_max_pos=131072, rope=L32_ROPE, tie=True),
    "meta-llama/Llama-3.2-3B": dict(arch="llama", tok="llama32-base", real_max_pos=131072, rope=L32_ROPE, tie=True),
    "NousResearch/Llama-3.2-1B": dict(arch="llama", tok="llama32-base", real_max_pos=131072, rope=L32_ROPE, tie=True),
    "meta-llama/Llama-3.2-1B-Instruct": dict(arch="llama", tok="llama31-instruct", real_max_pos=131072, rope=L32_ROPE,
                                             tie=True),
    "deepcogito/cogito-v1-preview-llama-3B": dict(arch="llama", tok="llama31-instruct", real_max_pos=131072,
                                                  rope=L32_ROPE, tie=True),
    "canopylabs/orpheus-3b-0.1-pretrained": dict(arch="llama", tok="llama32-base", real_max_pos=131072, rope=L32_ROPE,
                                                 tie=True, vocab=156940,
                                                 note="real vocab 156940 (Llama 3 + audio tokens); stand-in Llama 3 tokenizer"),
    "HuggingFaceTB/SmolLM2-135M": dict(arch="llama", tok="llama3-base", real_max_pos=8192, rope={"rope_theta": 100000.0},
                                       tie=True, note="real tokenizer is SmolLM's 49152-token BPE; stand-in Llama 3's"),
    "Salesforce/xgen-7b-8k-base": dict(arch="llama", tok="qwen3", real_max_pos=8192, rope={"rope_theta": 10000.0},
                                       dtype="float32",
                                       note="real tokenizer is remote code (tiktoken's GPT-2 BPE, <|endoftext|> its eos; "
                                            "no tokenizer.json); stand-in Qwen3's, which has <|endoftext|>"),
    # ---- Llama 1/2 family (SentencePiece-layout BPE tokenizer stand-in) ----
    "NousResearch/Llama-2-7b-hf": dict(arch="llama", tok="sp", real_max_pos=4096, rope={"rope_theta": 10000.0},
                                       dtype="float16", vocab=32000),
    "TheBloke/Llama-2-7B-GPTQ": dict(arch="llama", tok="sp", real_max_pos=4096, rope={"rope_theta": 10000.0},
                                     dtype="float16", vocab=32000, quant="gptq"),
    "codellama/CodeLlama-7b-hf": dict(arch="llama", tok="sp", real_max_pos=16384, rope={"rope_theta": 1000000.0},
                                      vocab=32016),
    "codellama/CodeLlama-13b-hf": dict(arch="llama", tok="sp", real_max_pos=16384, rope={"rope_theta": 1000000.0},
                                       vocab=32016),
    "codellama/CodeLlama-34b-hf": dict(arch="llama", tok="sp", real_max_pos=16384, rope={"rope_theta": 1000000.0},
                                       vocab=32000),
    "huggyllama/llama-7b": dict(arch="llama", tok="sp", real_max_pos=2048, rope={"rope_theta": 10000.0},
                                dtype="float16", vocab=32000),
    "openlm-research/open_llama_3b_v2": dict(arch="llama", tok="sp", real_max_pos=2048, rope={"rope_theta": 10000.0},
                                             dtype="float16", vocab=32000),
    "TinyLlama/TinyLlama_v1.1": dict(arch="llama", tok="sp", real_max_pos=2048, rope={"rope_theta": 10000.0},
                                     dtype="float32", vocab=32000),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": dict(arch="llama", tok="sp-zephyr", real_max_pos=2048,
                                               rope={"rope_theta": 10000.0}, vocab=32000),
    "01-ai/Yi-34B-Chat": dict(arch="llama", tok="sp-yi", real_max_pos=4096, rope={"rope_theta": 5000000.0},
                              vocab=64000, note="real Yi vocab 64000 with <|im_start|>/<|im_end|>; stand-in SP-layout BPE"),
    # ---- Qwen2 / Qwen2.5 (Qwen tokenizer) ----
    "Qwen/Qwen2.5-0.5B": dict(arch="qwen2", tok="qwen25-base", real_max_pos=32768, rope={"rope_theta": 1000000.0}, tie=True),
    "Qwen/Qwen2.5-3B": dict(arch="qwen2", tok="qwen25-base", real_max_pos=32768, rope={"rope_theta": 1000000.0}, tie=True),
    "Qwen/Qwen2.5-72B": dict(arch="qwen2", tok="qwen25-base", real_max_pos=131072, rope={"rope_theta": 1000000.0}),
    "Qwen/Qwen2-7B": dict(arch="qwen2", tok="qwen25-base", real_max_pos=131072, rope={"rope_theta": 1000000.0}),
    "agentica-org/DeepCoder-14B-Preview": dict(arch="qwen2", tok="qwen3", real_max_pos=131072,
                                               rope={"rope_theta": 1000000.0},
                                               note="real tokenizer is DeepSeek-R1-Distill's (Qwen vocab, BOS added); stand-in Qwen3's"),
    "deepcogito/cogito-v1-preview-qwen-14B": dict(arch="qwen2", tok="qwen3", real_max_pos=131072,
                                                  rope={"rope_theta": 1000000.0}),
    # ---- Qwen3 ----
    "Qwen/Qwen3-0.6B": dict(arch="qwen3", tok="qwen3", real_max_pos=40960, rope={"rope_theta": 1000000.0}, tie=True),
    "Qwen/Qwen3-1.7B": dict(arch="qwen3", tok="qwen3", real_max_pos=40960, rope={"rope_theta": 1000000.0}, tie=True),
    "PrimeIntellect/Qwen3-0.6B": dict(arch="qwen3", tok="qwen3", real_max_pos=40960, rope={"rope_theta": 1000000.0},
                                      tie=True),
    "surogate/Qwen3-0.6B-FP8": dict(arch="qwen3", tok="qwen3", real_max_pos=40960, rope={"rope_theta": 1000000.0},
                                    tie=True, quant="fp8"),
    "surogate/Qwen3-0.6B-NVFP4": dict(arch="qwen3", tok="qwen3", real_max_pos=40960, rope={"rope_theta": 1000000.0},
                                      tie=True, quant="nvfp4"),
    "Qwen/Qwen3-8B": dict(arch="qwen3", tok="qwen3", real_max_pos=40960, rope={"rope_theta": 1000000.0}),
    "Qwen/Qwen3-32B": dict(arch="qwen3", tok="qwen3", real_max_pos=40960, rope={"rope_theta": 1000000.0}),
    "katanemo/Plano-Orchestrator-4B": dict(arch="qwen3", tok="qwen3", real_max_pos=262144, rope={"rope_theta": 5000000.0},
                                           tie=True, note="assumed Qwen3-4B-based (the example sets chat_template: qwen3)"),
    "Skywork/Skywork-Reward-V2-Qwen3-8B": dict(arch="qwen3", tok="qwen3", real_max_pos=40960,
                                               rope={"rope_theta": 1000000.0}, head="seqcls"),
    "Qwen/Qwen3-VL-2B-Instruct": dict(arch="qwen3vl", tok="qwen3", real_max_pos=262144, rope={"rope_theta": 5000000.0},
                                      tie=True, note="Qwen3VLForConditionalGeneration (text + vision tower)"),
    # ---- Mistral ----
    "mistralai/Mistral-7B-v0.1": dict(arch="mistral", tok="sp", real_max_pos=32768, rope={"rope_theta": 10000.0},
                                      vocab=32000, sliding_window=4096),
    "mistralai/Mistral-7B-Instruct-v0.2": dict(arch="mistral", tok="sp-mistral-inst", real_max_pos=32768,
                                               rope={"rope_theta": 1000000.0}, vocab=32000, sliding_window=None),
    "mistralai/Ministral-8B-Instruct-2410": dict(arch="mistral", tok="tekken-v3", real_max_pos=32768,
                                                 rope={"rope_theta": 100000000.0}, vocab=131072, sliding_window=32768,
                                                 note="real repo has tokenizer.json + tekken.json (v3); stand-in: "
                                                      "mistral-common's NeMo tekken.json only"),
    "mistralai/Devstral-Small-2507": dict(arch="mistral", tok="tekken-v11", real_max_pos=131072,
                                          rope={"rope_theta": 1000000000.0}, vocab=131072, sliding_window=None,
                                          head_dim=32, note="head_dim != hidden/heads as in Mistral Small 3; tekken.json "
                                                            "stand-in: mistral-common's NeMo vocabulary as format v11"),
    "mistralai/Magistral-Small-2506": dict(arch="mistral", tok="tekken-v11", real_max_pos=40960,
                                           rope={"rope_theta": 1000000000.0}, vocab=131072, sliding_window=None,
                                           head_dim=32, note="as Devstral"),
    "mistralai/Magistral-Small-2507": dict(arch="mistral", tok="tekken-v13", real_max_pos=40960,
                                           rope={"rope_theta": 1000000000.0}, vocab=131072, sliding_window=None,
                                           head_dim=32, note="as Devstral, format v13 ([THINK] chunks)"),
}
# Surogate's pt example names a local folder (its README: download Qwen/Qwen3-0.6B there first).
LOCAL_MODELS = {"./Qwen3-0.6B": "Qwen/Qwen3-0.6B"}

# Excluded base model ids, by reason (anything neither here nor in MODELS is "other family").
EXCLUDED_MODELS = {
    "MoE": ["LiquidAI/LFM2-8B-A1B", "Qwen/Qwen1.5-MoE-A2.7B", "LnL-AI/dbrx-base-converted-v2",
            "mistralai/Mixtral-8x7B-v0.1", "mistral-community/Mixtral-8x22B-v0.1", "Qwen/Qwen3-30B-A3B-Instruct-2507",
            "nvidia/Qwen3-30B-A3B-NVFP4", "deepseek-ai/DeepSeek-V2-Lite", "axolotl-quants/DeepSeek-V2.5-bnb-nf4-bf16",
            "nvidia/DeepSeek-V4-Flash-NVFP4", "openai/gpt-oss-20b", "openai/gpt-oss-safeguard-20b",
            "axolotl-ai-co/gpt-oss-120b-dequantized", "google/gemma-4-26B-A4B", "nvidia/Gemma-4-26B-A4B-NVFP4",
            "zai-org/GLM-4.5-Air", "zai-org/GLM-4.7-Flash", "Mapika/GLM-5.2-NVFP4", "moonshotai/Kimi-Linear-48B-A3B-Instruct",
            "MiniMaxAI/MiniMax-M2", "Qwen/Qwen3-Next-80B-A3B-Instruct", "nvidia/Qwen3-Next-80B-A3B-Instruct-NVFP4",
            "Qwen/Qwen3.5-122B-A10B", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3.5-35B-A3B-Base", "ai21labs/Jamba-v0.1",
            "ai21labs/AI21-Jamba-1.5-Large", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
            "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "ibm-granite/granite-4.0-tiny-preview",
            "axolotl-ai-co/Mistral-Small-4-119B-2603-BF16", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3.5-35B-A3B-FP8",
            "Qwen/Qwen3.6-35B-A3B", "nvidia/Nemotron-Cascade-2-30B-A3B", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4",
            "poolside/Laguna-S-2.1"],
    "vision / multimodal": ["LiquidAI/LFM2-VL-450M", "alpindale/Llama-3.2-11B-Vision-Instruct",
                            "axolotl-quants/Llama-4-Maverick-17B-128E-Linearized-bnb-nf4-bf16",
                            "axolotl-quants/Llama-4-Scout-17B-16E-Linearized-bnb-nf4-bf16", "llava-hf/llava-1.5-7b-hf",
                            "mistralai/Magistral-Small-2509", "mistralai/Ministral-3-3B-Reasoning-2512",
                            "axolotl-ai-co/Mistral-Medium-3.5-128B-BF16", "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
                            "mistral-community/pixtral-12b", "Qwen/Qwen2-VL-7B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct",
                            "OpenGVLab/InternVL3_5-8B-HF", "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
                            "PaddlePaddle/PaddleOCR-VL-1.6", "zai-org/GLM-4.6V-Flash", "google/gemma-3n-E2B-it",
                            "mistralai/Voxtral-Mini-3B-2507", "google/gemma-4-E2B-it", "google/gemma-4-12B-it",
                            "Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-0.8B",
                            "Qwen/Qwen3.5-2B", "Qwen/Qwen3.6-27B", "Qwen/Qwen3.6-27B-FP8",
                            "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"],
}
# Configs excluded for what they are, whatever the model (not a training config).
NON_TRAINING = {
    "examples/cloud/baseten.yaml": "cloud launcher settings, no model",
    "examples/cloud/modal.yaml": "cloud launcher settings, no model",
}
# Surogate: which example verbs a user runs (its docs): `surogate <verb> CONFIG`.
SUROGATE_VERB = {"pt": "pt", "sft": "sft", "distillation": "sft", "grpo": "grpo", "ruler": "grpo"}
SUROGATE_NON_TRAINING_NAMES = {"infer.yaml", "infer_2b.yaml", "judge.yaml", "teacher.yaml", "orch.yaml",
                               "orch_2b.yaml", "orch_2b_capped.yaml"}


def git_show(gitdir: Path, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={gitdir}", "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def git_ls(gitdir: Path, under: str) -> list[str]:
    out = subprocess.run(["git", f"--git-dir={gitdir}", "ls-tree", "-r", "--name-only", "HEAD", under], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def git_head(gitdir: Path) -> str:
    return subprocess.run(["git", f"--git-dir={gitdir}", "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def yaml_load(text: str):
    import yaml
    return yaml.safe_load(text)


def model_key(cfg: dict) -> str | None:
    m = cfg.get("base_model", cfg.get("model"))
    if isinstance(m, dict):
        m = m.get("name")
    return m if isinstance(m, str) else None


VISION_DATASETS = {"unsloth/LaTeX_OCR", "HuggingFaceH4/llava-instruct-mix-vsft", "Nanobit/text-vision-2k-test",
                   "NanoBit/text-audio-2k-test"}


def classify_model(mid: str | None, cfg: dict) -> tuple[bool, str]:
    if mid is None:
        return False, "no base model"
    if any(d in VISION_DATASETS for d in dataset_ids(cfg)):
        return False, "vision / multimodal (image or audio data set)"
    if mid in MODELS or mid in LOCAL_MODELS:
        spec = MODELS[LOCAL_MODELS.get(mid, mid)]
        if spec["arch"] == "qwen3vl":
            return True, "Qwen3-VL (text-only fine-tune of its language model)"
        return True, spec["arch"]
    for reason, ids in EXCLUDED_MODELS.items():
        if mid in ids:
            return False, reason
    return False, f"other family ({mid})"


def select_axolotl():
    chosen, excluded = [], []
    for p in git_ls(AXOLOTL_GIT, "examples"):
        if not p.endswith((".yml", ".yaml")):
            continue
        if p in NON_TRAINING:
            excluded.append((p, None, "not a training config: " + NON_TRAINING[p]))
            continue
        cfg = yaml_load(git_show(AXOLOTL_GIT, p))
        if not isinstance(cfg, dict):
            excluded.append((p, None, "not a mapping"))
            continue
        mid = model_key(cfg)
        ok, why = classify_model(mid, cfg)
        if ok:
            chosen.append((p, mid, why))
        else:
            excluded.append((p, mid, why))
    return chosen, excluded


def select_surogate():
    chosen, excluded = [], []
    for p in git_ls(SUROGATE_GIT, "examples"):
        if not p.endswith((".yml", ".yaml")):
            continue
        name = p.rsplit("/", 1)[-1]
        cfg = yaml_load(git_show(SUROGATE_GIT, p))
        mid = model_key(cfg) if isinstance(cfg, dict) else None
        if name in SUROGATE_NON_TRAINING_NAMES:
            excluded.append((p, mid, "not a training config (vLLM server / orchestrator / judge)"))
            continue
        ok, why = classify_model(mid, cfg)
        if ok:
            chosen.append((p, mid, why))
        else:
            excluded.append((p, mid, why))
    return chosen, excluded


# --------------------------------------------------------------------------------------------------------
# Hub cache stand-ins
# --------------------------------------------------------------------------------------------------------

def hub_repo_dir(cache: Path, kind: str, rid: str) -> Path:
    return cache / f"{kind}s--{rid.replace('/', '--')}"


def write_repo(cache: Path, kind: str, rid: str, files: dict[str, bytes | Path]):
    """Writes files into the cache as huggingface_hub lays them out: blobs/<sha256>, snapshots/<rev>/<name>
    (a relative symlink to the blob), refs/main holding <rev>."""
    root = hub_repo_dir(cache, kind, rid)
    if root.exists():
        shutil.rmtree(root)
    rev = hashlib.sha1(("standin:" + kind + ":" + rid).encode()).hexdigest()
    snap = root / "snapshots" / rev
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(rev)
    for name, data in files.items():
        if isinstance(data, Path):
            data = data.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        blob = root / "blobs" / digest
        if not blob.exists():
            blob.write_bytes(data)
        dst = snap / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, dst.parent), dst)
    return snap


# ---- tokenizers ----

_SP_CACHE: dict[str, bytes] = {}

LLAMA3_BOS_POST = {
    "type": "Sequence",
    "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                  "tokens": ["<|begin_of_text|>"]}}},
    ],
}

ZEPHYR_TEMPLATE = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content']"
                   " + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + "
                   "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
                   "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}"
                   "\n{% endfor %}")
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                   "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MISTRAL_INST_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


def sp_tokenizer_json(extra_specials: list[str], base_specials=("<unk>", "<s>", "</s>"), add_bos=True) -> bytes:
    """A Llama-2 / Mistral-v0.1 layout tokenizer.json (what `LlamaTokenizerFast` conversions ship): BPE with
    byte_fallback over <0x00>..<0xFF>, normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer,
    TemplateProcessing adding <s>. The merges are trained here on the stand-in corpus (vocab 2000)."""
    key = ",".join(extra_specials) + "|" + ",".join(base_specials) + str(add_bos)
    if key in _SP_CACHE:
        return _SP_CACHE[key]
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=list("▁"))
    tok.train_from_iterator(corpus_lines(4000), trainer)
    j = json.loads(tok.to_str())
    trained = j["model"]["vocab"]
    vocab = {t: i for i, t in enumerate(base_specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    for t, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    j["model"]["vocab"] = vocab
    j["model"]["byte_fallback"] = True
    j["model"]["fuse_unk"] = True
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    if not add_bos:
        j["post_processor"] = None
    added = []
    for i, s in enumerate(base_specials):
        added.append({"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    for s in extra_specials:
        vocab[s] = len(vocab)
        added.append({"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    j["added_tokens"] = added
    data = json.dumps(j, ensure_ascii=False).encode()
    _SP_CACHE[key] = data
    return data


def tokenizer_files(kind: str) -> tuple[dict[str, bytes], int]:
    """(files, the tokenizer's size). kinds: llama3-instruct, llama3-base, llama31-base, llama31-instruct,
    llama32-base, qwen3,
    qwen25-base, sp, sp-zephyr, sp-chatml, sp-mistral-inst."""
    if kind.startswith("llama3"):
        tj = json.loads((TOKENIZERS / "llama3" / "tokenizer.json").read_text())
        tj["post_processor"] = LLAMA3_BOS_POST  # the current Llama 3 / 3.1 / 3.2 repositories add BOS
        cfg = json.loads(LLAMA3_TOKCFG.read_text())
        if kind.startswith(("llama31", "llama32")):
            # Llama 3.1 renamed reserved specials: 128004 <|finetune_right_pad_id|>, 128008 <|eom_id|>,
            # 128010 <|python_tag|>, the rest renumbered (128011 is reserved_special_token_3).
            names = {128004: "<|finetune_right_pad_id|>", 128005: "<|reserved_special_token_2|>",
                     128008: "<|eom_id|>", 128010: "<|python_tag|>"}
            for t in tj["added_tokens"]:
                if t["id"] in names:
                    t["content"] = names[t["id"]]
                elif t["id"] >= 128011:
                    t["content"] = f"<|reserved_special_token_{t['id'] - 128008}|>"
        if kind in ("llama3-base", "llama31-base", "llama32-base"):
            cfg["eos_token"] = "<|end_of_text|>"
        if kind == "llama3-base":
            cfg.pop("chat_template", None)  # Meta-Llama-3-8B (base) has none; 3.1 / 3.2 base repos carry one
        files = {"tokenizer.json": json.dumps(tj, ensure_ascii=False).encode(),
                 "tokenizer_config.json": json.dumps(cfg, indent=2, ensure_ascii=False).encode(),
                 "special_tokens_map.json": json.dumps({"bos_token": cfg["bos_token"], "eos_token": cfg["eos_token"]}).encode()}
        return files, 128256
    if kind.startswith("qwen"):
        cfg = json.loads((TOKENIZERS / "qwen3" / "tokenizer_config.json").read_text())
        if kind == "qwen25-base":
            cfg["eos_token"] = "<|endoftext|>"
        files = {"tokenizer.json": (TOKENIZERS / "qwen3" / "tokenizer.json").read_bytes(),
                 "tokenizer_config.json": json.dumps(cfg, indent=2, ensure_ascii=False).encode()}
        return files, 151936
    if kind.startswith("sp"):
        if kind == "sp-yi":  # Yi: <|startoftext|> / <|endoftext|> at 1 / 2, chatml specials, no BOS added
            tj = sp_tokenizer_json(["<|im_start|>", "<|im_end|>", "<|im_sep|>"],
                                   ("<unk>", "<|startoftext|>", "<|endoftext|>"), add_bos=False)
        else:
            tj = sp_tokenizer_json([])
        n = len(json.loads(tj)["model"]["vocab"])
        cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
               "unk_token": "<unk>", "pad_token": None, "legacy": False, "clean_up_tokenization_spaces": False,
               "model_max_length": 1000000000000000019884624838656, "tokenizer_class": "LlamaTokenizer"}
        if kind == "sp-zephyr":
            cfg["chat_template"] = ZEPHYR_TEMPLATE
        elif kind == "sp-yi":
            cfg.update(add_bos_token=False, bos_token="<|startoftext|>", eos_token="<|im_end|>", pad_token="<unk>",
                       chat_template=CHATML_TEMPLATE)
        elif kind == "sp-mistral-inst":
            cfg["chat_template"] = MISTRAL_INST_TEMPLATE
        files = {"tokenizer.json": tj, "tokenizer_config.json": json.dumps(cfg, indent=2).encode(),
                 "special_tokens_map.json": json.dumps({"bos_token": cfg["bos_token"], "eos_token": cfg["eos_token"],
                                                        "unk_token": "<unk>"}).encode()}
        return files, n
    if kind.startswith("tekken-"):
        # mistral-common's own tekken.json (Mistral NeMo's vocabulary, format v3, the first layout without a
        # special_tokens list) under the real repository's format version; v7 and later list the special tokens
        import mistral_common
        from mistral_common.tokens.tokenizers.base import SpecialTokens
        raw = json.loads((Path(mistral_common.__file__).parent / "data" / "tekken_240911.json").read_text())
        version = kind.split("-", 1)[1]
        raw["config"]["version"] = version
        if version != "v3":
            raw["special_tokens"] = [{"rank": i, "token_str": t.value, "is_control": True}
                                     for i, t in enumerate(SpecialTokens)]
        return {"tekken.json": json.dumps(raw).encode()}, raw["config"]["default_vocab_size"]
    raise ValueError(kind)


# ---- models ----

# Tiny: the LM head (vocab x hidden) dominates a CPU step at these sizes, so hidden is 32 (head_dim 16, GQA 2:1).
DIMS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)


def hf_model_files(rid: str, spec: dict, need_pos: int, tmp: Path, width: int = 0) -> dict[str, bytes | Path]:
    import torch
    import transformers as T
    tok_files, tok_n = tokenizer_files(spec["tok"])
    vocab = max(spec.get("vocab", tok_n), tok_n)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[spec.get("dtype", "bfloat16")]
    max_pos = max(spec["real_max_pos"], 8192, need_pos)
    if "tekken.json" in tok_files:  # (mistral-common's control tokens: <s> 1, </s> 2)
        bos, eos = 1, 2
    else:
        tok_cfg = json.loads(tok_files["tokenizer_config.json"])
        tj = json.loads(tok_files["tokenizer.json"])
        ids = {t["content"]: t["id"] for t in tj["added_tokens"]}
        ids.update({k: v for k, v in tj["model"]["vocab"].items() if k in ("<s>", "</s>", "<unk>", "<|startoftext|>",
                                                                             "<|endoftext|>")})
        bos = ids.get(tok_cfg.get("bos_token")) if isinstance(tok_cfg.get("bos_token"), str) else None
        eos = ids.get(tok_cfg.get("eos_token")) if isinstance(tok_cfg.get("eos_token"), str) else None
    dims = dict(DIMS)
    if width > dims["hidden_size"]:  # a config's QAT group needs projections at least this wide (a multiple of it)
        dims.update(hidden_size=width, intermediate_size=2 * width)
    common = dict(dims, vocab_size=vocab, max_position_embeddings=max_pos, rms_norm_eps=1e-5,
                  tie_word_embeddings=bool(spec.get("tie", False)), bos_token_id=bos, eos_token_id=eos)
    rope = dict(spec.get("rope", {"rope_theta": 10000.0}))
    rope.setdefault("rope_type", "default")
    torch.manual_seed(int(hashlib.md5(rid.encode()).hexdigest()[:8], 16))
    arch = spec["arch"]
    if arch == "llama":
        cfg = T.LlamaConfig(**common, rope_parameters=rope, attention_bias=False, mlp_bias=False)
        model = T.LlamaForCausalLM(cfg)
    elif arch == "mistral":
        cfg = T.MistralConfig(**common, rope_parameters=rope, sliding_window=spec.get("sliding_window"),
                              head_dim=spec.get("head_dim", 16))
        model = T.MistralForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = T.Qwen2Config(**common, rope_parameters=rope, use_sliding_window=False, sliding_window=None)
        model = T.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = T.Qwen3Config(**common, rope_parameters=rope, head_dim=max(16, width // 2), use_sliding_window=False,
                            sliding_window=None)
        if spec.get("head") == "seqcls":
            cfg.num_labels = 1
            cfg.pad_token_id = ids.get("<|endoftext|>")
            model = T.Qwen3ForSequenceClassification(cfg)
        else:
            model = T.Qwen3ForCausalLM(cfg)
    elif arch == "qwen3vl":
        text = dict(common, head_dim=16, rope_parameters=dict(rope, mrope_section=[2, 3, 3], mrope_interleaved=True))
        text.pop("tie_word_embeddings")
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=16,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
        cfg = T.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True,
                              image_token_id=ids.get("<|image_pad|>"), video_token_id=ids.get("<|video_pad|>"),
                              vision_start_token_id=ids.get("<|vision_start|>"), vision_end_token_id=ids.get("<|vision_end|>"))
        model = T.Qwen3VLForConditionalGeneration(cfg)
    else:
        raise ValueError(arch)
    model = model.to(dtype)
    out = tmp / rid.replace("/", "--")
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    files: dict[str, bytes | Path] = {p.name: p for p in out.iterdir() if p.is_file()}
    quant = spec.get("quant")
    if quant:
        from safetensors.torch import load_file, save_file
        sd = load_file(str(out / "model.safetensors"))
        qsd, qcfg = quantize_state_dict(sd, quant)
        save_file(qsd, str(out / "model.safetensors"), metadata={"format": "pt"})
        c = json.loads((out / "config.json").read_text())
        c["quantization_config"] = qcfg
        if quant == "gptq":
            c["torch_dtype"] = "float16"
        (out / "config.json").write_text(json.dumps(c, indent=2))
        if quant == "gptq":
            files["quantize_config.json"] = json.dumps({k: v for k, v in qcfg.items() if k != "quant_method"}).encode()
        if quant == "nvfp4":
            files["hf_quant_config.json"] = json.dumps({"producer": {"name": "modelopt", "version": "0.29.0"},
                                                        "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                                         "exclude_modules": ["lm_head"]}}).encode()
        files["model.safetensors"] = out / "model.safetensors"
        files["config.json"] = out / "config.json"
    files.update(tok_files)
    return files


LINEAR = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$")


def quantize_state_dict(sd, quant):
    import torch
    out = {}
    if quant == "bnb-nf4":
        from bitsandbytes.functional import quantize_4bit
        for k, w in sd.items():
            if LINEAR.search(k) and "visual" not in k:
                q, st = quantize_4bit(w.to(torch.bfloat16).contiguous(), blocksize=64, quant_type="nf4",
                                      compress_statistics=True)
                out[k] = q
                for sk, sv in st.as_dict(packed=True).items():
                    out[k + "." + sk] = sv
            else:
                out[k] = w.to(torch.bfloat16)
        return out, {"quant_method": "bitsandbytes", "_load_in_4bit": True, "_load_in_8bit": False,
                     "load_in_4bit": True, "load_in_8bit": False, "bnb_4bit_quant_type": "nf4",
                     "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
                     "bnb_4bit_quant_storage": "uint8", "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0,
                     "llm_int8_has_fp16_weight": False, "llm_int8_enable_fp32_cpu_offload": False}
    if quant == "gptq":
        group = 128
        for k, w in sd.items():
            m = LINEAR.search(k)
            if not m:
                out[k] = w.to(torch.float16)
                continue
            base = k[: -len(".weight")]
            wt = w.float().t().contiguous()  # [in, out]
            n_in, n_out = wt.shape
            groups = (n_in + group - 1) // group
            scales = torch.zeros(groups, n_out)
            q = torch.zeros(n_in, n_out, dtype=torch.int32)
            for g in range(groups):
                blk = wt[g * group:(g + 1) * group]
                s = blk.abs().amax(0).clamp(min=1e-8) / 7.0
                scales[g] = s
                q[g * group:(g + 1) * group] = (torch.round(blk / s) + 8).clamp(0, 15).to(torch.int32)
            qweight = torch.zeros(n_in // 8, n_out, dtype=torch.int32)
            for j in range(8):
                qweight |= q[j::8] << (4 * j)
            zeros = torch.full((groups, n_out), 8 - 1, dtype=torch.int32)  # AutoGPTQ stores zero - 1
            qzeros = torch.zeros(groups, n_out // 8, dtype=torch.int32)
            for j in range(8):
                qzeros |= zeros[:, j::8] << (4 * j)
            out[base + ".qweight"] = qweight
            out[base + ".qzeros"] = qzeros
            out[base + ".scales"] = scales.to(torch.float16)
            out[base + ".g_idx"] = torch.arange(n_in, dtype=torch.int32) // group
        return out, {"bits": 4, "group_size": group, "damp_percent": 0.01, "desc_act": False, "sym": True,
                     "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model",
                     "quant_method": "gptq"}
    if quant == "fp8":
        for k, w in sd.items():
            if LINEAR.search(k):
                wf = w.float()
                o, i = wf.shape
                bo, bi = (o + 127) // 128, (i + 127) // 128
                scale = torch.zeros(bo, bi)
                q = torch.zeros_like(wf)
                for a in range(bo):
                    for b in range(bi):
                        blk = wf[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128]
                        s = blk.abs().max().clamp(min=1e-12) / 448.0
                        scale[a, b] = s
                        q[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128] = blk / s
                out[k] = q.to(torch.float8_e4m3fn)
                out[k[: -len(".weight")] + ".weight_scale_inv"] = scale
            else:
                out[k] = w.to(torch.bfloat16)
        return out, {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    if quant == "nvfp4":
        grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
        for k, w in sd.items():
            if LINEAR.search(k):
                wf = w.float()
                o, i = wf.shape
                gscale = wf.abs().max().clamp(min=1e-12) / (448.0 * 6.0)
                blocks = wf.view(o, i // 16, 16)
                bscale = (blocks.abs().amax(-1) / 6.0 / gscale).clamp(min=1e-6).to(torch.float8_e4m3fn)
                scaled = blocks / (bscale.float() * gscale).unsqueeze(-1)
                mag = (scaled.abs().unsqueeze(-1) - grid).abs().argmin(-1)
                code = (mag | ((scaled < 0).to(torch.long) << 3)).view(o, i).to(torch.uint8)
                packed = (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous()
                base = k[: -len(".weight")]
                out[k] = packed
                out[base + ".weight_scale"] = bscale
                out[base + ".weight_scale_2"] = gscale.reshape(())
                out[base + ".input_scale"] = torch.tensor(1.0)
            else:
                out[k] = w.to(torch.bfloat16)
        return out, {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
                     "kv_cache_quant_algo": None}
    raise ValueError(quant)


# ---- data sets ----

WORDS = ("the a model learns to answer short questions about rivers mountains cities numbers colors animals history "
         "science music art weather planets oceans forests languages recipes tools games stories letters words "
         "quickly slowly carefully brightly quietly every small large old new red blue green river hill stone tree "
         "bird fish horse river road bridge house garden market school library teacher student friend family "
         "morning evening winter summer spring autumn north south east west").split()


def sentence(rng: random.Random, lo=8, hi=30) -> str:
    n = rng.randint(lo, hi)
    s = " ".join(rng.choice(WORDS) for _ in range(n))
    return s[0].upper() + s[1:] + "."


def corpus_lines(n: int):
    rng = random.Random(1)
    for _ in range(n):
        yield sentence(rng, 5, 40)


N_ROWS = 64


def rows_for(kind: str, n: int = N_ROWS, seed: int = 0) -> list[dict]:
    rng = random.Random(hash(kind) % 1000 + seed)
    out = []
    for i in range(n):
        q, a, x = sentence(rng, 6, 20), sentence(rng, 10, 40), sentence(rng, 3, 12)
        if kind == "alpaca":
            out.append({"instruction": q, "input": x if i % 2 else "", "output": a})
        elif kind == "alpaca_text":  # tatsu-lab/alpaca, mhenrichsen/alpaca_2k_test
            inp = x if i % 2 else ""
            out.append({"instruction": q, "input": inp, "output": a,
                        "text": f"Below is an instruction that describes a task. ### Instruction:\n{q}\n\n### Response:\n{a}"})
        elif kind == "messages":  # fozziethebeat/alpaca_messages_2k_test
            out.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        elif kind == "dpo_conversation":  # fozziethebeat/alpaca_messages_2k_dpo_test, olivermolenschot/...
            out.append({"conversation": [{"role": "user", "content": q}],
                        "chosen": {"role": "assistant", "content": a},
                        "rejected": {"role": "assistant", "content": sentence(rng, 10, 40)}})
        elif kind == "finetome":  # mlabonne/FineTome-100k
            out.append({"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}],
                        "source": "infini-instruct-top-500k", "score": 5.0})
        elif kind == "jeopardy":
            out.append({"category": "HISTORY", "air_date": "2004-12-31", "question": q, "value": "$200",
                        "answer": x, "round": "Jeopardy!", "show_number": "4680"})
        elif kind == "guanaco":
            out.append({"text": f"### Human: {q}### Assistant: {a}"})
        elif kind == "text":
            out.append({"text": " ".join(sentence(rng, 10, 40) for _ in range(3))})
        elif kind == "chapter":
            out.append({"chapter": " ".join(sentence(rng, 10, 40) for _ in range(4))})
        elif kind == "c4":
            out.append({"text": " ".join(sentence(rng, 10, 40) for _ in range(3)), "timestamp": "2019-04-25T12:57:54Z",
                        "url": f"https://example.com/{i}"})
        elif kind == "fineweb":
            out.append({"text": " ".join(sentence(rng, 10, 40) for _ in range(3)), "id": f"<urn:uuid:{i}>",
                        "dump": "CC-MAIN-2024-10", "url": f"https://example.com/{i}", "file_path": "s3://x",
                        "language": "en", "language_score": 0.95, "token_count": 80, "score": 3.1, "int_score": 3})
        elif kind == "gsm8k":
            out.append({"question": q, "answer": a + f"\n#### {rng.randint(1, 99)}"})
        elif kind == "kto":  # argilla/ultrafeedback-binarized-preferences-cleaned-kto
            out.append({"prompt": q, "completion": a, "label": bool(i % 2), "source": "evol_instruct"})
        elif kind == "argilla_pref":  # argilla/ultrafeedback-binarized-preferences-cleaned
            r = sentence(rng, 10, 40)
            out.append({"source": "evol_instruct", "prompt": q,
                        "chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                        "chosen-rating": 5.0, "chosen-model": "gpt-4",
                        "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": r}],
                        "rejected-rating": 2.0, "rejected-model": "llama-2-7b-chat"})
        elif kind == "orca_pairs":  # argilla/distilabel-intel-orca-dpo-pairs
            out.append({"system": "" if i % 3 else "You are a helpful assistant.", "input": q, "chosen": a,
                        "rejected": sentence(rng, 10, 40), "status": "tie" if i % 7 == 0 else "unchanged",
                        "chosen_score": 8.0, "in_gsm8k_train": False})
        elif kind == "math_shepherd":
            steps = [sentence(rng, 5, 15) for _ in range(rng.randint(2, 4))]
            out.append({"prompt": q, "completions": steps, "labels": [bool((i + j) % 3) for j in range(len(steps))]})
        elif kind == "numina":
            out.append({"source": "olympiads", "problem": q, "solution": a,
                        "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        elif kind == "opencode":
            out.append({"id": f"{i:032x}", "input": q, "output": "```python\ndef f(x):\n    return x\n```\n" + a,
                        "domain": "generic", "generation_algorithm": "self-instruct", "llm_judgement": "{}",
                        "unit_tests": "[]", "tests_execution_status": "[]", "average_test_score": "1.0"})
        elif kind == "think":  # Nanobit/text-think-2k-test
            out.append({"messages": [
                {"role": "system", "content": [{"type": "text", "text": "You are a careful assistant."}]},
                {"role": "user", "content": [{"type": "text", "text": q}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": x}, {"type": "text", "text": a}]}]})
        elif kind == "shakespeare":
            out.append({"Text": " ".join(sentence(rng, 10, 40) for _ in range(3))})
        elif kind == "reverse":  # willcb/R1-reverse-wikipedia-paragraphs-v1-1000
            out.append({"prompt": [{"role": "system", "content": "Reverse the text character by character."},
                                   {"role": "user", "content": a}],
                        "completion": [{"role": "assistant", "content": "<think>\nok\n</think>\n" + a[::-1]}]})
        else:
            raise ValueError(kind)
    return out


def parquet_bytes(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, compression="snappy")
    return buf.getvalue()


def jsonl_bytes(rows):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def card(configs: list[tuple[str, dict[str, str]]]) -> bytes:
    """A dataset card whose YAML header lists configs and their data_files per split."""
    lines = ["---", "configs:"]
    for name, splits in configs:
        lines.append(f"- config_name: {name}")
        lines.append("  data_files:")
        for split, path in splits.items():
            lines.append(f"  - split: {split}")
            lines.append(f"    path: {path}")
    lines.append("---")
    lines.append("Stand-in data set written by bench/peer_sweep/sweep.py.")
    return ("\n".join(lines) + "\n").encode()


def dataset_files(rid: str) -> dict[str, bytes]:
    P = "data/train-00000-of-00001.parquet"
    simple = {
        "mhenrichsen/alpaca_2k_test": "alpaca_text", "tatsu-lab/alpaca": "alpaca_text",
        "teknium/GPT4-LLM-Cleaned": "alpaca", "aaditya/alpaca_subset_1": "alpaca",
        "fozziethebeat/alpaca_messages_2k_test": "messages",
        "fozziethebeat/alpaca_messages_2k_dpo_test": "dpo_conversation",
        "olivermolenschot/alpaca_messages_dpo_test": "dpo_conversation",
        "mlabonne/FineTome-100k": "finetome", "openaccess-ai-collective/jeopardy": "jeopardy",
        "princeton-nlp/TextbookChapters": "chapter",
        "argilla/ultrafeedback-binarized-preferences-cleaned-kto": "kto",
        "argilla/ultrafeedback-binarized-preferences-cleaned": "argilla_pref",
        "argilla/distilabel-intel-orca-dpo-pairs": "orca_pairs", "trl-lib/math_shepherd": "math_shepherd",
        "AI-MO/NuminaMath-CoT": "numina", "nvidia/OpenCodeInstruct": "opencode", "sjelassi/swallow_code_20m": "text",
        "Nanobit/text-think-2k-test": "think", "OpenLLM-Ro/ro_gsm8k": "gsm8k",
        "willcb/R1-reverse-wikipedia-paragraphs-v1-1000": "reverse",
    }
    if rid in simple:
        return {P: parquet_bytes(rows_for(simple[rid]))}
    if rid == "yahma/alpaca-cleaned":  # the real repository: one JSON array file
        return {"alpaca_data_cleaned.json": json.dumps(rows_for("alpaca"), indent=2).encode()}
    if rid == "timdettmers/openassistant-guanaco":
        return {"openassistant_best_replies_train.jsonl": jsonl_bytes(rows_for("guanaco")),
                "openassistant_best_replies_eval.jsonl": jsonl_bytes(rows_for("guanaco", 16, 1))}
    if rid == "togethercomputer/Long-Data-Collections":
        import zstandard
        return {"pretrain/rp_sub.jsonl.zst": zstandard.ZstdCompressor().compress(jsonl_bytes(rows_for("text"))),
                "fine-tune/booksum.jsonl.zst": zstandard.ZstdCompressor().compress(jsonl_bytes(rows_for("text", 8, 2)))}
    if rid == "allenai/c4":
        def gz(rows):
            return gzip.compress(jsonl_bytes(rows), mtime=0)
        return {"en/c4-train.00000-of-01024.json.gz": gz(rows_for("c4")),
                "en/c4-validation.00000-of-00008.json.gz": gz(rows_for("c4", 16, 1)),
                "realnewslike/c4-train.00000-of-00512.json.gz": gz(rows_for("c4", 16, 2)),
                "README.md": card([("en", {"train": "en/c4-train.*.json.gz", "validation": "en/c4-validation.*.json.gz"}),
                                   ("realnewslike", {"train": "realnewslike/c4-train.*.json.gz"})])}
    if rid == "wikitext":  # Salesforce/wikitext, named by its old canonical id
        t = parquet_bytes(rows_for("text"))
        return {"wikitext-103-raw-v1/train-00000-of-00002.parquet": t,
                "wikitext-103-raw-v1/validation-00000-of-00001.parquet": parquet_bytes(rows_for("text", 16, 1)),
                "wikitext-2-raw-v1/train-00000-of-00001.parquet": parquet_bytes(rows_for("text", 16, 2)),
                "README.md": card([("wikitext-103-raw-v1", {"train": "wikitext-103-raw-v1/train-*",
                                                            "validation": "wikitext-103-raw-v1/validation-*"}),
                                   ("wikitext-2-raw-v1", {"train": "wikitext-2-raw-v1/train-*"})])}
    if rid == "openai/gsm8k":
        return {"main/train-00000-of-00001.parquet": parquet_bytes(rows_for("gsm8k")),
                "main/test-00000-of-00001.parquet": parquet_bytes(rows_for("gsm8k", 16, 1)),
                "socratic/train-00000-of-00001.parquet": parquet_bytes(rows_for("gsm8k", 16, 2)),
                "README.md": card([("main", {"train": "main/train-*", "test": "main/test-*"}),
                                   ("socratic", {"train": "socratic/train-*"})])}
    if rid == "HuggingFaceFW/fineweb-edu":
        return {"sample/10BT/000_00000.parquet": parquet_bytes(rows_for("fineweb")),
                "data/CC-MAIN-2024-10/train-00000-of-00001.parquet": parquet_bytes(rows_for("fineweb", 16, 1)),
                "README.md": card([("default", {"train": "data/*/*"}), ("sample-10BT", {"train": "sample/10BT/*"})])}
    if rid == "Trelis/tiny-shakespeare":
        return {"data/train-00000-of-00001.parquet": parquet_bytes(rows_for("shakespeare")),
                "data/test-00000-of-00001.parquet": parquet_bytes(rows_for("shakespeare", 16, 1))}
    raise KeyError(rid)


def dataset_ids(cfg: dict) -> list[str]:
    out = []
    for key in ("datasets", "test_datasets", "pretraining_dataset"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = [v]
        for d in v or []:
            p = d.get("path") if isinstance(d, dict) else d
            if isinstance(p, str):
                out.append(p)
    return out


def build_cache(work: Path, configs: list[tuple[str, Path, dict]], rebuild: bool) -> tuple[Path, list[str]]:
    """Builds work/hub with every model and data set the configs name (models sized for the largest
    sequence_len asked of each). Returns the cache and notes about it."""
    cache = work / "hub"
    stamp = cache / ".standin-version"
    need_pos: dict[str, int] = {}
    need_width: dict[str, int] = {}
    dsets: set[str] = set()
    for _, _, cfg in configs:
        mid = model_key(cfg)
        mid = LOCAL_MODELS.get(mid, mid)
        seq = cfg.get("sequence_len") or 0
        if isinstance(seq, int):
            need_pos[mid] = max(need_pos.get(mid, 0), seq)
        qat = cfg.get("qat")
        if isinstance(qat, dict) and isinstance(qat.get("group_size"), int):
            need_width[mid] = max(need_width.get(mid, 0), qat["group_size"])
        for d in dataset_ids(cfg):
            if not d.startswith(("/", ".")) and d not in ("<your-hf-dataset-id>",):
                dsets.add(d)
    want = json.dumps({"v": CACHE_VERSION, "models": sorted(need_pos.items()), "datasets": sorted(dsets)} |
                      ({"widths": sorted(need_width.items())} if need_width else {}))
    notes = []
    if not rebuild and stamp.exists() and stamp.read_text() == want:
        return cache, notes
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    tmp = work / "tmp-models"
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for mid, pos in sorted(need_pos.items()):
        print(f"  model {mid}", file=sys.stderr, flush=True)
        write_repo(cache, "model", mid, hf_model_files(mid, MODELS[mid], pos, tmp, need_width.get(mid, 0)))
    for d in sorted(dsets):
        try:
            files = dataset_files(d)
        except KeyError:
            notes.append(f"no stand-in for data set {d}")
            continue
        write_repo(cache, "dataset", d, files)
    shutil.rmtree(tmp, ignore_errors=True)
    stamp.write_text(want)
    print(f"  stand-in cache built in {time.time() - t0:.0f} s", file=sys.stderr)
    return cache, notes


def checkout(gitdir: Path, dest: Path, paths: list[str]):
    """The peer's tree at HEAD (only `paths`), as a user's checkout has it."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    data = subprocess.run(["git", f"--git-dir={gitdir}", "archive", "--format=tar", "HEAD", *paths], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="data")


# --------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------

def edit_config(text: str, output_dir: str, max_steps: int) -> str:
    """Replaces the top-level output_dir / save_path / max_steps lines (dropping the originals) and appends
    ours; nothing else changes."""
    keep = []
    for line in text.splitlines():
        if re.match(r"^(output_dir|save_path|max_steps)\s*:", line):
            continue
        keep.append(line)
    return "\n".join(keep) + f"\n\n# peer_sweep\noutput_dir: {output_dir}\nmax_steps: {max_steps}\n"


def classify(rc: int | None, out: str, err: str, outdir: Path) -> tuple[str, str, str]:
    """(outcome, the line, how it failed). RUNS: exit 0 and a .safetensors in output_dir. REFUSED-ONE-LINE:
    exit 2 and stderr exactly one line "error: ...". FAILED: anything else; how: late-error (exit 2, stderr's
    last line an error: line after progress lines), crash (another exit status), timeout, no-output."""
    err_lines = [l for l in err.splitlines() if l.strip()]
    if rc == 0:
        written = [p for p in outdir.rglob("*") if p.is_file()] if outdir.exists() else []
        if any(p.suffix == ".safetensors" for p in written):
            return "RUNS", "", ""
        return "FAILED", "exit 0 but no .safetensors written in output_dir", "no-output"
    if rc is None:
        last = err_lines[-1] if err_lines else ""
        return "FAILED", f"timeout; last stderr line: {last}", "timeout"
    if rc == 2 and len(err_lines) == 1 and err_lines[0].startswith("error:"):
        return "REFUSED-ONE-LINE", err_lines[0], ""
    errs = [l for l in err_lines if l.startswith("error")]
    if rc == 2 and err_lines and err_lines[-1].startswith("error:"):
        return "FAILED", err_lines[-1], "late-error"
    first = errs[0] if errs else (err_lines[-1] if err_lines else (out.strip().splitlines() or [""])[-1])
    return "FAILED", f"exit {rc}: {first}", "crash"


def cpu_overrides(peer: str, cfg: dict, cap: int) -> list[str]:
    """`--set` overrides that bring the token positions of one optimizer step (micro-batch x sequence_len x
    gradient accumulation, x2 for chosen/rejected pairs) under `cap`, for CPU time only: gradient accumulation
    first, then the micro-batch. Every one is recorded as a change in the results. cap 0: none."""
    if not cap:
        return []
    mb_key = "micro_batch_size" if peer == "axolotl" else "per_device_train_batch_size"
    def num(v, d):
        return v if isinstance(v, int) and v > 0 else d
    mbs = num(cfg.get(mb_key), 1)
    ga = num(cfg.get("gradient_accumulation_steps"), 1)
    seq = num(cfg.get("sequence_len"), 2048)
    pairs = 2 if (cfg.get("rl") in ("dpo", "ipo", "orpo", "simpo") or cfg.get("reward_model")) else 1
    out = []
    if mbs * seq * pairs > cap:
        new_mbs = max(1, cap // (seq * pairs))
        if new_mbs < mbs:
            out.append(f"{mb_key}={new_mbs}")
            mbs = new_mbs
    if mbs * seq * pairs * ga > cap:
        new_ga = max(1, cap // (mbs * seq * pairs))
        if new_ga < ga:
            out.append(f"gradient_accumulation_steps={new_ga}")
    return out


def account_overrides(cfg: dict) -> list[str]:
    """`--set` overrides for trackers that need an account this machine has not: SwanLab's cloud mode (what its
    plugin does without swanlab_mode) runs offline, as WANDB_MODE=offline does wandb's. Recorded as changes."""
    plugins = cfg.get("plugins") or []
    swanlab = any("SwanLabPlugin" in str(p) for p in plugins) and cfg.get("use_swanlab") is not False
    if swanlab and cfg.get("swanlab_mode") in (None, "cloud"):
        return ["swanlab_mode=offline"]
    return []


def run_one(binary: str, verb: str, cwd: Path, rel_cfg: str, sets: list[str], env: dict, timeout: int):
    t0 = time.time()
    cmd = [binary, verb, rel_cfg] + [a for kv in sets for a in ("--set", kv)]
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                           errors="replace")
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    return rc, out, err, time.time() - t0


def sweep_peer(peer: str, args, env_base: dict) -> dict:
    gitdir = AXOLOTL_GIT if peer == "axolotl" else SUROGATE_GIT
    chosen, excluded = select_axolotl() if peer == "axolotl" else select_surogate()
    work = Path(args.work)
    tree = work / f"{peer}-checkout"
    checkout(gitdir, tree, ["examples", "deepspeed_configs"] if peer == "axolotl" else ["examples"])
    configs = []
    for path, mid, why in chosen:
        text = git_show(gitdir, path)
        configs.append((path, tree / path, yaml_load(text)))
    return dict(peer=peer, head=git_head(gitdir), chosen=chosen, excluded=excluded, configs=configs, tree=tree)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", choices=["axolotl", "surogate", "both"], default="both")
    ap.add_argument("--only", help="regex on the example path")
    ap.add_argument("--bin", default="/tmp/sweep-bin/soltrain")
    ap.add_argument("--work", default="/tmp/peer_sweep")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--cpu-cap", type=int, default=32768,
                    help="token positions per optimizer step above which gradient accumulation (then the micro-batch) "
                         "is lowered with --set, recorded as a change (0: run every config unchanged)")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    peers = ["axolotl", "surogate"] if args.peer == "both" else [args.peer]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    full_plans = {p: sweep_peer(p, argparse.Namespace(only=None, work=args.work), env) for p in ("axolotl", "surogate")}
    plans = {}
    for p in peers:
        plan = dict(full_plans[p])
        if args.only:
            plan["configs"] = [c for c in plan["configs"] if re.search(args.only, c[0])]
        plans[p] = plan
    if args.list:
        for p, plan in plans.items():
            print(f"== {p} @ {plan['head'][:10]}: {len(plan['chosen'])} selected, {len(plan['excluded'])} excluded")
            for c in plan["chosen"]:
                print("  +", c[0], c[1], c[2])
            for e in plan["excluded"]:
                print("  -", e[0], e[1], e[2])
        return
    # The stand-in cache covers every selected config of both peers, so a partial run reuses it.
    full = [c for plan in full_plans.values() for c in plan["configs"]]
    print("building the stand-in hub cache ...", file=sys.stderr)
    cache, cache_notes = build_cache(work, full, args.rebuild)
    env.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(work / "hf-home"))
    # a config naming a wandb_project reports to wandb: offline here, as a logged-in user's run would start
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_DIR", str(work / "wandb"))
    version = subprocess.run([args.bin, "--version"], capture_output=True, text=True).stdout.strip()
    results = {}
    for peer, plan in plans.items():
        tree = plan["tree"]
        # Surogate's pt example trains the local folder ./Qwen3-0.6B (its docs download it there first).
        if peer == "surogate":
            for local, rid in LOCAL_MODELS.items():
                src = hub_repo_dir(cache, "model", rid) / "snapshots"
                snap = next(src.iterdir())
                dst = tree / local
                shutil.copytree(snap, dst, symlinks=False)
        rows = []
        for path, cfg_file, cfg in plan["configs"]:
            outdir = work / "out" / peer / path.replace("/", "__")
            if outdir.exists():
                shutil.rmtree(outdir)
            text = git_show(AXOLOTL_GIT if peer == "axolotl" else SUROGATE_GIT, path)
            cfg_file.write_text(edit_config(text, str(outdir), args.max_steps))
            if peer == "axolotl":
                verb = "train"
            else:
                verb = SUROGATE_VERB.get(path.split("/")[1], "sft")
            sets = cpu_overrides(peer, cfg, args.cpu_cap) + account_overrides(cfg)
            rc, out, err, dt = run_one(args.bin, verb, tree, path, sets, env, args.timeout)
            outcome, line, how = classify(rc, out, err, outdir)
            logdir = work / "logs" / peer
            logdir.mkdir(parents=True, exist_ok=True)
            (logdir / (path.replace("/", "__") + ".log")).write_text(
                f"$ soltrain {verb} {path} {' '.join('--set ' + kv for kv in sets)}\n# rc={rc} {dt:.1f}s\n--- stdout\n{out}\n--- stderr\n{err}")
            seq = cfg.get("sequence_len")
            mid = model_key(cfg)
            spec = MODELS.get(LOCAL_MODELS.get(mid, mid), {})
            rows.append(dict(config=path, model=mid, verb=verb, sets=sets, outcome=outcome, how=how, line=line, rc=rc,
                             seconds=round(dt, 1),
                             seq_over_real_max_pos=bool(isinstance(seq, int) and spec and seq > spec["real_max_pos"])))
            print(f"[{peer}] {outcome:17s} {dt:6.1f}s {path} {' '.join(sets)}  {line[:160]}", file=sys.stderr, flush=True)
        results[peer] = dict(head=plan["head"], rows=rows, excluded=plan["excluded"], soltrain=version,
                             cache_notes=cache_notes)
    if not args.no_write:
        write_reports(results, args)


def summarize(rows):
    n = {"RUNS": 0, "REFUSED-ONE-LINE": 0, "FAILED": 0}
    for r in rows:
        n[r["outcome"]] += 1
    return n


def causes(row) -> list[str]:
    """The problems a line names, config path, line numbers and temp paths taken out (an "N problems: a; b"
    line gives one cause per problem)."""
    line = re.sub(r"^exit \d+: ", "", row["line"])
    line = re.sub(r"^error: ", "", line)
    cfg = re.escape(row["config"])
    m = re.match(rf"^{cfg}: \d+ problems: (.*)$", line)
    parts = re.split(rf"; (?={cfg}(:\d+)?: )", m.group(1)) if m else [line]
    parts = [x for x in parts if x and not re.fullmatch(r":\d+", x)]
    out = []
    for p in parts:
        p = re.sub(rf"^{cfg}(:\d+)?: ", "", p)
        p = re.sub(r"/tmp/peer_sweep/\S*?(snapshots/[0-9a-f]+/|prepared/|out/\S+?/)", "<...>/", p)
        p = re.sub(r"last_run_prepared/tokenizer-[0-9a-f]+", "last_run_prepared/tokenizer-<hash>", p)
        out.append(p)
    return out


def write_reports(results, args):
    old = json.loads((HERE / "results.json").read_text()) if (HERE / "results.json").exists() else {}
    if args.only:
        # A partial run (--only) replaces its configs' rows in the last full results and keeps the rest.
        for peer, res in results.items():
            if peer in old:
                mine = {r["config"]: r for r in res["rows"]}
                rows = [mine.pop(r["config"], r) for r in old[peer]["rows"]] + list(mine.values())
                res["rows"] = sorted(rows, key=lambda r: r["config"])
    ran = set(results)
    results = {**old, **results}  # (a one-peer run keeps the other peer's last results)
    (HERE / "results.json").write_text(json.dumps(results, indent=1))
    for peer, res in results.items():
        if peer not in ran:  # (its report stays as its own run wrote it)
            continue
        rows = res["rows"]
        n = summarize(rows)
        src = "axolotl-ai-cloud/axolotl" if peer == "axolotl" else "invergent-ai/surogate"
        L = [f"# {peer.capitalize()} examples through soltrain ({src} @ {res['head'][:10]})", "",
             f"soltrain: `{res['soltrain']}` (CPU build), `soltrain {'train' if peer == 'axolotl' else '<verb>'} CONFIG` "
             f"from the peer's checkout, tiny random stand-ins in a local hub cache (HF_HUB_OFFLINE=1); each config "
             f"changed only in output_dir and max_steps ({args.max_steps}), unless listed under \"Changed\". Written by "
             f"`bench/peer_sweep/sweep.py`{' (last partial run: --only ' + repr(args.only) + ')' if args.only else ''}.", "",
             f"**{len(rows)} configs: RUNS {n['RUNS']}, REFUSED-ONE-LINE {n['REFUSED-ONE-LINE']}, FAILED {n['FAILED']}**", ""]
        for outcome in ("FAILED", "REFUSED-ONE-LINE"):
            groups: dict[str, list[str]] = {}
            for r in rows:
                if r["outcome"] == outcome:
                    for c in causes(r):
                        key = (f"[{r['how']}] " if r["how"] else "") + c
                        groups.setdefault(key, []).append(r["config"])
            if groups:
                L += [f"## {outcome} by cause" + (" (a config refused for several problems is listed under each)"
                                                    if outcome == "REFUSED-ONE-LINE" else ""), ""]
                for cause, cfgs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                    L.append(f"- ({len(cfgs)}) `{cause}`")
                    for c in cfgs:
                        L.append(f"  - {c}")
                L.append("")
        changed = [r for r in rows if r["sets"]]
        if changed:
            L += ["## Changed beyond output_dir / max_steps (CPU time: more token positions per optimizer step than "
                  "`--cpu-cap`, default 32768; `--cpu-cap 0` runs them unchanged)", ""]
            for r in changed:
                L.append(f"- {r['config']}: `{' '.join('--set ' + kv for kv in r['sets'])}` -> {r['outcome']}")
            L.append("")
        L += ["## Every config", "", "| config | verb | changed | outcome | s | line |",
              "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            flag = " (sequence_len > the real model's max_position_embeddings)" if r["seq_over_real_max_pos"] else ""
            line = r["line"].replace("|", "\\|")
            how = f" ({r['how']})" if r["how"] else ""
            ch = " ".join(r["sets"])
            L.append(f"| {r['config']} | {r['verb']} | {ch} | {r['outcome']}{how} | {r['seconds']} | {line}{flag} |")
        L += ["", "## Excluded examples", "", "| config | base model | why |", "| --- | --- | --- |"]
        for p, mid, why in res["excluded"]:
            L.append(f"| {p} | {mid} | {why} |")
        if res["cache_notes"]:
            L += ["", "Cache notes: " + "; ".join(res["cache_notes"])]
        (HERE / f"results-{peer}.md").write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
