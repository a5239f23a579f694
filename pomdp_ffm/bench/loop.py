"""``python -m pomdp_ffm.bench loop env=<task> [overrides] --steps N``: the real training loop, timed by part.

It trains (updates, acting, env steps, evaluations) for about N env steps with the task's own config, except a
one-episode random pool and an evaluation at every iteration of the eval clock so that evaluation gets measured.
It prints env steps/s, each part's share of the time, the cost per unit (per env step, per update, per
evaluation step) and the projection for the task's full budget:

    pool env steps x env cost  +  env steps x (env + act)  +  updates x (sample + update)
        +  evaluations x num_eval_tasks x max episode length x eval cost per step

The evaluation term is an upper bound: it counts every evaluation episode at the time limit, as a trained
agent's are (an untrained one falls early, so the measured episodes are shorter).
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import signal
import tempfile
import time
from collections import Counter

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from ..config import RunConfig, register_configs
from ..envs import get_task
from ..grid import CONF_DIR
from ..seeds import eager_joint_rounds
from ..signals import STOP_SIGNALS
from ..train import run as train_run
from ..trainer import Trainer, env_step_budget


def compose_cfg(overrides: list[str], device: str, threads: int | None) -> DictConfig:
    """The composed config a benchmark trains with: the overrides, on ``device``, without the progress bar."""
    register_configs()
    overrides = [*overrides, f"device={device}", "progress=false"] + ([f"num_threads={threads}"] if threads else [])
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def compose_run(overrides: list[str], device: str, threads: int | None) -> tuple[RunConfig, dict]:
    cfg = compose_cfg(overrides, device, threads)
    return OmegaConf.to_object(cfg), OmegaConf.to_container(cfg, resolve=True)


def full_budget(cfg: RunConfig, max_len: int) -> dict[str, float]:
    """Env steps, updates and evaluations of a whole run (full-length episodes)."""
    t = cfg.train
    pool = max_len * t.num_init_rollouts_pool
    iter_len, steps = env_step_budget(t, max_len)
    ratio = t.num_updates_per_iter
    updates = (int(pool * ratio) + t.num_iters * math.ceil(iter_len * ratio) if isinstance(ratio, float)
               else t.num_iters * ratio)
    evals = (steps // iter_len) // cfg.eval.log_interval
    return {"pool_steps": pool, "steps": steps - pool, "updates": updates, "evals": evals,
            "eval_steps": evals * cfg.env.num_eval_tasks * max_len}


def run(overrides: list[str], steps: int, device: str, threads: int | None, joint_eager: bool = False) -> dict:
    """``joint_eager``: a seed axis's joint rounds run on any device (seeds.eager_joint_rounds)."""
    full_cfg, _ = compose_run(overrides, device, threads)
    max_len = get_task(full_cfg.env.env_name).max_episode_steps
    iter_len, _ = env_step_budget(full_cfg.train, max_len)
    iters = max(1, math.ceil(steps / iter_len) - 1)
    short = [*overrides, "train.num_init_rollouts_pool=1", f"train.num_iters={iters}", "eval.log_interval=1",
             "checkpoint.interval=1000000", "eval.save_interval=-1"]
    composed = compose_cfg(short, device, threads)
    cfg = OmegaConf.to_object(composed)
    made: list[Trainer] = []

    class Recording(Trainer):
        """Times what happens once per run (building, the final checkpoint) apart from the loop's parts."""

        def __init__(self, *a, **kw):
            t0 = time.perf_counter()
            super().__init__(*a, **kw)
            self.timers["once"] += time.perf_counter() - t0
            made.append(self)

        def finished(self):
            t0 = time.perf_counter()
            try:
                return super().finished()
            finally:
                self.timers["once"] += time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as d:
        # The entry point's own path; with seeds=[...] the seed axis (its directories: .../seed-<k>).
        t0 = time.perf_counter()
        with eager_joint_rounds() if joint_eager else contextlib.nullcontext():
            out = train_run(composed, Path(d) / "bench" / f"seed-{cfg.seed}", Recording)
        wall = time.perf_counter() - t0
    tm, pool_timers = Counter(), Counter()
    for trainer in made:  # the seeds' parts add up (a joint round charges each seed its share)
        tm.update(trainer.timers)
        pool_timers.update(trainer.pool_timers)
    # A stop signal (e.g. the `timeout` around a benchmark on a lent machine) ends the run at its next chance:
    # what it timed until then is still a measurement, so it is reported, marked as stopped.
    if out.get("stopped") and not tm.get("n_updates", 0):
        raise RuntimeError("the benchmark's run was stopped by a signal before it timed an update")
    n_steps, n_updates, n_eval_steps = tm.get("n_steps", 0), tm.get("n_updates", 0), tm.get("n_eval_steps", 0)
    per = {
        "env": tm.get("env", 0.0) / max(n_steps, 1),
        "act": tm.get("act", 0.0) / max(n_steps, 1),
        "update": (tm.get("update", 0.0) + tm.get("sample", 0.0)) / max(n_updates, 1),
        "eval": tm.get("eval", 0.0) / max(n_eval_steps, 1),
    }
    parts = {"env": tm.get("env", 0.0), "act": tm.get("act", 0.0), "sample": tm.get("sample", 0.0),
             "update": tm.get("update", 0.0), "eval": tm.get("eval", 0.0),
             "pool": sum(pool_timers.values()), "once": tm.get("once", 0.0)}
    # once: building the trainers and the final checkpoint, not projected; other: what no part timed (the
    # entry point's checks and files, logging, the loop's own bookkeeping), not projected either
    parts["other"] = max(wall - sum(parts.values()), 0.0)
    budget = {k: v * len(made) for k, v in full_budget(full_cfg, max_len).items()}
    pool_per_step = parts["pool"] / max(tm.get("n_pool_steps", 1), 1)
    projected = {
        "pool env steps": budget["pool_steps"] * pool_per_step,
        "env steps": budget["steps"] * per["env"],
        "acting": budget["steps"] * per["act"],
        "updates": budget["updates"] * per["update"],
        "evaluation (upper bound)": budget["eval_steps"] * per["eval"],
    }
    per["eval_act"] = tm.get("eval_act", 0.0) / max(n_eval_steps, 1)
    # A run stopped early may not have reached a part (e.g. its first evaluation): its projection is no estimate.
    counts = {"pool env steps": tm.get("n_pool_steps", 0), "env steps": n_steps, "acting": n_steps,
              "updates": n_updates, "evaluation (upper bound)": n_eval_steps}
    unmeasured = [k for k, n in counts.items() if not n]
    return {"wall": wall, "steps": n_steps + tm.get("n_pool_steps", 0), "n_steps": n_steps, "n_updates": n_updates,
            "n_joint_updates": tm.get("n_joint_updates", 0),
            "n_evals": tm.get("n_evals", 0), "n_eval_steps": n_eval_steps, "parts": parts, "per": per,
            "budget": budget, "projected": projected, "task": cfg.env.env_name,
            "model": f"{cfg.policy.algo_name}+{cfg.policy.seq_model}", "overrides": list(overrides),
            "seeds": len(made), "stopped": bool(out.get("stopped")), "unmeasured": unmeasured}


