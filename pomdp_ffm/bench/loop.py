"""``python -m pomdp_ffm.bench loop env=<task> [overrides] --steps N``: the real training loop, timed by part.

It trains (updates, acting, env steps, evaluations) for about N env steps with the task's own config, except a
one-episode random pool and an evaluation at every iteration of the eval clock so that evaluation gets measured.
It prints env steps/s, each part's share of the time, the cost per unit (per env step, per update, per
evaluation step) and the projection for the task's full budget:

    pool env steps x env cost  +  env steps x (env + act)  +  updates x (sample + update)
        +  evaluations x num_eval_tasks x max episode length x eval cost per step

The evaluation term is an upper bound: it counts every evaluation episode at the time limit, as a trained
agent's are (an untrained one falls early, so the measured episodes are shorter).

``--jobs N`` runs N such runs at once, each in a process of its own (jobs of a grid sharing one machine and its
GPU), and adds up their env steps over the time from the first start to the last end. A run stopped by a signal
(e.g. a ``timeout`` around the benchmark) reports the part it ran, marked, and the command exits 75.
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from multiprocessing import resource_tracker

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from ..config import RunConfig, register_configs
from ..envs import get_task
from ..grid import CONF_DIR
from ..signals import STOP_SIGNALS, SweepSignals, stop_sweep, sweep_stopped
from ..start import Refused
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


def run(overrides: list[str], steps: int, device: str, threads: int | None) -> dict:
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
        """Timed by part (``timers``), and what happens once per run (building, the final checkpoint) apart."""

        def __init__(self, *a, **kw):
            t0 = time.perf_counter()
            super().__init__(*a, timers=Counter(), **kw)
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
        out = train_run(composed, Path(d) / "bench" / f"seed-{cfg.seed}", Recording)
        wall = time.perf_counter() - t0
    tm = Counter()
    for trainer in made:  # the seeds' parts add up (a joint round charges each seed its share)
        tm.update(trainer.timers)
    # A stop signal (e.g. the `timeout` around a benchmark on a lent machine) ends the run at its next chance:
    # what it timed until then is still a measurement, so it is reported, marked as stopped.
    if out.get("stopped") and not tm.get("n_updates", 0):
        raise StoppedEarly("the benchmark's run was stopped by a signal before it timed an update")
    n_steps, n_updates, n_eval_steps = tm.get("n_steps", 0), tm.get("n_updates", 0), tm.get("n_eval_steps", 0)
    per = {
        "env": tm.get("env", 0.0) / max(n_steps, 1),
        "act": tm.get("act", 0.0) / max(n_steps, 1),
        "update": (tm.get("update", 0.0) + tm.get("sample", 0.0)) / max(n_updates, 1),
        "eval": tm.get("eval", 0.0) / max(n_eval_steps, 1),
    }
    parts = {"env": tm.get("env", 0.0), "act": tm.get("act", 0.0), "sample": tm.get("sample", 0.0),
             "update": tm.get("update", 0.0), "eval": tm.get("eval", 0.0),
             "pool": tm.get("pool_act", 0.0) + tm.get("pool_env", 0.0), "once": tm.get("once", 0.0)}
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


class StoppedEarly(RuntimeError):
    """A stop signal came before the run had timed an update: there is nothing to report."""


# The jobs' processes: at most one a core is what a machine can run at once without the jobs timing each other's
# waits; the bound only stops a typo from starting thousands.
MAX_JOBS = 64
# What stops the jobs: a stop signal, or a Ctrl-C (passed on as SIGTERM, so each job reports what it ran).
_FORWARDED = (*STOP_SIGNALS, signal.SIGINT)


@contextlib.contextmanager
def _stops_remembered():
    """Until the run's own handler is in (it goes in once the trainers are built), a stop signal is remembered, as
    ``python -m pomdp_ffm.train`` does for one run (``SweepSignals(forward=False)``), and the run stops at its first
    chance instead of being killed."""
    before = sweep_stopped()
    try:
        with SweepSignals(forward=False):
            yield
    finally:
        stop_sweep(before)  # a stop that came now stopped this run, not whatever this process runs next


def _job(results, index: int, args: tuple) -> None:
    """One of ``run_jobs``'s processes: its result, with when it ran (wall clock) and its pid, or what stopped
    it, in ``results``. It starts with the stop signals blocked (``run_jobs``), unblocked once its handler is in."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the parent too, which stops the jobs
    start, answer = time.time(), {"pid": os.getpid()}
    with _stops_remembered():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        try:
            answer.update(run(*args), start=start, end=time.time())
        except StoppedEarly as e:
            answer["stopped_early"] = str(e)
        except Refused as e:
            answer["refused"] = str(e)
        except BaseException as e:  # noqa: BLE001 - reported by the parent, which waits for every job's answer
            answer["error"] = f"{type(e).__name__}: {e}"
            answer["traceback"] = traceback.format_exc()
    results.put((index, answer))


