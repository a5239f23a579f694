"""Builders for small synthetic run trees with known answers (our layout and the reference's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hang import HANG_S

SAC_HEADER = [
    "rl_loss/qf1_loss",
    "rl_loss/qf2_loss",
    "rl_loss/policy_loss",
    "rl_loss/policy_entropy",
    "rl_loss/alpha",
    "rl_loss/q_grad_norm",
    "rl_loss/q_rnn_grad_norm",
    "rl_loss/pi_grad_norm",
    "rl_loss/pi_rnn_grad_norm",
    "z/env_steps",
    "z/rollouts",
    "z/rl_steps",
    "metrics/total_steps_eval",
    "metrics/return_eval_total",
    "metrics/success_rate_eval",
    "z/time_cost",
    "z/fps",
]


def progress_text(steps, returns, header=SAC_HEADER) -> str:
    """progress.csv text with a train row before every eval row, as both loggers write it."""
    lines = [",".join(header)]
    n_loss = sum(h.startswith("rl_loss/") for h in header)
    n_eval = len(header) - n_loss
    for k, (s, r) in enumerate(zip(steps, returns)):
        lines.append(",".join(["0.5"] * n_loss + [""] * n_eval))
        ev = [str(int(s)), str(k + 10), str(int(s)), "1000", repr(float(r)), "0.0", str(10 * k), "100.0"]
        lines.append(",".join([""] * n_loss + ev[:n_eval]))
    return "\n".join(lines) + "\n"


def write_our_run(
    root: Path,
    task: str,
    algo: str,
    model: str,
    seed: int,
    steps,
    returns,
    done: bool = True,
    config: bool = True,
    stamp: str = "2026-01-01_00-00-00",
) -> Path:
    run = root / task / f"{algo}_{model}" / f"seed-{seed}" / stamp
    run.mkdir(parents=True)
    (run / "progress.csv").write_text(progress_text(steps, returns))
    if config:
        (run / "config.yaml").write_text(
            f"seed: {seed}\nenv:\n  env_name: {task}\npolicy:\n  algo_name: {algo}\n  seq_model: {model}\n"
        )
    if done:
        (run / "DONE").write_text("")
    return run


def write_reference_run(
    root: Path,
    family: str,
    obs: str,
    algo: str,
    model: str,
    seed: int | None,
    steps,
    returns,
    stamp: str,
    agent: str | None = None,
    config: bool = True,
) -> Path:
    """A run in the reference's layout; ``agent`` is its algorithm folder (default ``<algo>_<model>``, e.g.
    ``oracle_sac_gru``); without ``config`` it has no variant_*.yml, as the FFM fork's copied logs."""
    run = (
        root
        / "logs"
        / "pomdp"
        / family
        / obs
        / (agent or f"{algo}_{model}")
        / "gamma-0.99"
        / "len-64"
        / "bs-64"
        / "freq-1.0"
        / "oar"
        / stamp
    )
    run.mkdir(parents=True)
    (run / "progress.csv").write_text(progress_text(steps, returns))
    if not config:
        return run
    seed_line = f"seed: {seed}\n" if seed is not None else ""
    (run / "variant_1234.yml").write_text(
        f"{seed_line}cuda: -1\nenv:\n  env_type: pomdp\n  env_name: {family}-{obs}-v0\n"
        f"policy:\n  seq_model: {model}\n  algo_name: {algo}\n  buffer_size: 1e6\n"
    )
    return run


def steps_grid(n: int = 20, start: int = 12_000, interval: int = 4_000) -> np.ndarray:
    return start + interval * np.arange(n)


PUBLISHED_HEADER = [
    "env_steps",
    "return",
    "q_rnn_grad_norm",
    "pi_rnn_grad_norm",
    "trial",
    "method",
    "RL",
    "Encoder",
    "Len",
    "Inputs",
    "Arch",
]


def published_variant(rl, encoder="gru", length=64, inputs="oar", arch="separate", **trials):
    """One group of a final.csv: the reference's own agent with these tags, ``trials`` {trial name: returns}."""
    return {"method": "ours", "tags": [rl, encoder, str(length), inputs, arch], "trials": trials}


def published_method(name, tags, **trials):
    """A compared method's group (merge_csv.py files it under its name, with the tags its constants give it)."""
    return {"method": name, "tags": list(tags), "trials": trials}


def write_published(root: Path, family: str, obs: str, *groups, start=12_000, interval=4_000) -> Path:
    """``root/<family>/<obs>/final.csv`` as the reference's merge_csv.py writes it: per run, its returns on the grid
    from ``start`` every ``interval`` env steps, rounded to 2 decimals; diagnostics only for its own agent."""
    lines = [",".join(PUBLISHED_HEADER)]
    for g in groups:
        for trial, returns in g["trials"].items():
            for k, r in enumerate(returns):
                diag = ["0.5", "0.25"] if g["method"] == "ours" else ["", ""]
                lines.append(
                    ",".join(
                        [str(start + interval * k), f"{round(float(r), 2)}", *diag, trial, g["method"], *g["tags"]]
                    )
                )
    path = root / family / obs / "final.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


class Payload:
    """Unpickling this creates the file ``target`` (``pathlib.Path.touch``): proof that code ran on load."""

    def __init__(self, target):
        self.target = Path(target)

    def __reduce__(self):
        return (Path.touch, (self.target,))


def write_payload_checkpoint(path: Path, target: Path, how: str = "torch") -> Path:
    """A checkpoint-looking file whose full unpickling runs code: ``torch.save`` (zip format) or a bare pickle."""
    import pickle

    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"agent": {"actor.rnn.memory.alpha": torch.ones(2)}, "extra": Payload(target)}
    if how == "torch":
        torch.save(state, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(state, f)
    return path


def run_cli(*args, cwd):
    """``python -m analysis ARGS`` in a subprocess, running this checkout's package."""
    import os
    import subprocess
    import sys

    import analysis

    env = dict(os.environ)
    root = str(Path(analysis.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["MPLBACKEND"] = "Agg"
    return subprocess.run(
        [sys.executable, "-m", "analysis", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