def _job(results, index: int, args: tuple) -> None:
    """One of ``run_jobs``'s processes: its result, with when it ran (wall clock), or its error, in ``results``."""
    start = time.time()
    try:
        r = run(*args)
    except BaseException as e:  # noqa: BLE001 - reported by the parent, which waits for every job's answer
        first = str(e).strip().splitlines()[:1]  # Hydra's lists every choice, one a line
        results.put((index, {"error": f"{type(e).__name__}: {first[0] if first else ''}"}))
        return
    results.put((index, {**r, "start": start, "end": time.time()}))


def run_jobs(n: int, overrides: list[str], steps: int, device: str, threads: int | None,
             joint_eager: bool = False) -> list[dict]:
    """``run`` n times at once, each in a process of its own: n jobs of a grid sharing this machine (and its GPU,
    whose updates then run while another job's envs step). A stop signal to this process is passed on to the
    jobs, each of which reports what it ran."""
    ctx = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable; spawn is what launchers do
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=_job, args=(results, k, (overrides, steps, device, threads, joint_eager)))
             for k in range(n)]

    def forward(signum, frame):
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signum)

    old = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    got: dict[int, dict] = {}
    try:
        for proc in procs:
            proc.start()
        while len(got) < n:
            while not results.empty():
                k, r = results.get()
                got[k] = r
            if len(got) < n and not any(proc.is_alive() for proc in procs) and results.empty():
                lost = [f"job {k + 1} (exit code {procs[k].exitcode})" for k in range(n) if k not in got]
                raise RuntimeError(f"{', '.join(lost)} ended without a result")
            time.sleep(0.05)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for proc in procs:
            proc.join()
    errors = [f"job {k + 1}: {got[k]['error']}" for k in range(n) if "error" in got[k]]
    if errors:
        raise RuntimeError("; ".join(errors))
    return [got[k] for k in range(n)]