def run_single(overrides: list[str], steps: int, device: str, threads: int | None) -> dict:
    """``run`` in this process, a stop signal during its start remembered (``_stops_remembered``)."""
    with _stops_remembered():
        return run(overrides, steps, device, threads)


def run_jobs(n: int, overrides: list[str], steps: int, device: str, threads: int | None) -> list[dict]:
    """``run`` n times at once, each in a process of its own: n jobs of a grid sharing this machine (and its GPU,
    whose updates then run while another job's envs step). Each job's answer is its result (``run``'s) or says
    why it has none: ``stopped_early``, ``refused``, ``error`` or ``lost`` (the process ended without an answer,
    e.g. killed; the other jobs are then stopped, and report what they ran).

    A stop signal (or SIGINT) to this process is passed on to the jobs as the signal that stops a run, so each
    reports what it ran; a second one kills the jobs still running (a job stuck where no stop reaches it), which
    are then lost. The stop signals are blocked while the jobs' processes start, which inherit the block, so that
    one sent to the whole process group (as `timeout` does) before a job's handler is in still stops it."""
    ctx = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable; spawn is what launchers do
    # multiprocessing's resource tracker (started with the first lock) ignores SIGINT and SIGTERM but not SIGUSR1,
    # the other stop signal: started with it blocked, a SIGUSR1 to the process group cannot kill it.
    usr1 = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, usr1)
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=_job, args=(results, k, (overrides, steps, device, threads)))
             for k in range(n)]
    received: list[int] = []  # the stop signals this process got
    killed: set[int] = set()

    def forward(signum: int) -> None:
        for k, proc in enumerate(procs):
            if proc.pid is not None and proc.exitcode is None:
                try:
                    if len(received) > 1:
                        killed.add(k)
                        proc.kill()
                    else:
                        os.kill(proc.pid, signum)
                except ProcessLookupError:  # it ended meanwhile
                    pass

    def on_signal(signum, frame) -> None:
        received.append(signal.SIGTERM if signum == signal.SIGINT else signum)
        forward(received[0])

    old = {s: signal.signal(s, on_signal) for s in _FORWARDED}
    got: dict[int, dict] = {}

    def drain() -> None:
        while not results.empty():
            k, answer = results.get()
            got[k] = answer

    try:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
        try:
            for proc in procs:
                proc.start()
        finally:  # a stop that came meanwhile is delivered here, to every job
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if received:  # one that came before the jobs existed
            forward(received[0])
        while len(got) < n:
            drain()
            for k, proc in enumerate(procs):
                if k not in got and proc.exitcode is not None:
                    drain()  # its answer may have come just before it ended
                    if k not in got:
                        why = ("killed after a second stop signal" if k in killed
                               else f"its process ended without an answer (exit code {proc.exitcode})")
                        got[k] = {"lost": why}
                        forward(signal.SIGTERM)  # the others report what they ran, rather than run on for nothing
            time.sleep(0.05)
    except BaseException:
        for proc in procs:
            if proc.exitcode is None and proc.pid is not None:
                proc.kill()
        raise
    finally:
        for proc in procs:  # with this process's handlers still in: a stop meanwhile is passed on, not fatal
            if proc.pid is not None:
                proc.join()
        for s, handler in old.items():
            signal.signal(s, handler)
    return [got[k] for k in range(n)]


