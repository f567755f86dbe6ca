"""report_to: wandb (offline mode) and mlflow (a file store) receive the same numbers as metrics.jsonl, through
their own Python libraries (issue 29): wandb under HF Trainer's names (train/loss, eval/loss, ..., step = the
optimizer step), mlflow under metrics.jsonl's. A tracker whose package is missing stops the run before training,
in one line."""
import glob
import json
import os
import struct
import subprocess

import pytest

from conftest import BIN, read_jsonl


def wandb_history(path):
    """The history rows of an offline run's .wandb file: LevelDB-log records of wandb's Record protobufs (the
    format of wandb/sdk/internal/datastore.py: a 7-byte header, then 32 KiB blocks of 7-byte-headed chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    records, frag, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            frag = chunk
        elif kind == 3:
            frag += chunk
        elif kind == 4:
            records.append(frag + chunk)
    rows = []
    for r in records:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(r)
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_wandb_offline_and_mlflow_get_metrics_jsonl(demo, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    out = tmp_path / "out"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {demo / 'model'}\ndatasets: [{{path: {demo / 'train.jsonl'}, type: conversation}}]\n"
                   f"validation_datasets: [{{path: {demo / 'validation.jsonl'}, type: conversation}}]\n"
                   f"output_dir: {out}\nsequence_len: 64\nmax_steps: 4\neval_steps: 2\nlearning_rate: 1e-3\n"
                   f"report_to: [wandb, mlflow]\nwandb_project: soltrain-test\nwandb_mode: offline\n"
                   f"mlflow_tracking_uri: file://{tmp_path / 'mlruns'}\nmlflow_experiment_name: exp\n"
                   "run_name: tiny\n")
    # (mlflow 3 keeps its file store behind MLFLOW_ALLOW_FILE_STORE; the issue asks for that store)
    env = dict(os.environ, WANDB_SILENT="true", WANDB_DIR=str(tmp_path), HOME=str(tmp_path),
               MLFLOW_ALLOW_FILE_STORE="true")
    r = subprocess.run([str(BIN), "sft", str(cfg)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    train = {x["step"]: x for x in rows if "loss" in x}
    evals = {x["step"]: x["eval_loss"] for x in rows if "eval_loss" in x}
    assert len(train) == 4 and len(evals) >= 2

    files = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files
    logged = {}
    for h in wandb_history(files[0]):
        logged.setdefault(h["_step"], {}).update(h)
    for step, x in train.items():
        for k in ("loss", "learning_rate", "grad_norm", "epoch"):
            assert logged[step]["train/" + k] == pytest.approx(x[k], rel=1e-12), (step, k)
        assert logged[step]["train/global_step"] == step
    for step, loss in evals.items():
        assert logged[step]["eval/loss"] == pytest.approx(loss, rel=1e-12)

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient(tracking_uri=f"file://{tmp_path / 'mlruns'}")
    run = client.search_runs([client.get_experiment_by_name("exp").experiment_id])[0]
    assert run.info.run_name == "tiny"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert history == pytest.approx({s: x["loss"] for s, x in train.items()}, rel=1e-12)
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval_loss")} == \
        pytest.approx(evals, rel=1e-12)
    assert run.data.params["learning_rate"] == "0.001"


def test_a_missing_tracker_stops_the_run_before_training(demo, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {demo / 'model'}\ndatasets: [{{path: {demo / 'train.jsonl'}, type: conversation}}]\n"
                   f"output_dir: {tmp_path / 'out'}\nsequence_len: 64\nmax_steps: 2\nreport_to: wandb\n")
    r = subprocess.run([str(BIN), "sft", str(cfg)], capture_output=True, text=True,
                       env=dict(os.environ, SOLTRAIN_PYTHON="/bin/false"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: report_to: wandb: its Python package is not installed for /bin/false (pip install wandb); or drop "
        "it from report_to (metrics.jsonl and TensorBoard hold every metric)")
    assert not (tmp_path / "out" / "model").exists()


def swanlab_scalars(path):
    """The scalars of an offline SwanLab run's .swanlab file, read with SwanLab's own reader: {step: {key: value}}."""
    from swanlab.sdk.internal.core_python.store import DataStoreReader
    from swanlab.sdk.internal.core_python.sync import Record

    reader = DataStoreReader()
    reader.open(path)
    out = {}
    for data in reader:
        rec = Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "scalar":
            out.setdefault(rec.scalar.step, {})[rec.scalar.key] = rec.scalar.value.number
    reader.close()
    return out


def test_axolotl_swanlab_plugin_gets_metrics_jsonl(demo, tmp_path):
    # Axolotl's SwanLab plugin as its examples set it (offline here: no account), HF's names as SwanLab's
    # transformers callback logs them; its run in output_dir/swanlog
    pytest.importorskip("swanlab")
    out = tmp_path / "out"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base_model: {demo / 'model'}\ndatasets: [{{path: {demo / 'train.jsonl'}, type: conversation}}]\n"
                   f"test_datasets: [{{path: {demo / 'validation.jsonl'}, type: conversation}}]\n"
                   f"output_dir: {out}\nsequence_len: 64\nmax_steps: 4\neval_steps: 2\nlearning_rate: 1e-3\n"
                   "plugins:\n  - axolotl.integrations.swanlab.SwanLabPlugin\nuse_swanlab: true\n"
                   "swanlab_project: soltrain-test\nswanlab_experiment_name: tiny\nswanlab_description: a test\n"
                   "swanlab_mode: offline\nswanlab_log_completions: false\n")
    r = subprocess.run([str(BIN), "sft", str(cfg)], capture_output=True, text=True,
                       env=dict(os.environ, HOME=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "report_to: swanlab receives every metrics.jsonl row" in r.stderr
    rows = read_jsonl(out / "metrics.jsonl")
    train = {x["step"]: x for x in rows if "loss" in x}
    evals = {x["step"]: x["eval_loss"] for x in rows if "eval_loss" in x}
    assert len(train) == 4 and len(evals) >= 2
    files = glob.glob(str(out / "swanlog" / "run-*" / "run-*.swanlab"))
    assert len(files) == 1, files
    logged = swanlab_scalars(files[0])
    for step, x in train.items():
        for k in ("loss", "learning_rate", "grad_norm"):
            assert logged[step]["train/" + k] == pytest.approx(x[k], rel=1e-12), (step, k)
        assert logged[step]["train/global_step"] == step
    for step, loss in evals.items():
        assert logged[step]["eval/loss"] == pytest.approx(loss, rel=1e-12)


def test_swanlab_settings_are_checked_as_axolotl_checks_them(demo, tmp_path):
    base = (f"base_model: {demo / 'model'}\ndatasets: [{{path: {demo / 'train.jsonl'}, type: conversation}}]\n"
            f"output_dir: {tmp_path / 'out'}\nmax_steps: 1\nplugins: [axolotl.integrations.swanlab.SwanLabPlugin]\n")
    for extra, want in [("", "plugins: SwanLab is on (its plugin, use_swanlab) but swanlab_project is not set"),
                        ("swanlab_project: p\nswanlab_mode: online\n",
                         "swanlab_mode: \"online\" is not valid: expected cloud, local, offline or disabled")]:
        (tmp_path / "c.yaml").write_text(base + extra)
        r = subprocess.run([str(BIN), "sft", str(tmp_path / "c.yaml")], capture_output=True, text=True)
        assert r.returncode == 2 and want in r.stderr.strip().splitlines()[-1], r.stderr
    (tmp_path / "c.yaml").write_text(base + "use_swanlab: false\n")  # off: no project needed, nothing started
    r = subprocess.run([str(BIN), "sft", str(tmp_path / "c.yaml")], capture_output=True, text=True)
    assert r.returncode == 0 and "report_to" not in r.stderr, r.stderr
    assert not (tmp_path / "out" / "swanlog").exists()


def test_axolotl_otel_metrics_serve_prometheus(demo, tmp_path):
    # Axolotl's use_otel_metrics: its gauges (axolotl_train_loss, ...) on http://host:port/metrics while training
    pytest.importorskip("opentelemetry.exporter.prometheus")
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base_model: {demo / 'model'}\ndatasets: [{{path: {demo / 'train.jsonl'}, type: conversation}}]\n"
                   f"output_dir: {out}\nsequence_len: 64\nmax_steps: 400\nlearning_rate: 1e-3\nuse_wandb: false\n"
                   f"use_otel_metrics: true\notel_metrics_host: 127.0.0.1\notel_metrics_port: {port}\n")
    p = subprocess.Popen([str(BIN), "sft", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scraped = ""
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        try:
            scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            if "axolotl_train_loss" in scraped and "axolotl_global_steps_total" in scraped:
                break
        except OSError:
            pass
        time.sleep(0.2)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert "report_to: OpenTelemetry (Prometheus) receives every metrics.jsonl row" in err
    values = {}
    for line in scraped.splitlines():
        if line.startswith("axolotl_") and " " in line:
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    losses = [x["loss"] for x in read_jsonl(out / "metrics.jsonl") if "loss" in x]
    assert any(v == pytest.approx(values["axolotl_train_loss"], rel=1e-6) for v in losses), (values, losses[:5])
    assert values["axolotl_global_steps_total"] >= 1 and "axolotl_learning_rate" in values
