"""LLaMA-Factory configs: its own example YAMLs (examples/train_lora and train_full, Qwen3 and Llama 3, with the demo
datasets of its data/ folder and dataset_info.json; tests/fixtures/llama_factory) read by soltrain and rendered as
LLaMA-Factory renders them. The reference is LLaMA-Factory itself (llamafactory 0.9.5 from PyPI, its data code run live
on CPU): its converter, template and SupervisedDatasetProcessor / PairwiseDatasetProcessor / PretrainDatasetProcessor
over the same rows and the real Qwen3 and Llama 3 tokenizers give the tokens and labels `soltrain tokenize` must write,
token for token. Each example then trains two steps on the demo model (`soltrain train example.yaml`, run from the
fixture folder as LLaMA-Factory runs from its repository)."""
import importlib.machinery
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

from conftest import BIN, ROOT, prepared_documents

FIXTURE = ROOT / "tests" / "fixtures" / "llama_factory"
TOKENIZERS = ROOT / "build" / "tokenizers"


def import_llamafactory():
    """llamafactory's data code without its multimodal and version checks: torchaudio (imported at the top of
    mm_plugin.py, never used by text datasets) stubbed, its transformers pin not enforced."""
    os.environ["DISABLE_VERSION_CHECK"] = "1"
    if "torchaudio" not in sys.modules:
        stub = types.ModuleType("torchaudio")
        stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = stub
    return pytest.importorskip("llamafactory")


@pytest.fixture(scope="module")
def lf():
    import_llamafactory()
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import get_dataset_list
    from llamafactory.data.processor import (PairwiseDatasetProcessor, PretrainDatasetProcessor,
                                             SupervisedDatasetProcessor)
    from llamafactory.hparams import DataArguments
    from llamafactory.data.processor import FeedbackDatasetProcessor
    return types.SimpleNamespace(template=get_template_and_fix_tokenizer, converter=get_dataset_converter,
                                 datasets=get_dataset_list, DataArguments=DataArguments,
                                 processors={"sft": SupervisedDatasetProcessor, "dpo": PairwiseDatasetProcessor,
                                             "pt": PretrainDatasetProcessor, "kto": FeedbackDatasetProcessor})


def tokenizer_folder(name):
    folder = TOKENIZERS / name
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"the {name} tokenizer is not in the build tree")
    return folder


def reference(lf, stage, dataset_names, template, tokenizer, cutoff_len=2048, max_samples=None, packing=None):
    """LLaMA-Factory's processed rows: the datasets read as its loader reads them (json / jsonl files, the first
    max_samples rows), converted, then its stage's processor. pt packs (parser.py: packing defaults to stage == pt)."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer))
    args = lf.DataArguments(template=template, cutoff_len=cutoff_len, dataset_dir=str(FIXTURE / "data"),
                            max_samples=max_samples)
    args.packing = (stage == "pt") if packing is None else packing
    tmpl = lf.template(tok, args)
    batch = {k: [] for k in ("_prompt", "_response", "_system", "_tools", "_images", "_videos", "_audios")}
    for attr in lf.datasets(dataset_names, str(FIXTURE / "data")):
        path = FIXTURE / "data" / attr.dataset_name
        text = path.read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
            else json.loads(text)
        converter = lf.converter(attr.formatting, attr, args)
        for row in rows[:max_samples]:
            out = converter(row)
            for k in batch:
                batch[k].append(out[k])
    processor = lf.processors[stage](template=tmpl, tokenizer=tok, processor=None, data_args=args)
    return processor.preprocess_dataset(batch)


def documents(folder):
    """A prepared dataset's documents as (ids, labels), -100 where not trained."""
    return [(ids, [t if m else -100 for t, m in zip(ids, mask)]) for ids, mask in prepared_documents(folder)]


