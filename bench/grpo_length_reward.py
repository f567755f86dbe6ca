"""A reward that varies on random models' completions (their length in characters), for GPU runs whose weights
must move: `reward_funcs: ["bench.grpo_length_reward:text_length"]` from the repository root."""


def text_length(prompts, completions, **columns):
    return [float(len(c[0]["content"] if isinstance(c, list) else c)) / 100.0 for c in completions]
