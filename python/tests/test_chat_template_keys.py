"""Axolotl's chat-template keys checked against transformers live: `chat_template: jinja` with `chat_template_jinja`
(the template itself) renders and tokenizes each conversation as the tokenizer's apply_chat_template does with that
template, and the saved model's tokenizer_config.json carries it (transformers reloads it); a dataset's
`drop_system_message` leaves a leading system turn out, as Axolotl's ChatTemplateStrategy does."""
import json
import subprocess

import pytest

from conftest import BIN, prepared_documents

transformers = pytest.importorskip("transformers")

# A template the demo tokenizer does not have: bracketed roles, the eos token after each assistant turn.
JINJA = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
         "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
         "{% if add_generation_prompt %}[assistant] {% endif %}")

ROWS = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Reverse w{i}"},
                      {"role": "assistant", "content": f"{i}w"}]} for i in range(6)]


def documents(folder):
    return [ids for ids, _ in prepared_documents(folder)]


def run(demo, tmp_path, config, command="tokenize"):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = {"model": str(demo / "model"), "output_dir": str(tmp_path / "out"), "sequence_len": 128,
           "datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "chat_template"}], **config}
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg))
    args = [str(BIN), command, str(tmp_path / "cfg.yaml")] + (["--quiet"] if command == "tokenize" else [])
    return subprocess.run(args, capture_output=True, text=True)


def prepared(tmp_path):
    return [p for p in (tmp_path / "out" / "prepared").iterdir() if p.name.startswith("train-")]


def test_chat_template_jinja_renders_as_transformers_does(demo, tmp_path):
    r = run(demo, tmp_path, {"chat_template": "jinja", "chat_template_jinja": JINJA})
    assert r.returncode == 0, r.stderr
    [folder] = prepared(tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(str(demo / "model"))
    expected = [tok.apply_chat_template(row["messages"], chat_template=JINJA, tokenize=True, return_dict=False)
                for row in ROWS]
    assert documents(folder) == expected


def test_chat_template_jinja_is_saved_with_the_model(demo, tmp_path):
    r = run(demo, tmp_path, {"chat_template_jinja": JINJA, "max_steps": 1, "lora": False}, command="sft")
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    saved = tmp_path / "out" / "model"
    assert json.loads((saved / "tokenizer_config.json").read_text())["chat_template"] == JINJA
    tok = transformers.AutoTokenizer.from_pretrained(str(saved))
    # (HF renders with trim_blocks: the line break after a block tag goes)
    assert tok.apply_chat_template(ROWS[0]["messages"], tokenize=False).startswith("[system] Be brief.[user] Reverse")


def test_drop_system_message(demo, tmp_path):
    r = run(demo, tmp_path, {"chat_template": "jinja", "chat_template_jinja": JINJA,
                             "datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "chat_template",
                                           "drop_system_message": True}]})
    assert r.returncode == 0, r.stderr
    [folder] = prepared(tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(str(demo / "model"))
    expected = [tok.apply_chat_template(row["messages"][1:], chat_template=JINJA, tokenize=True, return_dict=False)
                for row in ROWS]
    assert documents(folder) == expected


@pytest.mark.parametrize("config,message", [
    ({"chat_template": "jinja"}, "chat_template: jinja needs chat_template_jinja (the template)"),
    ({"chat_template": "chatml", "chat_template_jinja": JINJA}, "chat_template_jinja is read with chat_template: jinja"),
    ({"chat_template_jinja": "{% for m in messages %}"}, "chat_template_jinja is not a template soltrain can render"),
])
def test_bad_jinja_settings_are_one_line(demo, tmp_path, config, message):
    r = run(demo, tmp_path, config)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# A second template for the dataset-level key: angle-bracketed roles.
JINJA_B = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
           "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}")


def test_dataset_level_chat_template_jinja(demo, tmp_path):
    """Axolotl's dataset-level chat_template: jinja + chat_template_jinja: each dataset renders with its own template
    (the other with the top-level one), each as transformers' apply_chat_template does with that template."""
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    r = run(demo, tmp_path, {"chat_template": "jinja", "chat_template_jinja": JINJA,
                             "datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "chat_template"},
                                          {"path": str(tmp_path / "b.jsonl"), "type": "chat_template",
                                           "chat_template": "jinja", "chat_template_jinja": JINJA_B}]})
    assert r.returncode == 0, r.stderr
    folders = sorted(prepared(tmp_path), key=lambda p: p.name)
    assert [p.name[:7] for p in folders] == ["train-0", "train-1"]
    tok = transformers.AutoTokenizer.from_pretrained(str(demo / "model"))
    for folder, template, rows in [(folders[0], JINJA, ROWS), (folders[1], JINJA_B, ROWS[:3])]:
        expected = [tok.apply_chat_template(row["messages"], chat_template=template, tokenize=True, return_dict=False)
                    for row in rows]
        assert documents(folder) == expected, folder.name


@pytest.mark.parametrize("entry,message", [
    ({"chat_template": "jinja"}, "chat_template: jinja needs chat_template_jinja (the template)"),
    ({"chat_template_jinja": JINJA_B}, "chat_template_jinja is read with the dataset's chat_template: jinja"),
    ({"chat_template": "chatml", "chat_template_jinja": JINJA_B},
     "chat_template_jinja is read with the dataset's chat_template: jinja, not chat_template: chatml"),
    ({"chat_template": "jinja", "chat_template_jinja": "{% if %}"},
     "chat_template_jinja is not a template soltrain can render"),
])
def test_bad_dataset_jinja_settings_are_one_line(demo, tmp_path, entry, message):
    r = run(demo, tmp_path, {"datasets": [{"path": str(tmp_path / "data.jsonl"), "type": "chat_template", **entry}]})
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