def tokenize(example, tmp_path, tokenizer, *sets):
    """`soltrain tokenize` of an example config (from the fixture folder, as LLaMA-Factory runs from its
    repository), the model replaced by a folder holding the tokenizer; the prepared datasets' folders in order."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (model / f).write_bytes((tokenizer / f).read_bytes())
    out = tmp_path / "out"
    r = subprocess.run([str(BIN), "tokenize", str(FIXTURE / "examples" / example), "--set", f"model={model}",
                        "--set", f"output_dir={out}", "--quiet", *[a for s in sets for a in ("--set", s)]],
                       cwd=FIXTURE, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return sorted(p for p in (out / "prepared").iterdir() if p.is_dir() and not p.name.startswith("tokenizer-"))


@pytest.mark.parametrize("example,tokenizer,template", [
    ("train_lora/qwen3_lora_sft.yaml", "qwen3", "qwen3_nothink"),
    ("train_lora/llama3_lora_sft.yaml", "llama3", "llama3"),
])
def test_sft_rows_equal_llama_factorys(lf, tmp_path, example, tokenizer, template):
    """identity + alpaca_en_demo (alpaca format, max_samples 1000) as SupervisedDatasetProcessor makes them: the
    template's turns, each element tokenized alone, the response with what follows it (Qwen's "<|im_end|>\\n")
    trained."""
    tok = tokenizer_folder(tokenizer)
    ours = [d for folder in tokenize(example, tmp_path, tok) for d in documents(folder)]
    ref = reference(lf, "sft", ["identity", "alpaca_en_demo"], template, tok, max_samples=1000)
    assert len(ours) == len(ref["input_ids"]) > 0
    for i, (ids, labels) in enumerate(ours):
        assert ids == ref["input_ids"][i], i
        assert labels == ref["labels"][i], i


def test_cutoff_and_reasoning_template_equal_llama_factorys(lf, tmp_path):
    """cutoff_len 48 cuts the turns as infer_seqlen does (source and target shares); the qwen3 (reasoning) template
    puts a trained empty thought before each answer that has none."""
    tok = tokenizer_folder("qwen3")
    ours = [d for folder in tokenize("train_lora/qwen3_lora_sft.yaml", tmp_path, tok, "cutoff_len=48",
                                     "template=qwen3") for d in documents(folder)]
    ref = reference(lf, "sft", ["identity", "alpaca_en_demo"], "qwen3", tok, cutoff_len=48, max_samples=1000)
    assert [d[0] for d in ours] == ref["input_ids"]
    assert [d[1] for d in ours] == ref["labels"]
    assert max(len(d[0]) for d in ours) == 48


def test_dpo_pairs_equal_llama_factorys(lf, tmp_path):
    """dpo_en_demo (sharegpt, ranking) as PairwiseDatasetProcessor makes it: prompt + chosen, prompt + rejected,
    the answers trained; cut together at cutoff_len (here 300: some pairs are cut)."""
    tok = tokenizer_folder("qwen3")
    [folder] = tokenize("train_lora/qwen3_lora_dpo.yaml", tmp_path, tok, "cutoff_len=300")
    ours = documents(folder)
    ref = reference(lf, "dpo", ["dpo_en_demo"], "qwen3_nothink", tok, cutoff_len=300, max_samples=1000)
    assert len(ours) == 2 * len(ref["chosen_input_ids"]) > 0
    for i in range(len(ref["chosen_input_ids"])):
        assert ours[2 * i] == (ref["chosen_input_ids"][i], ref["chosen_labels"][i]), i
        assert ours[2 * i + 1] == (ref["rejected_input_ids"][i], ref["rejected_labels"][i]), i


def test_kto_examples_equal_llama_factorys(lf, tmp_path):
    """kto_en_demo (sharegpt messages with a boolean label) as FeedbackDatasetProcessor makes it: prompt + answer, the
    answer trained, the tag kept; the KL documents pair each prompt with the previous example's answer, as
    LLaMA-Factory's do when one block holds the dataset (per_device_train_batch_size 6: its 6 rows)."""
    tok = tokenizer_folder("qwen3")
    [folder] = tokenize("train_lora/qwen3_lora_kto.yaml", tmp_path, tok, "per_device_train_batch_size=6")
    docs = documents(folder)
    ref = reference(lf, "kto", ["kto_en_demo"], "qwen3_nothink", tok, max_samples=1000)
    assert len(docs) == 2 * len(ref["input_ids"]) == 12
    for i in range(len(ref["input_ids"])):
        (ids, labels), (kl_ids, kl_labels) = docs[2 * i], docs[2 * i + 1]
        undesirable = labels[0] != -100  # (the mark on an undesirable example's first, untrained, token)
        assert undesirable == (not ref["kto_tags"][i]), i
        assert ids == ref["input_ids"][i] and [-100] + labels[1:] == ref["labels"][i], i
        assert kl_ids == ref["kl_input_ids"][i] and kl_labels == ref["kl_labels"][i], i


