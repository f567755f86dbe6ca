"""TRL's GRPOTrainer (transformers generation, no vLLM: the GPU machine has none) on the model grpo_bench.py makes,
at the settings of a soltrain run beside it: the mean step time of the timed steps, split into generation and
the rest, as JSON on stdout. TRL and datasets are carried to the GPU machine as wheels (bench/NOTES.md run 70).

    python3 bench/trl_grpo_step.py --model /tmp/soltrain-grpo-models/1.7B/model --prompts N --generations 8 \
        --completion 512 --steps 3
"""
import argparse
import json
import random
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--completion", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="/tmp/trl-grpo")
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    import datasets
    import torch
    import transformers
    import trl

    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": " ".join(
        "".join(rng.choice("abcdefghij") for _ in range(5)) for _ in range(8))}]} for _ in range(512)]

    def think_format(completions, **kw):
        return [1.0 if c[0]["content"].strip().startswith("<think>") else 0.0 for c in completions]

    n = a.prompts * a.generations
    args = trl.GRPOConfig(output_dir=a.out, per_device_train_batch_size=n, gradient_accumulation_steps=1,
                          num_generations=a.generations, max_completion_length=a.completion, learning_rate=1e-6,
                          max_steps=a.steps + 1, logging_steps=1, report_to=[], bf16=not a.cpu, use_cpu=a.cpu,
                          gradient_checkpointing=True, save_strategy="no", temperature=1.0)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32 if a.cpu else torch.bfloat16)
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[think_format], args=args, processing_class=tok,
                              train_dataset=datasets.Dataset.from_list(rows))
    gen_times, step_times = [], []
    generate = trainer._generate_single_turn

    def timed_generate(*args, **kw):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.time()
        out = generate(*args, **kw)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        gen_times.append(time.time() - t0)
        return out

    trainer._generate_single_turn = timed_generate

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.time()

        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            step_times.append(time.time() - self.t0)

    trainer.add_callback(Timer())
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    steps, gens = step_times[1:], gen_times[1:]  # the first step warms up
    step_s, gen_s = sum(steps) / len(steps), sum(gens) / len(gens)
    print(json.dumps({"peer": f"trl {trl.__version__} + transformers {transformers.__version__} generate",
                      "completions": n, "max_completion_length": a.completion, "step_s": round(step_s, 3),
                      "generation_s": round(gen_s, 3), "rest_s": round(step_s - gen_s, 3),
                      "mean_completion": lengths[-1] if lengths else None,
                      "generation_tok_s": round(n * (lengths[-1] if lengths else a.completion) / gen_s)}))


if __name__ == "__main__":
    main()
