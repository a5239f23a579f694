"""``python -m pomdp_ffm.bench loop env=<task> [overrides] --steps N``: the real training loop, timed by part.

It trains (updates, acting, env steps, evaluations) for about N env steps with the task's own config, except a
one-episode random pool and an evaluation at every iteration of the eval clock so that evaluation gets measured.
It prints env steps/s, each part's share of the time, the cost per unit (per env step, per update, per
evaluation step) and the projection for the task's full budget:

    pool env steps x env cost  +  env steps x (env + act)  +  updates x (sample + update)
        +  evaluations x num_eval_tasks x max episode length x eval cost per step

The evaluation term is an upper bound: it counts every evaluation episode at the time limit, as a trained
agent's are (an untrained one falls early, so the measured episodes are shorter).

A run stopped by a signal (e.g. a ``timeout`` around the benchmark) reports the part it ran, marked, and the
command exits 75 (docs/benchmarks.md, "The training loop").
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import Counter
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ..config import RunConfig, env_step_budget, register_configs
from ..envs import get_task
from ..jobs.grid import CONF_DIR
from ..run.signals import SweepSignals, stop_sweep, sweep_stopped
from ..train import train_job
from ..trainer import Trainer

PARTS = ("pool env steps", "env steps", "acting", "updates", "evaluation (upper bound)")  # projected, in this order


def compose_run(overrides: list[str], device, threads: int | None, typed: bool = True) -> RunConfig:
    """The config a benchmark trains with (Hydra's unless ``typed``): the overrides on ``device``, no progress bar."""
    register_configs()
    overrides = [*overrides, f"device={device}", "progress=false"] + ([f"num_threads={threads}"] if threads else [])
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_object(cfg) if typed else cfg


def full_budget(cfg: RunConfig, max_len: int) -> dict[str, float]:
    """Env steps, updates and evaluations of a whole run (full-length episodes)."""
    t = cfg.train
    pool = max_len * t.num_init_rollouts_pool
    iter_len, steps = env_step_budget(t, max_len)
    ratio = t.num_updates_per_iter
    updates = (
        int(pool * ratio) + t.num_iters * math.ceil(iter_len * ratio)
        if isinstance(ratio, float)
        else t.num_iters * ratio
    )
    evals = (steps // iter_len) // cfg.eval.log_interval
    return {
        "pool_steps": pool,
        "steps": steps - pool,
        "updates": updates,
        "evals": evals,
        "eval_steps": evals * cfg.env.num_eval_tasks * max_len,
    }


def _project(budget: dict, costs: tuple) -> dict[str, float]:
    """Seconds of each of PARTS for ``budget`` at ``costs`` (seconds per unit, in PARTS's order)."""
    units = (budget["pool_steps"], budget["steps"], budget["steps"], budget["updates"], budget["eval_steps"])
    return {k: n * c for k, n, c in zip(PARTS, units, costs)}


def run(overrides: list[str], steps: int, device, threads: int | None) -> dict:
    """The timed run and its projection. A stop signal that comes before the run's own handler is in is remembered,
    as ``python -m pomdp_ffm.train`` does: the run stops at its first chance, not killed."""
    made: list[Trainer] = []

    class Recording(Trainer):
        """Timed by part (``timers``), and what happens once per run (building, the final checkpoint) apart."""

        def __init__(self, *a, **kw):
            t0 = time.perf_counter()
            super().__init__(*a, timers=Counter(), **kw)
            self.timers["once"] += time.perf_counter() - t0
            made.append(self)

        def save_checkpoint(self, path=None):  # (checkpoint.interval past the run: the final one, or a stop's)
            t0 = time.perf_counter()
            try:
                return super().save_checkpoint(path)
            finally:
                self.timers["once"] += time.perf_counter() - t0

    before = sweep_stopped()
    try:
        with SweepSignals(forward=False), tempfile.TemporaryDirectory() as d:
            full_cfg = compose_run(overrides, device, threads)
            max_len = get_task(full_cfg.env.env_name).max_episode_steps
            iter_len, _ = env_step_budget(full_cfg.train, max_len)
            iters = max(1, math.ceil(steps / iter_len) - 1)
            short = [
                *overrides,
                "train.num_init_rollouts_pool=1",
                f"train.num_iters={iters}",
                "eval.log_interval=1",
                "checkpoint.interval=1000000",
                "eval.save_interval=-1",
            ]
            cfg = compose_run(short, device, threads, typed=False)
            # The entry point's own path; with seeds=[...] the seed axis (its directories: .../seed-<k>).
            t0 = time.perf_counter()
            out = train_job(cfg, Path(d) / "bench" / f"seed-{cfg.seed}", Recording)
            wall = time.perf_counter() - t0
    finally:
        stop_sweep(before)  # a stop that came now stopped this run, not whatever this process runs next
    tm = Counter()
    for trainer in made:  # the seeds' parts add up (a joint round charges each seed its share)
        tm += trainer.timers
    # A stop signal (e.g. the `timeout` around a benchmark on a lent machine) ends the run at its next chance:
    # what it timed until then is still a measurement, so it is reported, marked as stopped.
    if out.stopped and not tm["n_updates"]:
        raise StoppedEarly("the benchmark's run was stopped by a signal before it timed an update")
    n_steps = tm["n_steps"]
    n_updates = tm["n_updates"]
    n_eval_steps = tm["n_eval_steps"]
    n_pool = tm["n_pool_steps"]
    per = {
        "env": tm["env"] / max(n_steps, 1),
        "act": tm["act"] / max(n_steps, 1),
        "update": (tm["update"] + tm["sample"]) / max(n_updates, 1),
        "eval": tm["eval"] / max(n_eval_steps, 1),
        "eval_act": tm["eval_act"] / max(n_eval_steps, 1),
    }
    parts = {
        "env": tm["env"],
        "act": tm["act"],
        "sample": tm["sample"],
        "update": tm["update"],
        "eval": tm["eval"],
        "pool": tm["pool_act"] + tm["pool_env"],
        "once": tm["once"],
    }
    # once: building the trainers and the final checkpoint, not projected; other: what no part timed (the
    # entry point's checks and files, logging, the loop's own bookkeeping), not projected either
    parts["other"] = max(wall - sum(parts.values()), 0.0)
    budget = {k: v * len(made) for k, v in full_budget(full_cfg, max_len).items()}
    costs = (parts["pool"] / max(n_pool, 1), per["env"], per["act"], per["update"], per["eval"])
    # A run stopped early may not have reached a part (e.g. its first evaluation): its projection is no estimate.
    unmeasured = [k for k, n in zip(PARTS, (n_pool, n_steps, n_steps, n_updates, n_eval_steps)) if not n]
    return {
        "wall": wall,
        "steps": n_steps + n_pool,
        "n_steps": n_steps,
        "n_updates": n_updates,
        "n_joint_updates": tm["n_joint_updates"],
        "n_evals": tm["n_evals"],
        "n_eval_steps": n_eval_steps,
        "parts": parts,
        "per": per,
        "budget": budget,
        "projected": _project(budget, costs),
        "task": cfg.env.env_name,
        "model": f"{cfg.policy.algo_name}+{cfg.policy.seq_model}",
        "overrides": list(overrides),
        "seeds": len(made),
        "stopped": out.stopped,
        "unmeasured": unmeasured,
    }


class StoppedEarly(RuntimeError):
    """A stop signal came before the run had timed an update: there is nothing to report."""


def _print_projected(projected: dict[str, float], missing: set[str]) -> None:
    total = sum(projected.values())
    for k, v in projected.items():
        note = "  not reached by this run: left out" if k in missing else ""
        print(f"    {k:<26} {v / 3600:7.2f} h  {100 * v / max(total, 1e-9):5.1f} %{note}")
    print(f"    {'total':<26} {total / 3600:7.2f} h{' (without the parts not reached)' if missing else ''}")


def report(r: dict) -> None:
    runs = f" x {r['seeds']} seeds in one process" if r["seeds"] > 1 else ""
    print(
        f"\n{r['task']} {r['model']}{runs}: {r['steps']} env steps, {r['n_updates']} updates, {r['n_evals']} "
        f"evaluations ({r['n_eval_steps']} eval steps) in {r['wall']:.1f} s -> "
        f"{r['steps'] / r['wall']:.1f} env steps/s"
    )
    if r["stopped"]:
        print(
            "  STOPPED by a signal before the planned steps: the numbers are those of the part it ran (a short "
            "part's costs include its warm-up)"
        )
    if r["seeds"] > 1:
        # Outside joint rounds: a seed left alone once the others have finished, or seeds without a joint runner.
        none = "; the seeds take turns on a CPU or without train.cuda_graph" if not r["n_joint_updates"] else ""
        print(
            f"  updates in joint rounds: {r['n_joint_updates']} of {r['n_updates']} "
            f"({100 * r['n_joint_updates'] / max(r['n_updates'], 1):.1f} %{none})"
        )
    print("\n  share of the time")
    for k, v in r["parts"].items():
        print(f"    {k:<8} {v:8.2f} s  {100 * v / r['wall']:5.1f} %")
    per = r["per"]
    missing = set(r["unmeasured"])

    def cost(part: str, seconds: float, note: str = "") -> str:
        return "    not reached by this run" if part in missing else f"{1e3 * seconds:8.3f} ms{note}"

    print("\n  cost per unit")
    print(f"    env step      {cost('env steps', per['env'])}")
    print(f"    acting step   {cost('acting', per['act'])}")
    print(f"    update        {cost('updates', per['update'], '  (sampling included)')}")
    eval_note = f"  (acting and env, episodes together where configured; acting {1e3 * per['eval_act']:.3f} ms)"
    print(f"    eval step     {cost('evaluation (upper bound)', per['eval'], eval_note)}")
    b = r["budget"]
    of_runs = f" of the {r['seeds']} runs" if r["seeds"] > 1 else ""
    print(
        f"\n  projected for the full budget{of_runs}: {b['pool_steps'] + b['steps']:,} env steps, {b['updates']:,} "
        f"updates, {b['evals']} evaluations"
    )
    _print_projected(r["projected"], missing)


def report_projection(r: dict, task: str, env_step_ms: float, device: str, threads: int | None) -> dict:
    """The full budget of ``task`` at this run's acting, update and evaluation-acting costs, with ``env_step_ms``
    as the task's env step cost (measured where its env can run, e.g. a BLT task on a CPU, when this run's
    machine cannot build it)."""
    # The task's own config: a stand-in env (``env.env_name=...``) of the measured run is dropped.
    overrides = [o for o in r["overrides"] if not o.startswith(("env=", "env.env_name="))] + [f"env={task}"]
    cfg = compose_run(overrides, device, threads)
    budget = {k: v * r["seeds"] for k, v in full_budget(cfg, get_task(task).max_episode_steps).items()}
    env_s = env_step_ms / 1e3
    per = r["per"]
    # Parts this run never reached have no cost of their own here (the env step's is given): left out, marked.
    missing = set(r["unmeasured"]) - set(PARTS[:2])
    costs = (env_s, env_s, per["act"], per["update"], per["eval_act"] + env_s)
    projected = {k: (0.0 if k in missing else v) for k, v in _project(budget, costs).items()}
    of_runs = f"{r['seeds']} runs of " if r["seeds"] > 1 else ""
    print(
        f"\n  projected for {of_runs}{task} ({budget['pool_steps'] + budget['steps']:,} env steps, "
        f"{budget['updates']:,} updates, {budget['evals']} evaluations of "
        f"{budget['eval_steps'] // max(budget['evals'], 1):,} steps at most) with its env step at "
        f"{env_step_ms:.3f} ms and this run's other costs"
    )
    _print_projected(projected, missing)
    return projected
