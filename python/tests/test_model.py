"""The step-level API: per-token log-probs and greedy generation against transformers on the same weights
(computed live on CPU torch), a custom-loss step whose update is the objective's own (weights 1/counted = the
SFT step, bitwise), DLPack round trips with numpy and torch, and bad tensors as one-line errors."""
import json

import numpy as np
import pytest

import soltrain


def batch(model, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, model.vocab_size, size=(model.rows, model.sequence_len), dtype=np.int64)
    targets = np.roll(ids, -1, axis=1).astype(np.int64)
    targets[:, -1] = -100
    targets[0, :5] = -100  # some tokens without a target
    return ids, targets


def test_logprobs_match_transformers(demo):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = soltrain.Model.from_pretrained(demo / "model", sequence_len=32, rows=2)
    ids, targets = batch(model)
    ours = model.logprobs(ids, targets)
    assert ours.shape == (2, 32) and ours.dtype == np.float32
    hf = transformers.AutoModelForCausalLM.from_pretrained(demo / "model", torch_dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.from_numpy(ids)).logits.float()
    ref = torch.log_softmax(logits, -1)
    t = torch.from_numpy(targets)
    expected = ref.gather(-1, t.clamp(min=0)[..., None])[..., 0].masked_fill(t == -100, 0).numpy()
    assert np.abs(ours - expected).max() < 1e-4
    rel = np.linalg.norm(ours - expected) / np.linalg.norm(expected)
    assert rel < 1e-5


def test_greedy_generation_matches_transformers(demo):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = soltrain.Model.from_pretrained(demo / "model", sequence_len=64)
    prompt = [5, 17, 99, 42, 7]
    ours = model.generate(prompt, max_new_tokens=12, eos_token_id=[])
    hf = transformers.AutoModelForCausalLM.from_pretrained(demo / "model", torch_dtype=torch.float32)
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                      pad_token_id=0)
    assert ours == out[0, len(prompt):].tolist()


