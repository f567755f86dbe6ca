"""A soltrain job on a Ray cluster: the same ranks `gpus: N`, torchrun or mpirun start, as Ray actors.

    import soltrain, soltrain.ray
    config = soltrain.SFTConfig.from_yaml("run.yaml")
    soltrain.ray.train(config, num_workers=8, resources_per_worker={"GPU": 1})

A config's own Ray keys (Axolotl's use_ray / ray_num_workers / resources_per_worker, Surogate's distributed block)
are the defaults, and `soltrain sft run.yaml` with them hands the job to this module (python -m soltrain.ray). Each
worker is an actor in one placement group (a bundle of `resources_per_worker` each, packed onto as few nodes as
fit); rank 0's node and a free port there are the rendezvous, and every actor runs the job in its own process with
torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK 0 as Ray gives each actor its own GPU).
GPUs talk over NCCL, CPU ranks over soltrain's TCP communicator. The config's files (model, datasets, output_dir)
must be at the same paths on every node, as with the other launchers. When a worker fails or dies the others are
stopped and the error names its rank; the checkpoints in output_dir resume the job (resume_from_checkpoint: true).
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import socket
import sys
from typing import Any

import yaml

from . import config as _config
from ._native import ConfigError, SoltrainError, native

# How long the placement group may wait for the cluster to offer every worker's resources.
PLACEMENT_TIMEOUT_S = 120


def settings(config: _config.TrainConfig) -> dict[str, Any]:
    """The config's Ray settings as soltrain's reader takes them: enabled, address, num_workers, resources."""
    text, where, overrides = config._reader_input()
    return native.ray_settings(native.parse_config(text, where, overrides, config.mode))


def train(config: _config.TrainConfig | str | os.PathLike, num_workers: int | None = None,
          resources_per_worker: dict[str, float] | None = None, address: str | None = None,
          mode: str = "sft") -> dict[str, Any]:
    """Runs the job on `num_workers` Ray actors (default: the config's ray_num_workers / distributed block, else 1)
    with `resources_per_worker` each (default: the config's, else a GPU each, a CPU each with device: cpu), on the
    cluster at `address` (default: the config's, else the one this process has joined or a local one). `config`: a
    soltrain config, or a YAML file's path (read as `mode`'s config: sft or pt). Returns rank 0's result (steps,
    interrupted, ...)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not isinstance(config, _config.TrainConfig):
        config = _config_class(mode).from_yaml(config)
    given = settings(config)
    n = int(num_workers if num_workers is not None else given["num_workers"])
    if n < 1:
        raise ConfigError(f"num_workers {n}: expected 1 or more")
    resources = dict(resources_per_worker if resources_per_worker is not None else given["resources"])
    address = address if address is not None else (given["address"] or None)
    if not ray.is_initialized():
        # (the workers import this package from where this process has it: a checkout's python/ folder too)
        here = str(pathlib.Path(__file__).resolve().parent.parent)
        paths = [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
        try:
            ray.init(address=None if address in (None, "", "local") else address, include_dashboard=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
                     logging_level=logging.ERROR)  # (its start-up lines would precede a refusal's one line)
        except ConnectionError as e:  # ("auto" and an address name a running cluster)
            lines = str(e).strip().splitlines()
            raise SoltrainError(f"Ray cluster at {address!r}: {lines[0] if lines else 'not reachable'} (start one "
                                f"with `ray start --head`, or give ray_address: local for one on this machine)") \
                from None
    total = ray.cluster_resources()
    for name, amount in resources.items():
        if amount * n > total.get(name, 0) + 1e-9:
            raise ConfigError(f"a Ray job of {n} workers x {name} {amount:g} needs {amount * n:g} {name}, and the Ray "
                              f"cluster has {total.get(name, 0):g}: fewer workers (ray_num_workers) or other "
                              f"resources_per_worker")
    pg = placement_group([dict(resources) for _ in range(n)], strategy="PACK")
    try:
        ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise SoltrainError(f"the Ray cluster did not place {n} workers of {resources} within "
                                f"{PLACEMENT_TIMEOUT_S} s")
        shown = ", ".join(f"{k}: {v:g}" for k, v in resources.items())
        print(f"Ray job: {n} worker{'' if n == 1 else 's'} of {{{shown}}} on "
              f"{'the Ray cluster at ' + address if address not in (None, '', 'local') else 'a local Ray cluster'}",
              file=sys.stderr, flush=True)
        options = dict(num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0),
                       resources={k: v for k, v in resources.items() if k not in ("CPU", "GPU")})
        worker = ray.remote(_Worker)
        actors = [worker.options(**options, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote() for i in range(n)]
        try:
            master_addr, master_port = ray.get(actors[0].rendezvous.remote())
        except ray.exceptions.RayActorError as e:
            for a in actors:
                ray.kill(a)
            lines = str(e).strip().splitlines()
            raise WorkerLost(f"rank 0's worker could not start: {lines[-1] if lines else type(e).__name__}") from None
        cwd = os.getcwd()
        runs = {actors[r].run.remote(config, {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
                                               "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}, cwd): r
                for r in range(n)}
        results: dict[int, Any] = {}
        pending = list(runs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rank = runs[done[0]]
            try:
                results[rank] = ray.get(done[0])
            except Exception as e:  # a worker's error, or its process gone: the others are stopped
                raise _first_failure(ray, actors, runs, {rank: e}, pending, config) from None
        return results[0]
    finally:
        remove_placement_group(pg)


def _config_class(mode: str) -> type:
    """The config class of a Ray job's mode (sft or pt)."""
    classes = {"sft": _config.SFTConfig, "pt": _config.PTConfig}
    if mode not in classes:
        raise ConfigError(f"mode {mode!r}: a Ray job runs sft or pt")
    return classes[mode]


class _Worker:
    """One rank: the job in this actor's process, as `soltrain sft` runs it under torchrun."""

    def rendezvous(self) -> tuple[str, int]:
        import ray

        with socket.socket() as s:  # a port free now on this node (rank 0 binds it a moment later)
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def run(self, config: _config.TrainConfig, env: dict[str, str], cwd: str) -> dict[str, Any]:
        from .trainer import Trainer

        os.environ.update(env)
        if pathlib.Path(cwd).is_dir():  # (relative paths given as overrides are the driver's)
            os.chdir(cwd)
        out = Trainer(config).train()
        return {"global_step": out.global_step, "training_loss": out.training_loss, "interrupted": out.interrupted,
                "metrics": out.metrics}


class WorkerLost(RuntimeError):
    """A rank's process ended without an error of its own (killed, crashed, its node gone)."""


# What a rank says when another rank's failure or death stopped it ("rank 1 failed (its error is above)", "rank 1
# stopped (its connection closed; its own error, if any, is above)"): not the cause.
_ECHO = "is above"


def _first_failure(ray: Any, actors: list, runs: dict, failed: dict, pending: list, config: Any) -> Exception:
    """The job's error after `failed` ranks failed: the others' outcomes awaited briefly (a rank that fails first
    often finishes after one its failure stopped), then every actor stopped; the lowest rank's own error wins."""
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=10) if pending else ([], [])
    for ref in done:
        try:
            ray.get(ref)
        except Exception as e:
            failed[runs[ref]] = e
    for a in actors:
        ray.kill(a)
    errors = [_rank_error(rank, e, config) for rank, e in sorted(failed.items())]
    # a rank's own error first, then a lost worker, then what the others said of them
    return sorted(errors, key=lambda err: 1 if isinstance(err, WorkerLost) else 2 if _ECHO in str(err) else 0)[0]


def _rank_error(rank: int, e: Exception, config: _config.TrainConfig) -> Exception:
    import ray

    if isinstance(e, ray.exceptions.RayActorError):
        out = config._keys.get("output_dir", "output_dir")
        return WorkerLost(f"rank {rank}'s worker died ({type(e).__name__}); the newest checkpoint in {out} "
                             f"resumes the job (resume_from_checkpoint: true)")
    # (soltrain's errors come back as Ray's task error: the worker's last line is the one the CLI would print)
    cause = getattr(e, "cause", None)
    text = str(cause if cause is not None else e).strip().splitlines()
    line = text[-1] if text else type(e).__name__
    for prefix in ("soltrain._soltrain.ConfigError: ", "soltrain._soltrain.DataError: ",
                   "soltrain._soltrain.SoltrainError: "):
        if line.startswith(prefix):
            line = line[len(prefix):]
    config_error = isinstance(cause, ConfigError) or "ConfigError" in (text[-1] if text else "")
    kind = ConfigError if config_error else SoltrainError
    return kind(f"rank {rank}: {line}")


def _stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """python -m soltrain.ray sft|pt CONFIG [--set key=value ...]: what `soltrain sft` runs for a Ray config."""
    ap = argparse.ArgumentParser(prog="python -m soltrain.ray", description=main.__doc__)
    ap.add_argument("mode", choices=["sft", "pt"])
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    try:
        config = _config_class(args.mode).from_yaml(args.config)
        changes = {}
        for item in args.set:
            key, eq, value = item.partition("=")
            if not eq:
                raise ConfigError(f"--set {item}: expected key=value")
            changes[key] = yaml.safe_load(value)
        if changes:
            config = config.replace(**changes)
        result = train(config, mode=args.mode)
    except (ConfigError, SoltrainError, WorkerLost) as e:  # (bad input: exit 2, as the CLI)
        _stop_ray()  # (the workers' log lines stream in late: the error is the last line)
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, WorkerLost) else 2
    _stop_ray()
    return 130 if result.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