def report_jobs(answers: list[dict]) -> None:
    n = len(answers)
    for k, a in enumerate(answers):
        print(f"\n== job {k + 1} of {n}", end="")
        if "steps" in a:
            report(a)
        else:
            why = next(a[key] for key in ("stopped_early", "refused", "error", "lost") if key in a)
            print(f": no result: {why}")
            if "traceback" in a:
                print(a["traceback"], file=sys.stderr)
    done = [a for a in answers if "steps" in a]
    if not done:
        return
    span = max(a["end"] for a in done) - min(a["start"] for a in done)
    steps = sum(a["steps"] for a in done)
    totals = [sum(a["projected"].values()) / 3600 for a in done]
    partial = any(a["unmeasured"] for a in done)
    some = f"{len(done)} of {n}" if len(done) < n else f"{n}"
    print(f"\n{some} jobs at once: {steps} env steps in {span:.1f} s from the first start to the last end -> "
          f"{steps / span:.1f} env steps/s in all")
    print(f"  projected: each job's full budget takes {min(totals):.2f}-{max(totals):.2f} h with {n} running at "
          f"once: {sum(totals) / len(done) / n:.2f} h of this machine per job"
          f"{' (without the parts a job did not reach)' if partial else ''}")


def report(r: dict) -> None:
    runs = f" x {r['seeds']} seeds in one process" if r["seeds"] > 1 else ""
    print(f"\n{r['task']} {r['model']}{runs}: {r['steps']} env steps, {r['n_updates']} updates, {r['n_evals']} "
          f"evaluations ({r['n_eval_steps']} eval steps) in {r['wall']:.1f} s -> "
          f"{r['steps'] / r['wall']:.1f} env steps/s")
    if r["stopped"]:
        print("  STOPPED by a signal before the planned steps: the numbers are those of the part it ran (a short part's "
              "costs include its warm-up)")
    if r["seeds"] > 1:
        # Outside joint rounds: a seed left alone once the others have finished, or seeds without a joint runner.
        none = ("; the seeds take turns on a CPU or without train.cuda_graph"
                if not r["n_joint_updates"] else "")
        print(f"  updates in joint rounds: {r['n_joint_updates']} of {r['n_updates']} "
              f"({100 * r['n_joint_updates'] / max(r['n_updates'], 1):.1f} %{none})")
    print("\n  share of the time")
    for k, v in r["parts"].items():
        print(f"    {k:<8} {v:8.2f} s  {100 * v / r['wall']:5.1f} %")
    per, missing = r["per"], set(r["unmeasured"])

    def cost(part: str, seconds: float, note: str = "") -> str:
        return "    not reached by this run" if part in missing else f"{1e3 * seconds:8.3f} ms{note}"
    print("\n  cost per unit")
    print(f"    env step      {cost('env steps', per['env'])}")
    print(f"    acting step   {cost('acting', per['act'])}")
    print(f"    update        {cost('updates', per['update'], '  (sampling included)')}")
    eval_note = (f"  (acting and env, episodes together where configured; acting {1e3 * per['eval_act']:.3f} ms)")
    print(f"    eval step     {cost('evaluation (upper bound)', per['eval'], eval_note)}")
    b = r["budget"]
    of_runs = f" of the {r['seeds']} runs" if r["seeds"] > 1 else ""
    print(f"\n  projected for the full budget{of_runs}: {b['pool_steps'] + b['steps']:,} env steps, {b['updates']:,} "
          f"updates, {b['evals']} evaluations")
    total = sum(r["projected"].values())
    for k, v in r["projected"].items():
        note = "  not reached by this run: left out" if k in missing else ""
        print(f"    {k:<26} {v / 3600:7.2f} h  {100 * v / max(total, 1e-9):5.1f} %{note}")
    print(f"    {'total':<26} {total / 3600:7.2f} h{' (without the parts not reached)' if missing else ''}")


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
    # Parts this run never reached have no cost of their own here (the env step's is given): left out, marked.
    missing = {"acting", "updates", "evaluation (upper bound)"} & set(r["unmeasured"])
    projected = {k: (0.0 if k in missing else v) for k, v in projected.items()}
    total = sum(projected.values())
    of_runs = f"{r['seeds']} runs of " if r["seeds"] > 1 else ""
    print(f"\n  projected for {of_runs}{task} ({budget['pool_steps'] + budget['steps']:,} env steps, {budget['updates']:,} "
          f"updates, {budget['evals']} evaluations of {budget['eval_steps'] // max(budget['evals'], 1):,} steps at "
          f"most) with its env step at {env_step_ms:.3f} ms and this run's other costs")
    for k, v in projected.items():
        note = "  not reached by this run: left out" if k in missing else ""
        print(f"    {k:<26} {v / 3600:7.2f} h  {100 * v / max(total, 1e-9):5.1f} %{note}")
    print(f"    {'total':<26} {total / 3600:7.2f} h{' (without the parts not reached)' if missing else ''}")
    return projected
