"""A soltrain job on Ray (python/soltrain/ray.py): Axolotl's use_ray keys and Surogate's distributed block through
`soltrain sft`, and soltrain.ray.train from Python, on a local Ray cluster of CPU ranks. The reference is the same job
under soltrain's own launcher (gpus: 2: two TCP ranks on this machine), whose model it must write bit for bit; a rank
killed mid-run is named and the job resumes from its checkpoint to the same model."""
import os
import pathlib
import subprocess

import pytest

from conftest import BIN, ROOT

ray = pytest.importorskip("ray")


def write_config(tmp_path, demo, extra, name="run.yaml", out="out"):
    (tmp_path / name).write_text(f"""base_model: {demo / 'model'}
datasets: [{{path: {demo / 'train.jsonl'}, type: chat_template}}]
output_dir: {tmp_path / out}
sequence_len: 64
micro_batch_size: 2
max_steps: 4
save_steps: 2
learning_rate: 1.0e-3
device: cpu
{extra}""")
    return tmp_path / name


def sft(config, *sets, env=None):
    args = [str(BIN), "sft", str(config)]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, cwd=config.parent,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python"), **(env or {})})


def weights(folder):
    return (folder / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def reference(demo, tmp_path_factory):
    """The job under soltrain's own launcher: 2 CPU ranks."""
    tmp = tmp_path_factory.mktemp("ray-reference")
    r = sft(write_config(tmp, demo, "gpus: 2\n"))
    assert r.returncode == 0, r.stderr
    return weights(tmp / "out" / "model")


def test_axolotls_use_ray_trains_as_the_same_ranks_do(demo, tmp_path, reference):
    r = sft(write_config(tmp_path, demo, "use_ray: true\nray_num_workers: 2\nresources_per_worker: {CPU: 1}\n"))
    assert r.returncode == 0, r.stderr
    assert "Ray job: 2 workers of {CPU: 1} on a local Ray cluster" in r.stderr
    assert "data parallel over 2 ranks (tcp)" in r.stderr
    assert weights(tmp_path / "out" / "model") == reference
    assert (tmp_path / "out" / "checkpoint-4").is_dir()


def test_surogates_distributed_block_is_a_ray_job(demo, tmp_path):
    # num_nodes x gpus_per_node workers of a GPU each: this cluster has none, which is said before any work
    r = sft(write_config(tmp_path, demo, "distributed:\n  ray_address: local\n  num_nodes: 2\n  gpus_per_node: 1\n"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        "error: a Ray job of 2 workers x GPU 1 needs 2 GPU, and the Ray cluster has 0"), r.stderr
    assert not (tmp_path / "out").exists()
    # one node is a local run, as in Surogate
    r = sft(write_config(tmp_path, demo, "distributed:\n  num_nodes: 1\n", name="one.yaml", out="one"))
    assert r.returncode == 0, r.stderr
    assert "Ray job" not in r.stderr


def test_a_killed_rank_is_named_and_the_job_resumes_to_the_same_model(demo, tmp_path, reference):
    config = write_config(tmp_path, demo, "use_ray: true\nray_num_workers: 2\nresources_per_worker: {CPU: 1}\n")
    r = sft(config, env={"SOLTRAIN_TEST_RANK_FAULT": "1:3:kill"})
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank 1's worker died") and "resume_from_checkpoint: true" in last, r.stderr
    assert (tmp_path / "out" / "checkpoint-2").is_dir() and not (tmp_path / "out" / "model").exists()
    r = sft(config, "resume_from_checkpoint=true")
    assert r.returncode == 0, r.stderr
    assert weights(tmp_path / "out" / "model") == reference


def test_bad_input_is_one_line_naming_the_rank(demo, tmp_path):
    config = write_config(tmp_path, demo, "use_ray: true\nray_num_workers: 2\nresources_per_worker: {CPU: 1}\n")
    config.write_text(config.read_text().replace("type: chat_template", "type: alpaca"))
    r = sft(config)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: rank 0: ") and 'missing field "instruction"' in \
        r.stderr.strip().splitlines()[-1], r.stderr


def test_from_python(demo, tmp_path, reference):
    import soltrain
    import soltrain.ray

    config = soltrain.SFTConfig.from_yaml(write_config(tmp_path, demo, ""))
    try:
        result = soltrain.ray.train(config, num_workers=2, resources_per_worker={"CPU": 1}, address="local")
    finally:
        ray.shutdown()
    assert result["global_step"] == 4 and not result["interrupted"]
    assert weights(tmp_path / "out" / "model") == reference
    # a Ray config run in one process without a launcher is refused, naming the ways to start it
    with pytest.raises(soltrain.SoltrainError, match="this config is a Ray job"):
        soltrain.Trainer(config.replace(use_ray=True, output_dir=str(tmp_path / "again"))).train()


def peer_example(tmp_path, demo, name, data):
    text = (ROOT / "tests" / "fixtures" / "peer_configs" / name).read_text()
    for k, v in {"MODEL_DIR": demo / "model", "DATA_FILE": data, "OUTPUT_DIR": tmp_path / "out"}.items():
        assert k in text
        text = text.replace(k, str(v))
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_axolotls_ray_example(demo, tmp_path):
    """Axolotl's examples/llama-3/lora-1b-ray.yml (use_ray, ray_num_workers 4 of a GPU each, DeepSpeed ZeRO-3,
    adamw_8bit) on this CPU cluster: on one CPU worker and on two (8-bit AdamW under ZeRO-3) it trains."""
    import json

    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps({"instruction": "Reverse the word.", "input": f"w{i}", "output": f"{i}w"}) + "\n"
                            for i in range(40)))
    config = peer_example(tmp_path, demo, "axolotl-llama-3-lora-1b-ray.yml", data)
    short = ["max_steps=1", "sequence_len=256", "device=cpu"]
    r = sft(config, *short, "ray_num_workers=1", "resources_per_worker={CPU: 1}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").exists()
    r = sft(config, *short, "ray_num_workers=2", "resources_per_worker={CPU: 1}", f"output_dir={tmp_path / 'two'}")
    assert r.returncode == 0, r.stderr
    assert "data parallel over 2 ranks" in r.stderr and "ZeRO stage 3" in r.stderr, r.stderr
    assert (tmp_path / "two" / "adapter" / "adapter_model.safetensors").exists()


def test_surogates_ray_example(demo, tmp_path):
    """Surogate's examples/sft/qwen3/qwen3-lora-bf16-ray.yaml: 2 nodes x 4 GPUs at ray_address auto (here: the
    local cluster this machine starts, which has no GPU)."""
    import json

    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"{i + 1}"}) + "\n"
                            for i in range(24)))
    config = peer_example(tmp_path, demo, "surogate-qwen3-lora-bf16-ray.yaml", data)
    # as written: ray_address auto names a running cluster, and none runs here (Surogate's ray.init fails the same way)
    r = sft(config, "device=cpu", env={"RAY_ADDRESS": ""})
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: Ray cluster at 'auto': "), r.stderr
    r = sft(config, "distributed={ray_address: local, num_nodes: 2, gpus_per_node: 4}", "device=cpu")
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()  # (Ray's own start-up lines quiet: the refusal alone)
    assert line.startswith("error: a Ray job of 8 workers x GPU 1 needs 8 GPU, and the Ray cluster has 0"), r.stderr
    assert not (tmp_path / "out").exists()