def report_jobs(results: list[dict]) -> None:
    n = len(results)
    for k, r in enumerate(results):
        print(f"\n== job {k + 1} of {n}", end="")
        report(r)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    steps = sum(r["steps"] for r in results)
    totals = [sum(r["projected"].values()) / 3600 for r in results]
    print(f"\n{n} jobs at once: {steps} env steps in {span:.1f} s from the first start to the last end -> "
          f"{steps / span:.1f} env steps/s in all")
    print(f"  projected: each job's full budget takes {min(totals):.2f}-{max(totals):.2f} h with {n} running at "
          f"once: {sum(totals) / n / n:.2f} h of this machine per job")


def report(r: dict) -> None:
    runs = f" x {r['seeds']} seeds in one process" if r["seeds"] > 1 else ""
    print(f"\n{r['task']} {r['model']}{runs}: {r['steps']} env steps, {r['n_updates']} updates, {r['n_evals']} "
          f"evaluations ({r['n_eval_steps']} eval steps) in {r['wall']:.1f} s -> "
          f"{r['steps'] / r['wall']:.1f} env steps/s")
    if r["stopped"]:
        print("  STOPPED by a signal before the planned steps: the numbers are those of the part it ran")
    if r["seeds"] > 1:
        # Outside joint rounds: a seed left alone once the others have finished, or seeds without a joint runner.
        none = ("; the seeds take turns on a CPU or without train.cuda_graph (--joint-eager counts the rounds)"
                if not r["n_joint_updates"] else "")
        print(f"  updates in joint rounds: {r['n_joint_updates']} of {r['n_updates']} "
              f"({100 * r['n_joint_updates'] / max(r['n_updates'], 1):.1f} %{none})")
    print("\n  share of the time")
    for k, v in r["parts"].items():
        print(f"    {k:<8} {v:8.2f} s  {100 * v / r['wall']:5.1f} %")
    per = r["per"]
    print("\n  cost per unit")
    print(f"    env step      {1e3 * per['env']:8.3f} ms")
    print(f"    acting step   {1e3 * per['act']:8.3f} ms")
    print(f"    update        {1e3 * per['update']:8.3f} ms  (sampling included)")
    print(f"    eval step     {1e3 * per['eval']:8.3f} ms  (acting and env, episodes together where configured; "
          f"acting {1e3 * per['eval_act']:.3f} ms)")
    b = r["budget"]
    of_runs = f" of the {r['seeds']} runs" if r["seeds"] > 1 else ""
    print(f"\n  projected for the full budget{of_runs}: {b['pool_steps'] + b['steps']:,} env steps, {b['updates']:,} "
          f"updates, {b['evals']} evaluations")
    total = sum(r["projected"].values())
    for k, v in r["projected"].items():
        missing = "  not reached by this run: left out" if k in r["unmeasured"] else ""
        print(f"    {k:<26} {v / 3600:7.2f} h  {100 * v / max(total, 1e-9):5.1f} %{missing}")
    print(f"    {'total':<26} {total / 3600:7.2f} h{' (without the parts not reached)' if r['unmeasured'] else ''}")


def report_projection(r: dict, task: str, env_step_ms: float, device: str, threads: int | None) -> dict:
    """The full budget of ``task`` at this run's acting, update and evaluation-acting costs, with ``env_step_ms``
    as the task's env step cost (measured where its env can run, e.g. a BLT task on a CPU, when this run's
    machine cannot build it)."""
    # The task's own config: a stand-in env (``env.env_name=...``) of the measured run is dropped.
    overrides = [o for o in r["overrides"] if not o.startswith(("env=", "env.env_name="))] + [f"env={task}"]
    cfg, _ = compose_run(overrides, device, threads)
    budget = {k: v * r["seeds"] for k, v in full_budget(cfg, get_task(task).max_episode_steps).items()}
    env_s, per = env_step_ms / 1e3, r["per"]
    projected = {
        "pool env steps": budget["pool_steps"] * env_s,
        "env steps": budget["steps"] * env_s,
        "acting": budget["steps"] * per["act"],
        "updates": budget["updates"] * per["update"],
        "evaluation (upper bound)": budget["eval_steps"] * (per["eval_act"] + env_s),
    }
    total = sum(projected.values())
    of_runs = f"{r['seeds']} runs of " if r["seeds"] > 1 else ""
    print(f"\n  projected for {of_runs}{task} ({budget['pool_steps'] + budget['steps']:,} env steps, {budget['updates']:,} "
          f"updates, {budget['evals']} evaluations of {budget['eval_steps'] // max(budget['evals'], 1):,} steps at "
          f"most) with its env step at {env_step_ms:.3f} ms and this run's other costs")
    for k, v in projected.items():
        print(f"    {k:<26} {v / 3600:7.2f} h  {100 * v / max(total, 1e-9):5.1f} %")
    print(f"    {'total':<26} {total / 3600:7.2f} h")
    return projected
