"""Axolotl's `tokenizer_use_mistral_common` (Devstral, Magistral, Ministral), checked against mistral-common live: a
tekken.json is read as mistral-common's Tekkenizer encodes (ids of random multilingual text equal), conversations are
tokenized as its encode_chat_completion encodes them in each format version (v3: the system prompt before the last
user message; v7/v11: [SYSTEM_PROMPT] turns; v13: [THINK] chunks), with Axolotl's chat_template masks (assistant
content and its </s> trained), and the model saved by `sft` carries a tokenizer.json that transformers loads to the
same ids and chat text. The tekken files are mistral-common's own tekken_240911.json (Mistral NeMo's, format v3, no
special_tokens list), and that vocabulary with each later version and mistral-common's special-token list."""
import json
import os
import random
import subprocess

import pytest

from conftest import BIN, prepared_documents

mistral_common = pytest.importorskip("mistral_common")
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.validator import ValidationMode  # noqa: E402
from mistral_common.tokens.tokenizers.base import SpecialTokens  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

import soltrain  # noqa: E402

NEMO = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")


@pytest.fixture(scope="module")
def tekken(tmp_path_factory):
    """version -> a folder holding only tekken.json of that version"""
    raw = json.load(open(NEMO))
    assert raw["config"]["version"] == "v3" and "special_tokens" not in raw
    out = {}
    for v in ["v3", "v7", "v11", "v13"]:
        d = tmp_path_factory.mktemp(f"tekken-{v}")
        if v == "v3":
            os.symlink(NEMO, d / "tekken.json")  # the first layout as it ships
        else:
            r = dict(raw, config=dict(raw["config"], version=v))
            r["special_tokens"] = [{"rank": i, "token_str": t.value, "is_control": True}
                                   for i, t in enumerate(SpecialTokens)]
            (d / "tekken.json").write_text(json.dumps(r))
        out[v] = d
    return out


def reference(folder):
    return MistralTokenizer.from_file(str(folder / "tekken.json"), mode=ValidationMode.finetuning)


def random_texts(n, seed):
    rng = random.Random(seed)
    alphabet = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"
                "\n\t\r  éèàçñüößøåÆŒ" "ĀāĒēİıŁł" "αβγδεζηθλμπσωΩΣ" "абвгдежзийклмнопрстуфхцчшщыэюяЖЩ" "אבגדה" "عربية"
                "日本語の文章中文字符한국어텍스트" "ไทย" "हिन्दी" "😀🚀👍🏽🇫🇷" "\u0301\u0308\u200d")
    words = ["def ", "return ", "    ", "\n\n", "1234567", "3.14159", "HTTPServer", "camelCaseWord", "snake_case",
             "  \n", "...", "!!", "https://example.com/a?b=c", "<|im_end|>"]
    out = []
    for _ in range(n):
        parts = [rng.choice(words) if rng.random() < 0.3 else "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
                 for _ in range(rng.randint(1, 25))]
        out.append("".join(parts))
    return out


@pytest.mark.parametrize("version", ["v3", "v13"])
def test_text_encodes_as_the_tekkenizer(tekken, version):
    ref = reference(tekken[version]).instruct_tokenizer.tokenizer
    ours = soltrain.Tokenizer(tekken[version])
    texts = random_texts(300, seed=11) + ["", " ", "Hello world", "  leading", "trailing  ", "ñandú 🇫🇷 日本"]
    # (text holding a control token's string: mistral-common encodes it as text, transformers' conversion and
    # soltrain as the token; no random text here spells one)
    for t in texts:
        assert ours.encode(t) == ref.encode(t, bos=False, eos=False), repr(t)
    assert ours.decode(ref.encode("ñandú 🇫🇷 日本 text", bos=False, eos=False)) == "ñandú 🇫🇷 日本 text"