def test_pretraining_text_equals_llama_factorys(lf, tmp_path):
    """c4_demo (stage pt): each text and the eos token, packed (LLaMA-Factory's default for pt) into cutoff_len
    blocks: the same token stream as PretrainDatasetProcessor's blocks."""
    tok = tokenizer_folder("qwen3")
    [folder] = tokenize("train_lora/qwen3_lora_pretrain.yaml", tmp_path, tok, "cutoff_len=256")
    stream = [t for ids, _ in documents(folder) for t in ids]
    ref = reference(lf, "pt", ["c4_demo"], None, tok, cutoff_len=256, max_samples=1000)
    blocks = [t for block in ref["input_ids"] for t in block]
    assert len(blocks) > 0 and stream[:len(blocks)] == blocks


def llama3_standin(demo, folder):
    """The demo model with Llama 3's special tokens in its tokenizer (in the embedding's spare rows, as the real
    tokenizer has them), its bos <|begin_of_text|>: what the llama3 examples' template and eos need."""
    import shutil
    shutil.copytree(demo / "model", folder)
    tok = json.loads((folder / "tokenizer.json").read_text())
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|eom_id|>"]
    next_id = max(a["id"] for a in tok["added_tokens"]) + 1
    for i, content in enumerate(specials):
        tok["added_tokens"].append({"id": next_id + i, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.update(bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("example", [
    "train_lora/qwen3_lora_sft.yaml", "train_lora/qwen3_lora_dpo.yaml", "train_lora/qwen3_lora_pretrain.yaml",
    "train_lora/qwen3_lora_reward.yaml", "train_lora/qwen3_lora_kto.yaml", "train_full/qwen3_full_sft.yaml", "train_lora/llama3_lora_sft.yaml",
    "train_lora/llama3_lora_dpo.yaml", "train_lora/llama3_lora_pretrain.yaml", "train_full/llama3_full_sft.yaml"])
def test_examples_train(demo, tmp_path, example):
    """Each example runs unchanged but for the model (the demo's; for Llama 3's, with its special tokens),
    output_dir, max_steps and cutoff_len (the demo model's context): two steps, a saved model or adapter."""
    out = tmp_path / "out"
    model = llama3_standin(demo, tmp_path / "llama") if "llama3" in example else demo / "model"
    r = subprocess.run([str(BIN), "train", str(FIXTURE / "examples" / example), "--set", f"model={model}",
                        "--set", f"output_dir={out}", "--set", "max_steps=2", "--set", "cutoff_len=128"],
                       cwd=FIXTURE, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "a LLaMA-Factory config" in r.stdout + r.stderr
    saved = {p.name for p in out.rglob("*.safetensors")}
    assert saved & {"model.safetensors", "adapter_model.safetensors"}, sorted(saved)


def test_what_is_not_built_is_one_line(demo, tmp_path):
    """stage: ppo, a template soltrain does not render, a dataset name missing from dataset_info.json, pref_ftx,
    bf16: false, quantization_method hqq: one line each, exit code 2."""
    for sets, expected in [(("stage=ppo",), "stage: ppo is not built"),
                           (("template=glm4",), "template: glm4 is not one soltrain renders"),
                           (("dataset=nope",), "nope is not in data/dataset_info.json"),
                           (("pref_ftx=0.5",), "pref_ftx (an SFT term in LLaMA-Factory's DPO loss) is not built"),
                           # keys soltrain reads itself keep its rules (not dropped as LLaMA-Factory-only)
                           (("bf16=false",), "fp32-only training is not offered"),
                           (("quantization_method=hqq",), "quantization_method: hqq is not built")]:
        example = "train_lora/qwen3_lora_sft.yaml"
        r = subprocess.run([str(BIN), "train", str(FIXTURE / "examples" / example), "--set", f"model={demo / 'model'}",
                            "--set", f"output_dir={tmp_path / 'out'}", *[a for s in sets for a in ("--set", s)]],
                           cwd=FIXTURE, capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert expected in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
