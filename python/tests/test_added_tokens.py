"""Axolotl's tokenizer settings (`tokens`, `special_tokens`, `added_tokens_overrides`) and the embedding resize they
cause, against transformers live on CPU: the run's tokenizer is what transformers' add_special_tokens / add_tokens
(as Axolotl's loaders/tokenizer.py calls them) save, the documents are tokenized by it, and the model is resized as
resize_token_embeddings(len(tokenizer)) resizes it (new rows at the old rows' mean; mean_resizing_embeddings: false
draws them instead; shrink_embeddings and resize_token_embeddings_to_32x). An adapter adding tokens without
lora_modules_to_save [embed_tokens, lm_head] is one line, as in Axolotl; with them, PEFT loads the adapter over the
base resized by transformers. SOLTRAIN_TEST_DEVICE=cuda runs the same on the GPU (bench/gpu_core_check.sh addedtokens:
vocabularies of 263 and 288 rows, no multiple of 8)."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import BIN, randomize

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
yaml = pytest.importorskip("yaml")
from safetensors.torch import load_file  # noqa: E402

TOKENS = ["<tool>", "</tool>", "hello", "a"]  # three new ones; "a" is in the (byte-level) vocabulary already
TEXT = "<tool>call(x)</tool> and <|im_start|>hello<tool>"


def tiny_llama(demo, path, tied=False):
    """A Llama with exactly the demo tokenizer's rows (no spare rows, as Llama 3's 128256), untied."""
    tok = transformers.AutoTokenizer.from_pretrained(demo / "model")
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=tied)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.save_pretrained(path)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(demo / "model" / f, path / f)
    return path


def axolotl_tokenizer(model_dir, special=None, tokens=(), additional=None):
    """What Axolotl's load_tokenizer does with special_tokens and tokens."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    for k, v in (special or {}).items():
        tok.add_special_tokens({k: transformers.AddedToken(v, rstrip=False, lstrip=False, normalized=False)})
    if tokens:
        tok.add_tokens([transformers.AddedToken(t, rstrip=False, lstrip=False, normalized=False) for t in tokens])
    if additional is not None:
        tok.add_special_tokens({"additional_special_tokens": additional})
    return tok


def run(tmp_path, model_dir, name, **keys):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": TEXT}) + "\n")
    cfg = dict(base_model=str(model_dir), datasets=[{"path": str(data), "type": "completion"}],
               output_dir=str(tmp_path / name), sequence_len=64, micro_batch_size=1, max_steps=1,
               learning_rate=1e-12, warmup_steps=0, device=os.environ.get("SOLTRAIN_TEST_DEVICE", "cpu"),
               sample_packing=False, save_safetensors=True)
    cfg.update(keys)
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return subprocess.run([str(BIN), "sft", str(tmp_path / f"{name}.yaml"), "--dump-batches",
                           str(tmp_path / name / "batches")], capture_output=True, text=True)


def added_tokens(folder):
    return json.loads((folder / "tokenizer.json").read_text())["added_tokens"]


def test_tokens_and_special_tokens_as_transformers_adds_them(demo, tmp_path):
    model_dir = tiny_llama(demo, tmp_path / "base")
    special = {"eos_token": "<|eot|>", "pad_token": "<|im_end|>"}
    r = run(tmp_path, model_dir, "out", special_tokens=special, tokens=TOKENS)
    assert r.returncode == 0, r.stderr
    assert ("sft: tokenizer: eos_token <|eot|>, pad_token <|im_end|>; 4 new tokens (<|eot|> = 259, <tool> = 260, "
            "</tool> = 261, hello = 262)") in r.stderr, r.stderr
    assert "sft: tokenizer: the embedding and LM head resized from 259 to 263 rows" in r.stderr, r.stderr
    ref = axolotl_tokenizer(model_dir, special, TOKENS)
    ref.save_pretrained(tmp_path / "ref")
    saved = tmp_path / "out" / "model"
    # the tokenizer files: tokenizer.json's added tokens as transformers saves them; transformers reads ours alike
    assert added_tokens(saved) == added_tokens(tmp_path / "ref")
    ours = transformers.AutoTokenizer.from_pretrained(saved)
    assert len(ours) == len(ref) == 263
    assert (ours.eos_token, ours.pad_token) == (ref.eos_token, ref.pad_token) == ("<|eot|>", "<|im_end|>")
    assert ours(TEXT)["input_ids"] == ref(TEXT)["input_ids"]
    assert ours.decode(ref(TEXT)["input_ids"], skip_special_tokens=True) == ref.decode(
        ref(TEXT)["input_ids"], skip_special_tokens=True)
    # the document trained on: transformers' ids, then the new eos (Axolotl's completion rows end with eos)
    batch = load_file(str(tmp_path / "out" / "batches" / "step-1-micro-0.safetensors"))
    want = ref(TEXT)["input_ids"] + [ref.eos_token_id]
    assert batch["input_ids"].flatten()[:len(want)].tolist() == want
    # the weights: resize_token_embeddings(len(tokenizer)) with transformers' mean resizing
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hf.resize_token_embeddings(len(ref))
    got = load_file(str(saved / "model.safetensors"))
    assert json.loads((saved / "config.json").read_text())["vocab_size"] == 263
    for name, theirs in [("model.embed_tokens.weight", hf.model.embed_tokens.weight),
                         ("lm_head.weight", hf.lm_head.weight)]:
        assert got[name].shape == theirs.shape
        assert torch.allclose(got[name][:259].float(), theirs[:259], atol=1e-6), name
        # transformers draws the new rows from N(mean, 1e-9 cov): within ~3e-5 std of the mean soltrain sets
        new = got[name][259:].float()
        assert (new - theirs[259:]).abs().max() < 1e-3 * theirs[:259].abs().max(), name
        assert torch.allclose(new, theirs[:259].mean(0).expand_as(new), atol=1e-6), name
    # transformers loads the saved folder, every row in place
    assert transformers.AutoModelForCausalLM.from_pretrained(saved).get_input_embeddings().weight.shape[0] == 263


