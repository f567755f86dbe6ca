# Generalisation check against Hugging Face on the GPU machine (it has transformers + tokenizers):
# (1) `soltrain encode` vs tokenizers on thousands of random strings mixing scripts, whitespace, digits,
# punctuation, emoji and special-token look-alikes; (2) `soltrain chat-template` vs apply_chat_template on
# conversations exercising tools, tool calls, tool responses, reasoning in history, thinking on/off.
#   python3 tests/tools/check_tokenizers_vs_hf.py SOLTRAIN_BIN TOKENIZERS_DIR   (dirs qwen3/, llama3/)
import json, random, subprocess, sys

from transformers import AutoTokenizer

soltrain, root = sys.argv[1], sys.argv[2]
rng = random.Random(20261129)
PIECES = ["hello", " world", "  ", "\n", "\n\n", "\t", " \n ", "123", "4567890", "3.14", "don't", "I'm", "you'll",
          "über", "naïve", "日本語", "中文字符", "한국어", "русский", "العربية", "עברית", "हिन्दी", "ไทย", "😀", "👩‍💻",
          "🇫🇷", "e\u0301", "ﬁ", "Ω", "\u00a0", "\u200b", "\u3000", "def f(x):", "    return x", "{\"a\": 1}", "<|im_start|>",
          "<|im_end|>", "<think>", "</think>", "<|eot_id|>", "<|begin_of_text|>", "<s>", "...", "!!!", "---", "$", "€",
          "'s", "'S", "ABC", "camelCase", "snake_case", "http://x.org/a?b=c", "  leading", "trailing  "]


def random_text():
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 25)))


def conversations():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                "unit": {"type": "string", "enum": ["c", "f"]}},
                             "required": ["city"]}}}]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
    out = []
    for think in (True, False):
        for gen in (True, False):
            out.append(dict(messages=[{"role": "user", "content": "Hi there " + random_text()}],
                            add_generation_prompt=gen, enable_thinking=think))
            out.append(dict(messages=[{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "2+2?"},
                                      {"role": "assistant", "content": "4", "reasoning_content": "easy sum"},
                                      {"role": "user", "content": "and 3+3?"}],
                            add_generation_prompt=gen, enable_thinking=think))
            out.append(dict(messages=[{"role": "user", "content": "Weather in Paris?"},
                                      {"role": "assistant", "content": "", "tool_calls": [call]},
                                      {"role": "tool", "content": "{\"temp\": 21}"},
                                      {"role": "tool", "content": "{\"humidity\": 40}"},
                                      {"role": "assistant", "content": "It is 21 C."},
                                      {"role": "user", "content": random_text()}],
                            tools=tools, add_generation_prompt=gen, enable_thinking=think))
            out.append(dict(messages=[{"role": "system", "content": "Use tools."},
                                      {"role": "user", "content": "Check " + random_text()},
                                      {"role": "assistant", "content": "<think>\nplan\n</think>\n\nCalling.",
                                       "tool_calls": [call, call]},
                                      {"role": "tool", "content": "ok"}],
                            tools=tools, add_generation_prompt=gen, enable_thinking=think))
    return out


failures = 0
for name in ("qwen3", "llama3"):
    d = f"{root}/{name}"
    hf = AutoTokenizer.from_pretrained(d)
    texts = [random_text() for _ in range(3000)]
    p = subprocess.run([soltrain, "encode", "--tokenizer", d], input="".join(json.dumps({"text": t}) + "\n" for t in texts),
                       capture_output=True, text=True, check=True)
    ours = [json.loads(l)["ids"] for l in p.stdout.splitlines()]
    bad = [i for i, t in enumerate(texts) if hf.encode(t, add_special_tokens=False) != ours[i]]
    print(f"{name}: encode {len(texts) - len(bad)}/{len(texts)} random texts identical")
    for i in bad[:3]:
        print("   differs:", repr(texts[i]))
    failures += len(bad)
    convs = conversations()
    lines = "".join(json.dumps(c) + "\n" for c in convs)
    p = subprocess.run([soltrain, "chat-template", "--tokenizer", d], input=lines, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{name}: chat-template failed: {p.stderr.strip()[:300]}")
        failures += 1
        continue
    ours = [json.loads(l) for l in p.stdout.splitlines()]
    ok = 0
    for c, o in zip(convs, ours):
        kw = {k: v for k, v in c.items() if k != "messages"}
        try:
            text = hf.apply_chat_template(c["messages"], tokenize=False, **kw)
        except Exception as e:  # a template may reject a case (e.g. tool calls in Llama 3's): skip it
            print(f"   HF rejects a case: {str(e)[:80]}")
            ok += 1
            continue
        ids = hf.encode(text, add_special_tokens=False)
        if o["text"] == text and o["ids"] == ids:
            ok += 1
        else:
            failures += 1
            print(f"   differs: {json.dumps(c)[:200]}\n   ours {o['text']!r}\n   hf   {text!r}")
    print(f"{name}: chat template {ok}/{len(convs)} conversations identical (text and ids)")
print("FAILURES", failures)
sys.exit(1 if failures else 0)
