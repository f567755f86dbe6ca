# DPO throughput on one GPU, in one run: `soltrain dpo` (LoRA; reference = adapters off every step, and with
# precompute_ref_log_probs) against `soltrain sft` on the same tokens, and a TRL-style transformers + PEFT DPO
# step (reference = the same model under disable_adapter(), chosen and rejected in one batch as TRL's
# concatenated_forward, sigmoid loss, clipping, AdamW), on a random-init Qwen3 shape with LoRA on all seven
# projections. The documents are byte-tokenized random text (the demo's byte tokenizer, ids < 320), each
# prompt + answer longer than half of --seq, so every engine runs one document per row: the same tokens.
# Tokens/s = chosen + rejected tokens (prompt + answer, no padding) per whole step, median after warm-up.
#   python3 bench/dpo_bench.py --soltrain build/soltrain --size 8B --pairs 1 --seq 2048
import argparse, json, os, random, re, shutil, statistics, subprocess, sys, tempfile, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from run_bench import save_model  # noqa: E402

STEP = re.compile(r"step (\d+)/\d+ \| .*?\| ([0-9.]+)k tok/s")


def write_data(d, n, prompt_len, answer_len):
    rnd = random.Random(0)
    text = lambda k: "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(k))
    with open(os.path.join(d, "dpo.jsonl"), "w") as f, open(os.path.join(d, "sft.jsonl"), "w") as g:
        for _ in range(n):
            p, c, r = text(prompt_len), text(answer_len), text(answer_len)
            f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n")
            for a in (c, r):  # SFT trains the same two documents
                g.write(json.dumps({"messages": [{"role": "user", "content": p},
                                                 {"role": "assistant", "content": a}]}) + "\n")


def run_soltrain(binary, cmd, model, d, data, rows, seq, steps, extra):
    cfg = os.path.join(d, f"{cmd}-{len(extra)}.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {model}\noutput_dir: {d}/out-{cmd}-{len(extra)}\ndatasets: [{{path: {data}}}]\n"
                f"sequence_len: {seq}\nper_device_train_batch_size: {rows}\nmax_steps: {steps}\n"
                f"learning_rate: 1.0e-5\nlogging_steps: 1\nlora: true\nlora_rank: 16\nlora_alpha: 32\n"
                f"device: cuda\nbad_records: error\n" + "".join(f"{e}\n" for e in extra))
    out = subprocess.run([binary, cmd, cfg], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-300:]}
    # rows × seq tokens per step on the progress line; the timed steps are those after warm-up
    rate = [float(m.group(2)) * 1e3 for m in STEP.finditer(out.stderr) if int(m.group(1)) > 3]
    return {"step_s": (2 * rows if cmd == "dpo" else rows) * seq / statistics.median(rate)} if rate else \
        {"error": "no progress lines"}


def run_trl_style(model_dir, pairs, prompt_len, doc_len, steps, beta=0.1):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                             "gate_proj", "up_proj", "down_proj"]))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    ids = torch.randint(3, 300, (2 * pairs, doc_len), device="cuda")  # chosen rows, then rejected rows
    labels = ids.clone()
    labels[:, :prompt_len] = -100

    def logps(logits):  # TRL: Σ log p over the answer tokens, logits shifted
        lg, lb = logits[:, :-1].float(), labels[:, 1:]
        mask = lb != -100
        lp = torch.gather(lg.log_softmax(-1), 2, lb.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return (lp * mask).sum(-1)

    times = []
    for i in range(steps + 3):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        with torch.no_grad(), model.disable_adapter():
            ref = logps(model(input_ids=ids).logits)
        pol = logps(model(input_ids=ids).logits)
        z = (pol[:pairs] - pol[pairs:]) - (ref[:pairs] - ref[pairs:])
        loss = -F.logsigmoid(beta * z).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= 3: times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times), "memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--soltrain", default="build/soltrain")
    ap.add_argument("--size", default="8B")
    ap.add_argument("--pairs", type=int, default=1, help="pairs per micro-batch (2 rows each)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="/tmp/soltrain-bench-models")
    ap.add_argument("--skip-peer", action="store_true")
    a = ap.parse_args()
    model = save_model(a.size, a.models)
    d = tempfile.mkdtemp(prefix="soltrain-dpo-bench-")
    subprocess.run([a.soltrain, "demo-setup", "--out", d + "/demo", "--train", "1", "--validation", "1"], check=True,
                   capture_output=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):  # the byte tokenizer: ids stay below 320
        shutil.copy(os.path.join(d, "demo", "model", f), os.path.join(model, f))
    # ChatML adds ~30 tokens around prompt + answer; each document then fills more than half a row
    prompt_len, answer_len = a.seq // 4, a.seq // 2 - 16
    write_data(d, 64 * a.pairs * (a.steps + 4), prompt_len, answer_len)
    doc_len = prompt_len + answer_len + 30  # approximately, for the tokens/s figures
    tokens = 2 * a.pairs * doc_len
    rows = []
    for label, cmd, data, extra in (("soltrain sft (same documents)", "sft", "sft.jsonl", ()),
                                    ("soltrain dpo", "dpo", "dpo.jsonl", ()),
                                    ("soltrain dpo, precompute_ref_log_probs", "dpo", "dpo.jsonl",
                                     ("precompute_ref_log_probs: true",))):
        r = run_soltrain(a.soltrain, cmd, model, d, os.path.join(d, data),
                         2 * a.pairs if cmd == "sft" else a.pairs, a.seq, a.steps + 3, extra)
        r["engine"] = label
        rows.append(r)
    if not a.skip_peer:
        r = run_trl_style(model, a.pairs, prompt_len, doc_len, a.steps)
        r["engine"] = "transformers + PEFT, TRL-style DPO step"
        rows.append(r)
    sft = rows[0].get("step_s")
    print(f"\n| Qwen3-{a.size} LoRA r16, {a.pairs} pair(s) x {a.seq} | step s | tokens/s (chosen + rejected) | vs sft |")
    print("|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['engine']} | error: {r['error'][:100]} | | |")
        else:
            print(f"| {r['engine']} | {r['step_s']:.3f} | {tokens / r['step_s']:.0f} | "
                  f"{100 * sft / r['step_s']:.0f}% |" if sft else "| |")
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