def test_batched_and_penalised_greedy_generation_matches_transformers(demo):
    """Prompts of different lengths generated as one batch each equal transformers' batch-1 greedy generate, with
    and without a repetition_penalty (which counts the prompt's tokens too)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = soltrain.Model.from_pretrained(demo / "model", sequence_len=64)
    hf = transformers.AutoModelForCausalLM.from_pretrained(demo / "model", torch_dtype=torch.float32)
    prompts = [[5, 17, 99, 42, 7], [8, 3], [100, 200, 50, 60, 70, 80, 90, 11]]
    for penalty in (1.0, 1.3, 0.8):
        ours = model.generate(prompts, max_new_tokens=10, eos_token_id=[], repetition_penalty=penalty)
        assert len(ours) == len(prompts)
        for p, got in zip(prompts, ours):
            out = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, repetition_penalty=penalty,
                              eos_token_id=None, pad_token_id=0)
            assert got == out[0, len(p):].tolist(), (penalty, p)


def chi_square_ok(draws, probs):
    """Draws against probabilities: nothing outside the support, chi-square under its p = 0.001 critical value
    (Wilson-Hilferty), tokens expected fewer than 5 times pooled."""
    n = len(draws)
    counts = np.bincount(np.asarray(draws), minlength=len(probs)).astype(float)
    assert counts[probs == 0].sum() == 0, "a token outside the kept set was drawn"
    big = probs * n >= 5
    small = (probs > 0) & ~big
    obs, exp = list(counts[big]), list(probs[big] * n)
    if small.any():
        obs.append(counts[small].sum())
        exp.append(probs[small].sum() * n)
    obs, exp = np.array(obs), np.array(exp)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    critical = df * (1 - 2 / (9 * df) + 3.090232 * (2 / (9 * df)) ** 0.5) ** 3
    return chi2 < critical, (chi2, critical, df)


def test_sampling_follows_transformers_processors(demo):
    """The first sampled token over many seeds follows the distribution transformers' generate samples from: its
    repetition penalty, temperature, top-k, top-p and min-p processors, in its order, computed live."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers import generation as g

    model = soltrain.Model.from_pretrained(demo / "model", sequence_len=16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(demo / "model", torch_dtype=torch.float32)
    prompt = [5, 17, 99, 42, 7, 17]
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[:, -1].float()
    settings = [
        dict(temperature=0.5),
        dict(temperature=0.7, top_k=30, top_p=0.9, min_p=0.05, repetition_penalty=1.5),
        dict(temperature=1.0, top_p=0.8, repetition_penalty=0.7),
        dict(temperature=0.6, min_p=0.2),
    ]
    for i, s in enumerate(settings):
        procs = g.LogitsProcessorList()
        if s.get("repetition_penalty", 1.0) != 1.0:
            procs.append(g.RepetitionPenaltyLogitsProcessor(s["repetition_penalty"]))
        procs.append(g.TemperatureLogitsWarper(s["temperature"]))
        if s.get("top_k"):
            procs.append(g.TopKLogitsWarper(s["top_k"]))
        if s.get("top_p", 1.0) < 1.0:
            procs.append(g.TopPLogitsWarper(s["top_p"]))
        if s.get("min_p"):
            procs.append(g.MinPLogitsWarper(s["min_p"]))
        probs = torch.softmax(procs(torch.tensor([prompt]), logits.clone()), -1)[0].double().numpy()
        draws = model.generate([prompt] * 3000, max_new_tokens=1, seed=1000 * i, eos_token_id=[], **s)
        ok, detail = chi_square_ok([d[0] for d in draws], probs)
        assert ok, (s, detail)


def test_weighted_step_with_sft_weights_is_the_sft_step(demo, tmp_path):
    a = soltrain.Model.from_pretrained(demo / "model", sequence_len=32, rows=2, learning_rate=1e-3)
    b = soltrain.Model.from_pretrained(demo / "model", sequence_len=32, rows=2, learning_rate=1e-3)
    ids, targets = batch(a, seed=1)
    counted = int((targets != -100).sum())
    weights = np.where(targets != -100, 1.0 / counted, 0.0).astype(np.float32)
    for _ in range(3):
        sa = a.step(ids, targets)
        sb = b.step(ids, targets, weights)
        assert sb["loss"] == pytest.approx(sa["loss"], rel=1e-6)
        assert sb["grad_norm"] == sa["grad_norm"]
    a.save_pretrained(tmp_path / "a")
    b.save_pretrained(tmp_path / "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    # A weight is d loss / d NLL: doubling every weight doubles the loss and the gradient's norm.
    c = soltrain.Model.from_pretrained(demo / "model", sequence_len=32, rows=2, max_grad_norm=0)
    d = soltrain.Model.from_pretrained(demo / "model", sequence_len=32, rows=2, max_grad_norm=0)
    sc, sd = c.step(ids, targets, weights), d.step(ids, targets, 2 * weights)
    assert sd["loss"] == pytest.approx(2 * sc["loss"], rel=1e-6)
    assert sd["grad_norm"] == pytest.approx(2 * sc["grad_norm"], rel=1e-5)


def test_dlpack_round_trips(demo):
    torch = pytest.importorskip("torch")
    model = soltrain.Model.from_pretrained(demo / "model", sequence_len=16, rows=2)
    ids, targets = batch(model, seed=2)
    from_numpy = model.logprobs(ids, targets)
    from_torch = model.logprobs(torch.from_numpy(ids), torch.from_numpy(targets))
    assert isinstance(from_torch, torch.Tensor) and from_torch.dtype == torch.float32
    assert np.array_equal(from_torch.numpy(), from_numpy)
    assert np.array_equal(np.from_dlpack(from_numpy), from_numpy)
    assert torch.equal(torch.from_dlpack(from_numpy), from_torch)
    # int32 inputs and int64 ones are the same tokens
    assert np.array_equal(model.logprobs(ids.astype(np.int32), targets.astype(np.int32)), from_numpy)


def test_bad_tensors_are_one_line(demo):
    model = soltrain.Model.from_pretrained(demo / "model", sequence_len=16, rows=2)
    ids, targets = batch(model, seed=3)
    with pytest.raises(soltrain.SoltrainError, match="this model takes 2 x 16"):
        model.logprobs(ids[:1], targets[:1])
    with pytest.raises(soltrain.SoltrainError, match="one target per token"):
        model.logprobs(ids, targets[:, :8])
    bad = ids.copy()
    bad[1, 3] = model.vocab_size + 5
    with pytest.raises(soltrain.SoltrainError, match=r"input_ids\[19\]"):
        model.logprobs(bad, targets)
    with pytest.raises(soltrain.SoltrainError, match="one weight per token"):
        model.step(ids, targets, np.ones((2, 8), np.float32))
    w = np.ones((2, 16), np.float32)
    w[0, 0] = np.nan
    with pytest.raises(soltrain.SoltrainError, match="finite"):
        model.step(ids, targets, w)
    with pytest.raises(soltrain.ConfigError, match="lora_rnk"):
        soltrain.Model.from_pretrained(demo / "model", lora_rnk=4)


def test_tokenizer_and_chat_template_are_hf_s():
    """soltrain.Tokenizer against the HF-made fixtures (tests/fixtures/tokenizer: transformers' ids and rendered
    chat texts) on the real Qwen3 tokenizer that scripts/test.sh fetched."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    folder = root / "build" / "tokenizers" / "qwen3"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the reference tokenizers are fetched by the C++ build (tests/tools/fetch_tokenizers.sh)")
    tok = soltrain.Tokenizer(folder)
    cases = json.loads((root / "tests" / "fixtures" / "tokenizer" / "qwen3_encode_shared.json").read_text())
    for c in cases[:200]:
        assert tok.encode(c["text"]) == c["ids"], c["text"][:80]
        if c["decoded_ok"]:
            assert tok.decode(c["ids"]) == c["text"]
    chats = json.loads((root / "tests" / "fixtures" / "tokenizer" / "qwen3_chat.json").read_text())
    for c in chats:
        extra = {} if c.get("enable_thinking") is None else {"enable_thinking": c["enable_thinking"]}
        text = tok.apply_chat_template(c["messages"], add_generation_prompt=c["add_generation_prompt"], **extra)
        assert text == c["text"]
        assert tok.apply_chat_template(c["messages"], add_generation_prompt=c["add_generation_prompt"], tokenize=True,
                                       **extra) == c["ids"]


def test_stop_strings_match_transformers(demo, tmp_path):
    """`soltrain generate --stop` ends where transformers' generate(stop_strings=..., tokenizer=...) does, on stop
    strings taken from the unstopped greedy text (one character, two spanning a token boundary, and two strings at
    once). The demo's weights redrawn larger, so greedy text varies instead of repeating one byte."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import shutil
    import subprocess
    from conftest import BIN
    torch.manual_seed(3)
    folder = tmp_path / "model"
    hf = transformers.AutoModelForCausalLM.from_pretrained(demo / "model", dtype=torch.float32)
    hf.resize_token_embeddings(len(transformers.AutoTokenizer.from_pretrained(demo / "model")))  # no padding ids
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 0.3) + (1.0 if p.ndim == 1 else 0.0))
    hf.save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (demo / "model" / f).exists():
            shutil.copy(demo / "model" / f, folder / f)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = "hello there"
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids

    def ours(*stop):
        args = [str(BIN), "generate", "--model", str(folder), "--prompt", prompt, "--max-new-tokens", "48",
                "--temperature", "0", "--print-ids"]
        for s in stop:
            args += ["--stop", s]
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return [int(x) for x in r.stdout.split()]

    def theirs(*stop):
        out = hf.generate(ids, max_new_tokens=48, do_sample=False, stop_strings=list(stop) or None,
                          tokenizer=tok, pad_token_id=0)
        return out[0, ids.shape[1]:].tolist()

    free = ours()
    assert free == theirs()
    text = tok.decode(free)
    # Printable ASCII only (random bytes are rarely UTF-8 text). transformers also matches a string begun in the
    # prompt's last characters; soltrain, like vLLM, reads the generated text alone: such strings are left out.
    ok = [i for i in range(1, len(text)) if " " <= text[i] <= "~"]
    pairs = [text[i:i + 2] for i in ok if i + 1 in ok and (prompt + text).find(text[i:i + 2]) >= len(prompt)]
    singles = [text[i] for i in ok if (prompt + text).find(text[i]) >= len(prompt)]
    assert len(pairs) >= 2 and singles, f"greedy text {text!r} has too few printable characters to cut at"
    for stop in [(pairs[0],), (pairs[-1],), (singles[-1],), (pairs[-1], singles[0])]:
        cut = ours(*stop)
        assert cut == theirs(*stop), stop
        assert 0 < len(cut) < len(free), (stop, text)