def conversations(version):
    rng = random.Random(5)
    texts = random_texts(40, seed=23)
    rows = []
    for i in range(8):
        msgs = []
        turns = 1 + i % 3
        # (v3 puts the system prompt before the last user message, so a longer conversation's earlier turns render
        # differently once a later one follows: refused, see test_v3_refuses_...)
        if i % 2 == 0 and (version != "v3" or turns == 1):
            msgs.append({"role": "system", "content": rng.choice(texts)})
        for _ in range(turns):
            msgs.append({"role": "user", "content": rng.choice(texts)})
            msgs.append({"role": "assistant", "content": rng.choice(texts)})
        rows.append({"messages": msgs})
    if version == "v13":  # chunks (a dataset's contents are all strings or all chunk lists, as in Axolotl): text
        # joined by a blank line, thinking as [THINK]...[/THINK]
        for row in rows:
            for m in row["messages"]:
                m["content"] = [{"type": "text", "text": m["content"]}]
        rows.append({"messages": [
            {"role": "system", "content": [{"type": "text", "text": "Sys A."}, {"type": "text", "text": "Sys B."}]},
            {"role": "user", "content": [{"type": "text", "text": "What is 15% of 240?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "0.15 * 240 = 36"},
                                              {"type": "text", "text": "36"}, {"type": "text", "text": "Done. "}]}]})
    return rows


def expected_mask(tok, msgs, version):
    """Axolotl's chat_template masks over mistral-common's layout: each assistant turn's content and its </s>."""
    inner = tok.instruct_tokenizer.tokenizer
    special = {t.value: inner.get_special_token(t.value) for t in SpecialTokens
               if t.value in ("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")}

    def text(m):  # (an assistant's text loses its trailing spaces, mistral-common's rstrip(" "), unless it thinks)
        strip = (lambda x: x.rstrip(" ")) if m["role"] == "assistant" else (lambda x: x)
        if isinstance(m["content"], str):
            return strip(m["content"])
        if all(c["type"] == "text" for c in m["content"]):
            return strip("\n\n".join(c["text"] for c in m["content"]))
        out, after_text = "", False
        for c in m["content"]:
            if c["type"] == "text":
                out += ("\n\n" if after_text else "") + c["text"]
                after_text = True
            else:
                out += "[THINK]" + c["thinking"] + "[/THINK]"
                after_text = False
        return out

    def enc(s):  # (a [THINK] chunk's control tokens split the text as soltrain's added tokens do)
        ids = []
        for i, part in enumerate(s.replace("[/THINK]", "[THINK]").split("[THINK]")):
            if i:
                ids.append(inner.get_special_token("[THINK]" if i % 2 else "[/THINK]"))
            ids += inner.encode(part, bos=False, eos=False)
        return ids

    system = next((text(m) for m in msgs if m["role"] == "system"), None)
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    ids, mask = [special["<s>"]], [0]
    for i, m in enumerate(msgs):
        if m["role"] == "system" and version != "v3":
            part = [special["[SYSTEM_PROMPT]"]] + enc(text(m)) + [special["[/SYSTEM_PROMPT]"]]
            ids, mask = ids + part, mask + [0] * len(part)
        elif m["role"] == "user":
            u = (system + "\n\n" if version == "v3" and system and i == last_user else "") + text(m)
            part = [special["[INST]"]] + enc(u) + [special["[/INST]"]]
            ids, mask = ids + part, mask + [0] * len(part)
        elif m["role"] == "assistant":
            part = enc(text(m)) + [special["</s>"]]
            ids, mask = ids + part, mask + [1] * len(part)
    return ids, mask


@pytest.mark.parametrize("version", ["v3", "v7", "v11", "v13"])
def test_conversations_tokenize_as_encode_chat_completion(tekken, tmp_path, version):
    rows = conversations(version)
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {"model": str(tekken[version]), "output_dir": str(tmp_path / "out"), "sequence_len": 4096,
           "tokenizer_use_mistral_common": True,
           "datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "chat_template"}]}
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg))
    r = subprocess.run([str(BIN), "tokenize", str(tmp_path / "cfg.yaml"), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    [folder] = [p for p in (tmp_path / "out" / "prepared").iterdir() if p.name.startswith("train-")]
    docs = prepared_documents(folder)
    tok = reference(tekken[version])
    assert len(docs) == len(rows)
    for (ids, mask), row in zip(docs, rows):
        want = tok.encode_chat_completion(ChatCompletionRequest(messages=row["messages"])).tokens
        assert ids == want
        assert (ids, [int(m != 0) for m in mask]) == expected_mask(tok, row["messages"], version)


def test_the_saved_tokenizer_loads_in_transformers(tekken, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model_dir = tmp_path / "model"
    cfg = transformers.MistralConfig(vocab_size=131072, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                     max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.MistralForCausalLM(cfg).save_pretrained(model_dir)
    os.symlink(tekken["v7"] / "tekken.json", model_dir / "tekken.json")
    rows = conversations("v7")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"base_model": str(model_dir), "output_dir": str(tmp_path / "out"), "sequence_len": 512,
              "tokenizer_use_mistral_common": True, "max_steps": 1, "micro_batch_size": 1,
              "learning_rate": 1e-4, "datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "chat_template"}]}
    (tmp_path / "cfg.yaml").write_text(json.dumps(config))
    r = subprocess.run([str(BIN), "train", str(tmp_path / "cfg.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    assert "mistral-common's tekken v7" in r.stderr + r.stdout
    saved = next(p for p in [tmp_path / "out", tmp_path / "out" / "model"] if (p / "tokenizer.json").exists())
    hf = transformers.AutoTokenizer.from_pretrained(str(saved))
    ref = reference(tekken["v7"])
    for t in random_texts(40, seed=3):
        assert hf.encode(t, add_special_tokens=False) == ref.instruct_tokenizer.tokenizer.encode(t, bos=False, eos=False)
    msgs = rows[0]["messages"]
    assert hf.apply_chat_template(msgs, tokenize=False) == \
        ref.encode_chat_completion(ChatCompletionRequest(messages=msgs)).text


def test_v3_refuses_a_system_prompt_in_a_multi_turn_conversation(tekken, tmp_path):
    row = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                        {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
                        {"role": "assistant", "content": "d"}]}
    (tmp_path / "data.jsonl").write_text(json.dumps(row) + "\n")
    cfg = {"model": str(tekken["v3"]), "output_dir": str(tmp_path / "out"), "sequence_len": 256,
           "tokenizer_use_mistral_common": True,
           "datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "chat_template"}]}
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg))
    r = subprocess.run([str(BIN), "tokenize", str(tmp_path / "cfg.yaml"), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(
        "data.jsonl:1: chat template: mistral-common format v3 puts the system prompt before the last user message, so "
        "the earlier turns of a conversation with a system prompt and several user messages are not a prefix of it: "
        "such conversations are not built (bad_records: skip in the config skips such records)")