def test_resizing_options_and_overrides(demo, tmp_path):
    model_dir = tiny_llama(demo, tmp_path / "base", tied=True)
    # resize_token_embeddings_to_32x: 259 + 1 tokens -> 288 rows; mean_resizing_embeddings: false draws new rows
    r = run(tmp_path, model_dir, "x32", tokens=["<tool>"], resize_token_embeddings_to_32x=True,
            mean_resizing_embeddings=False)
    assert r.returncode == 0, r.stderr
    got = load_file(str(tmp_path / "x32" / "model" / "model.safetensors"))["model.embed_tokens.weight"].float()
    assert got.shape[0] == 288
    std = float(got[260:].std())
    assert 0.01 < std < 0.03, std  # normal(0, initializer_range 0.02), not the mean
    # shrink_embeddings: a model with spare rows cut to the tokenizer's 259
    spare = tmp_path / "spare"
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    hf.resize_token_embeddings(300)
    hf.save_pretrained(spare)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(model_dir / f, spare / f)
    r = run(tmp_path, spare, "shrunk", shrink_embeddings=True)
    assert r.returncode == 0, r.stderr
    shrunk = load_file(str(tmp_path / "shrunk" / "model" / "model.safetensors"))["model.embed_tokens.weight"]
    assert shrunk.shape[0] == 259
    # without shrink_embeddings the spare rows stay, and a new token takes id 259 within them (no resize)
    r = run(tmp_path, spare, "within", tokens=["<tool>"])
    assert r.returncode == 0 and "resized" not in r.stderr, r.stderr
    assert load_file(str(tmp_path / "within" / "model" / "model.safetensors"))[
        "model.embed_tokens.weight"].shape[0] == 300
    # added_tokens_overrides (Axolotl's modify_tokenizer_files): id 257 renamed
    r = run(tmp_path, model_dir, "renamed", added_tokens_overrides={257: "<|think|>"})
    assert r.returncode == 0, r.stderr
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "renamed" / "model")
    assert tok.convert_tokens_to_ids("<|think|>") == 257 and tok("a<|think|>")["input_ids"][-1] == 257


def test_adapter_rules_and_peft_loads_the_result(demo, tmp_path):
    peft = pytest.importorskip("peft")
    model_dir = tiny_llama(demo, tmp_path / "base")
    lora = dict(adapter="lora", lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"])
    r = run(tmp_path, model_dir, "bare", tokens=["<tool>"], **lora)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        "tokens: new tokens with an adapter need lora_modules_to_save: [embed_tokens, lm_head] (their rows train "
        "in full beside the adapter; Axolotl asks the same)"), r.stderr
    assert not (tmp_path / "bare" / "adapter").exists()
    r = run(tmp_path, model_dir, "eos", special_tokens={"eos_token": "<|eot|>"}, **lora)
    assert r.returncode == 2 and "special_tokens: eos_token \"<|eot|>\" is new" in r.stderr, r.stderr
    r = run(tmp_path, model_dir, "full", tokens=["<tool>"], lora_modules_to_save=["embed_tokens", "lm_head"],
            learning_rate=1e-2, **lora)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "full" / "adapter"
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tok) == 260
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base.resize_token_embeddings(len(tok))
    model = peft.PeftModel.from_pretrained(base, folder)
    saved = load_file(str(folder / "adapter_model.safetensors"))
    emb = [k for k in saved if "embed_tokens" in k]
    assert emb and saved[emb[0]].shape[0] == 260
    loaded = dict(model.named_parameters())
    copy = [n for n in loaded if "embed_tokens.modules_to_save" in n]
    assert copy and torch.allclose(loaded[copy[0]].float(), saved[emb[0]].float())
    # a bad role is one line
    r = run(tmp_path, model_dir, "role", special_tokens={"eot_token": "<|eot|>"})
    assert r.returncode == 2 and "special_tokens: eot_token: not a special-token role" in r.stderr, r.stderr
