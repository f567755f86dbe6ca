"""The bridge from a soltrain run to experiment trackers (report_to: wandb / mlflow / swanlab, Axolotl's wandb_*,
mlflow_* and swanlab_* keys). The engine starts it as `python3 -c <this file>` (compiled into the binary) and writes JSON
lines to its stdin: first {"init": ...} (which trackers, their settings, the run's config), then every row it
writes to metrics.jsonl. Rows go to wandb under HF Trainer's names (train/loss, train/learning_rate, eval/loss,
..., step = the optimizer step), to SwanLab under the same and to mlflow under metrics.jsonl's own (loss, learning_rate, eval_loss, ...),
as HF's WandbCallback and MLflowCallback log them. "ready" on stdout once the trackers have started; the run
ends when stdin closes."""
import json
import sys


def numbers(row):
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def hf_names(values, step):
    """A row under HF Trainer's names (train/loss, eval/loss, ..., train/global_step), as wandb's and SwanLab's
    transformers callbacks log it."""
    logged = {("eval/" + k[5:] if k.startswith("eval_") else "train/" + k): v for k, v in values.items()}
    logged["train/global_step"] = step
    return logged


def main():
    # stdout carries "ready" alone: the trackers' own prints (SwanLab's banner) go to stderr with their messages
    ready_out, sys.stdout = sys.stdout, sys.stderr
    init = json.loads(sys.stdin.readline())["init"]
    config = init.get("config", {})
    wandb_run = None
    mlflow = None
    if "wandb" in init:
        import wandb

        w = init["wandb"]
        wandb_run = wandb.init(project=w.get("project") or "huggingface", entity=w.get("entity") or None,
                               name=w.get("name") or init.get("run_name") or None, mode=w.get("mode") or None,
                               id=w.get("run_id") or None, dir=init["output_dir"], config=config,
                               resume="allow" if w.get("run_id") else None)
    if "mlflow" in init:
        import mlflow

        m = init["mlflow"]
        if m.get("tracking_uri"):
            mlflow.set_tracking_uri(m["tracking_uri"])
        mlflow.set_experiment(m.get("experiment_name") or "soltrain")
        mlflow.start_run(run_name=m.get("run_name") or init.get("run_name") or None)
        mlflow.log_params({k: str(v)[:500] for k, v in config.items()})
    swanlab = None
    if "swanlab" in init:  # as Axolotl's SwanLab plugin calls swanlab.init (its swanlab_* keys by name)
        import swanlab

        s = init["swanlab"]
        kwargs = {k: s[k] for k in ("project", "experiment_name", "description", "workspace", "mode", "api_key",
                                    "web_host", "api_host") if s.get(k)}
        kwargs.setdefault("experiment_name", init.get("run_name") or None)
        swanlab.init(logdir=str(init["output_dir"]) + "/swanlog", config=config, **kwargs)
    otel = None
    if "otel" in init:  # Axolotl's OpenTelemetry callback: its gauges on a Prometheus endpoint
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import start_http_server

        metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
        meter = metrics.get_meter("axolotl.training")
        otel = {k: meter.create_gauge(name=f"axolotl_{name}", description=what, unit="1")
                for k, name, what in [("loss", "train_loss", "Current training loss"),
                                      ("eval_loss", "eval_loss", "Current evaluation loss"),
                                      ("learning_rate", "learning_rate", "Current learning rate"),
                                      ("epoch", "epoch", "Current training epoch"),
                                      ("grad_norm", "gradient_norm", "Gradient norm")]}
        otel["steps"] = meter.create_counter(name="axolotl_global_steps", description="Total training steps completed",
                                             unit="1")
        start_http_server(int(init["otel"]["port"]), addr=init["otel"]["host"])
    print("ready", file=ready_out, flush=True)
    for line in sys.stdin:
        row = json.loads(line)
        step = int(row.pop("step"))
        values = numbers(row)
        if wandb_run is not None:
            wandb_run.log(hf_names(values, step), step=step)
        if mlflow is not None:
            mlflow.log_metrics(values, step=step)
        if otel is not None:
            for k, v in values.items():
                if k in otel:
                    otel[k].set(v)
            if "loss" in values:  # a training step's row (Axolotl counts on_step_end)
                otel["steps"].add(1)
        if swanlab is not None:
            swanlab.log(hf_names(values, step), step=step)
    if swanlab is not None:
        swanlab.finish()
    if wandb_run is not None:
        wandb_run.finish()
    if mlflow is not None:
        mlflow.end_run()


if __name__ == "__main__":  # (python3 -c runs it as __main__; importing it does nothing)
    main()
